# CTest's Install.FindPackageConsumer (cmake -P): install this build into a scratch prefix, build
# tests/install/consumer against it with find_package(FlashMSA), and run the program.
# Inputs: BUILD_DIR, SOURCE_DIR, GENERATOR, CXX_COMPILER.
set(work "${BUILD_DIR}/install-consumer")
file(REMOVE_RECURSE "${work}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${what} failed (${status}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()

step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${work}/prefix")
foreach(file include/flashmsa/flashmsa.hpp lib/cmake/FlashMSA/FlashMSAConfig.cmake)
  if(NOT EXISTS "${work}/prefix/${file}")
    message(FATAL_ERROR "the installed package lacks ${file}")
  endif()
endforeach()
step("configure the consumer" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer"
     -B "${work}/build" -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
     "-DCMAKE_PREFIX_PATH=${work}/prefix"
     "-DFLASHMSA_EXAMPLE_SOURCE=${SOURCE_DIR}/examples/prefill_then_decode.cpp")
step("build the consumer" ${CMAKE_COMMAND} --build "${work}/build")
step("run the consumer" "${work}/build/consumer")
