// The Python binding: a thin layer over the C++ library. Arrays arrive through DLPack (numpy,
// torch, cupy, ...) without copies and become TensorViews; every check and all the work stay in
// C++. flashmsa::Error becomes ValueError (bad arguments) or RuntimeError (anything else).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flashmsa/flashmsa.hpp"

namespace nb = nanobind;
using namespace flashmsa;

namespace {

// Inputs may be read-only arrays; what an op writes must be writable (output_view).
using AnyArray = nb::ndarray<nb::ro>;
using WritableArray = nb::ndarray<>;

[[noreturn]] void value_error(const std::string& message) {
  throw nb::value_error(message.c_str());
}

// DLPack dtype -> DType. numpy has neither bfloat16 nor fp8: uint16 arrays are read as bf16 bits
// and uint8 arrays as raw bytes (fp8 codes where an op expects fp8).
DType to_dtype(const nb::dlpack::dtype& d, const char* name) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (d.lanes != 1) value_error(std::string(name) + ": vector dtypes are not supported");
  if (code == C::Int && d.bits == 32) return DType::kInt32;
  if (code == C::Int && d.bits == 64) return DType::kInt64;
  if (code == C::UInt && d.bits == 8) return DType::kUint8;
  if (code == C::UInt && d.bits == 16) return DType::kBf16;
  if (code == C::Bfloat && d.bits == 16) return DType::kBf16;
  if (code == C::Float && d.bits == 16) return DType::kFp16;
  if (code == C::Float && d.bits == 32) return DType::kFp32;
  if (code == C::Float8_E4M3FN) return DType::kFp8E4m3;
  if (code == C::Float8_E5M2) return DType::kFp8E5m2;
  value_error(std::string(name) + ": unsupported dtype (code " + std::to_string(d.code) + ", " +
              std::to_string(d.bits) + " bits)");
}

template <class Array>
TensorView view(const Array& a, const char* name) {
  if (a.ndim() > static_cast<size_t>(TensorView::kMaxRank)) {
    value_error(std::string(name) + " must have at most 5 dimensions, got " +
                std::to_string(a.ndim()));
  }
  TensorView t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));  // inputs are only read
  t.dtype = to_dtype(a.dtype(), name);
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value) {
    t.device = Device::kCpu;
  } else if (dev == nb::device::cuda::value) {
    t.device = Device::kCuda;
  } else {
    value_error(std::string(name) + " must be a CPU or CUDA array, got DLPack device type " +
                std::to_string(dev));
  }
  t.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  return t;
}

TensorView optional_view(const std::optional<AnyArray>& a, const char* name) {
  return a ? view(*a, name) : TensorView{};
}

// An array the op writes (None: absent). nanobind alone would refuse a read-only array with a
// generic "incompatible function arguments"; this names the argument and the reason.
TensorView output_view(nb::handle obj, const char* name) {
  if (obj.is_none()) return TensorView{};
  WritableArray a;
  if (nb::try_cast(obj, a, false)) return view(a, name);
  AnyArray ro;
  if (nb::try_cast(obj, ro, false)) {
    value_error(std::string(name) +
                " is written by this call and must be a writable array, got "
                "a read-only one");
  }
  throw nb::type_error((std::string(name) +
                        " must be an array (numpy, torch or any DLPack "
                        "tensor), got " +
                        nb::inst_name(obj).c_str())
                           .c_str());
}

// A cache array (caches are written by the insert ops, so they must be writable): numpy's
// uint16 carries the bits of a 16-bit cache of either kind.
TensorView cache_view(nb::handle obj, const char* name, DType cache) {
  TensorView t = output_view(obj, name);
  if (t.dtype == DType::kBf16 && cache == DType::kFp16) {
    WritableArray a;
    if (nb::try_cast(obj, a, false) &&
        a.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt)) {
      t.dtype = cache;
    }
  }
  return t;
}

// Where an op expects fp8 codes, numpy's uint8 stands in for them.
TensorView as_fp8(TensorView t) {
  if (t.dtype == DType::kUint8) t.dtype = DType::kFp8E4m3;
  return t;
}

// A new host array owned by Python (numpy), for outputs the caller did not pass in.
template <class T>
nb::ndarray<nb::numpy, T> new_array(const std::vector<size_t>& shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* data = new T[n]();
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), owner);
}

std::optional<std::int64_t> optional_int(const std::optional<int>& v) {
  return v ? std::optional<std::int64_t>(*v) : std::nullopt;
}

DType parse_dtype_arg(const std::string& name, const char* arg) {
  const auto d = parse_dtype(name);
  if (!d) value_error(std::string(arg) + ": unknown dtype '" + name + "'");
  return *d;
}

KvLayout parse_layout(const std::string& name) {
  if (name == "packed") return KvLayout::kPacked;
  if (name == "separate") return KvLayout::kSeparate;
  if (name == "stacked") return KvLayout::kStacked;
  if (name == "token_major") return KvLayout::kTokenMajor;
  value_error("layout must be one of packed, separate, stacked, token_major, got '" + name + "'");
}

// The top-k output: the caller's `out` (the argument `name`), or a new int32 [hkv, rows, k] numpy
// array.
std::pair<nb::object, TensorView> topk_output(nb::handle out, std::int64_t hkv, std::int64_t rows,
                                              std::int64_t k, const char* name = "out") {
  if (!out.is_none()) {
    const TensorView t = output_view(out, name);
    check_output_tensor(t, name, DType::kInt32, t.device, {hkv, rows, k});  // named as passed
    return {nb::borrow(out), t};
  }
  auto a = new_array<std::int32_t>(
      {static_cast<size_t>(hkv), static_cast<size_t>(rows), static_cast<size_t>(k)});
  const TensorView t = TensorView::contiguous(a.data(), DType::kInt32, {hkv, rows, k});
  return {nb::cast(a), t};
}

// The decode attention's outputs (sparse_attention_decode, sparse_decode_step): out, or with
// mxfp8_scales its E4M3 codes and their scales in `scale_layout`; lse; the workspace.
AttentionOutputs decode_attention_outputs(nb::handle out, nb::handle lse, nb::handle mxfp8_scales,
                                          const std::string& scale_layout, nb::handle workspace) {
  AttentionOutputs o;
  o.out = output_view(out, "out");
  if (!mxfp8_scales.is_none()) {
    o.out = as_fp8(o.out);
    o.mxfp8_scales = output_view(mxfp8_scales, "mxfp8_scales");
    if (scale_layout == "swizzled") {
      o.mxfp8_scale_layout = fmt::ScaleLayout::kSwizzled128x4;
    } else if (scale_layout != "row_major") {
      value_error("scale_layout must be 'row_major' or 'swizzled', got '" + scale_layout + "'");
    }
  }
  o.lse = output_view(lse, "lse");
  o.workspace = output_view(workspace, "workspace");
  return o;
}

// A Python int that must fit a C++ int: nanobind's own conversion would only say the arguments
// are incompatible.
int int_arg(std::int64_t v, const char* name, std::int64_t lo = INT32_MIN) {
  if (v < lo || v > INT32_MAX) {
    value_error(std::string(name) + " must be in [" + std::to_string(lo) + ", 2^31), got " +
                std::to_string(v));
  }
  return static_cast<int>(v);
}

OpOptions op_options(bool checked, std::int64_t threads, std::int64_t stream = 0) {
  OpOptions o;
  o.checked = checked;
  o.num_threads = int_arg(threads, "threads (0: one per core)", 0);
  if (stream < 0) {
    value_error("stream must be a cudaStream_t as an integer (0: the default stream), got " +
                std::to_string(stream));
  }
  o.stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(stream));  // e.g. torch's
  return o;
}

// Config's fields in declaration order, as Python sees them (repr, keyword construction).
constexpr const char* kConfigFields[] = {"algorithm",
                                         "sparse_num_index_heads",
                                         "sparse_index_dim",
                                         "sparse_block_size",
                                         "sparse_topk_blocks",
                                         "sparse_init_blocks",
                                         "sparse_local_blocks",
                                         "sparse_score_type",
                                         "sparse_disable_index_value",
                                         "indexer_kv_dtype",
                                         "fuse_qkv_index_projection",
                                         "num_attention_heads",
                                         "num_key_value_heads",
                                         "implementation",
                                         "head_dim",
                                         "kv_cache_dtype",
                                         "index_cache_dtype",
                                         "softmax_scale",
                                         "rope_dim",
                                         "rope_theta",
                                         "rms_norm_eps",
                                         "topk_order"};

// Config's int fields (plain or optional) as properties whose setters name the field when a value
// does not fit.
template <auto Field>
auto int_getter() {
  return [](const Config& c) { return c.*Field; };
}
template <auto Field>
auto int_setter(const char* name) {
  return [name](Config& c, std::int64_t v) { c.*Field = int_arg(v, name); };
}
template <auto Field>
auto optional_int_setter(const char* name) {
  return [name](Config& c, std::optional<std::int64_t> v) {
    c.*Field = v ? std::optional<int>(int_arg(*v, name)) : std::nullopt;
  };
}

std::string kv_cache_repr(const KvCacheView& v) {
  std::string out = "KvCache(dtype='" + std::string(to_string(v.dtype)) + "', device='" +
                    std::string(to_string(v.device)) +
                    "', num_pages=" + std::to_string(v.shape.num_pages) +
                    ", num_kv_heads=" + std::to_string(v.shape.num_kv_heads) +
                    ", head_dim=" + std::to_string(v.shape.head_dim) +
                    ", page_size=" + std::to_string(v.shape.page_size);
  if (v.dtype == DType::kFp8E4m3 || v.dtype == DType::kFp8E5m2) {
    out += ", k_scale=" + std::string(nb::repr(nb::float_(v.k_scale)).c_str()) +
           ", v_scale=" + std::string(nb::repr(nb::float_(v.v_scale)).c_str());
  }
  return out + ")";
}

std::string index_cache_repr(const IndexCacheView& v) {
  return "IndexCache(dtype='" + std::string(to_string(v.dtype)) + "', device='" +
         std::string(to_string(v.device)) + "', num_pages=" + std::to_string(v.num_pages) +
         ", index_dim=" + std::to_string(v.index_dim) +
         ", page_size=" + std::to_string(v.page_size) + ")";
}

}  // namespace

NB_MODULE(_flashmsa, m) {
  m.doc() = "FlashMSA: MiniMax-M3 sparse attention (C++ core; see help(flashmsa))";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kInvalidArgument) {
        std::string message = e.message();
        // A float array where bf16 is expected: say how numpy carries bf16.
        if (message.find(" must have dtype bf16") != std::string::npos &&
            message.find(", got fp32") != std::string::npos) {
          message += " (numpy has no bf16: pass its bits as uint16, flashmsa.to_bf16(x))";
        }
        PyErr_SetString(PyExc_ValueError, message.c_str());
      } else {
        PyErr_SetString(PyExc_RuntimeError, e.message().c_str());
      }
    }
  });

  m.def("version", &version, "FlashMSA's version string.");
  m.def("build_info", &build_info, "How this copy was built (CUDA, targets, compiler).");
  m.def(
      "backends",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (Backend b : {Backend::kCpu, Backend::kCudaSm90}) {
          const auto why = backend_unavailable_reason(b);
          out.emplace_back(std::string(to_string(b)), why ? *why : std::string("available"));
        }
        return out;
      },
      "[(backend, 'available' or the reason it is not)] for this machine.");

  nb::enum_<TopkOrder>(m, "TopkOrder")
      .value("ascending", TopkOrder::kAscending)
      .value("score_desc", TopkOrder::kScoreDesc)
      .value("local_last", TopkOrder::kLocalLast);

  nb::class_<Config>(m, "Config",
                     "One MiniMax-M3 sparse attention layer's configuration (MiniMax-M3 "
                     "defaults; TensorRT-LLM MiniMaxM3SparseAttentionConfig field names).")
      .def(
          "__init__",
          [](Config* self, nb::kwargs fields) {
            new (self) Config();
            // Each keyword goes through its property, so it is checked as an assignment is (the
            // instance is constructed, so it may be used as one now).
            nb::handle py = nb::find(self);
            nb::inst_mark_ready(py);
            for (auto [key, value] : fields) {
              const std::string name = nb::cast<std::string>(key);
              bool known = false;
              for (const char* f : kConfigFields) known = known || name == f;
              if (!known) {
                throw nb::type_error(
                    ("Config has no field '" + name + "'; its fields are listed in Config.FIELDS")
                        .c_str());
              }
            }
            // index_cache_dtype first: it sets the indexer fields it implies, which a keyword
            // given beside it then overrides (so repr(config) constructs an equal config).
            if (fields.contains("index_cache_dtype")) {
              nb::setattr(py, "index_cache_dtype", fields["index_cache_dtype"]);
            }
            for (auto [key, value] : fields) {
              if (nb::cast<std::string>(key) != "index_cache_dtype") nb::setattr(py, key, value);
            }
          },
          "Config(**fields): MiniMax-M3's defaults with any field given by keyword, e.g. "
          "Config(kv_cache_dtype='fp8_e4m3', sparse_topk_blocks=32). index_cache_dtype also sets "
          "what it implies (see its property); a keyword beside it for those fields wins.")
      .def_rw("algorithm", &Config::algorithm)
      .def_prop_rw("sparse_num_index_heads", int_getter<&Config::sparse_num_index_heads>(),
                   int_setter<&Config::sparse_num_index_heads>("sparse_num_index_heads"))
      .def_prop_rw("sparse_index_dim", int_getter<&Config::sparse_index_dim>(),
                   int_setter<&Config::sparse_index_dim>("sparse_index_dim"))
      .def_prop_rw("sparse_block_size", int_getter<&Config::sparse_block_size>(),
                   int_setter<&Config::sparse_block_size>("sparse_block_size"))
      .def_prop_rw("sparse_topk_blocks", int_getter<&Config::sparse_topk_blocks>(),
                   int_setter<&Config::sparse_topk_blocks>("sparse_topk_blocks"))
      .def_prop_rw("sparse_init_blocks", int_getter<&Config::sparse_init_blocks>(),
                   int_setter<&Config::sparse_init_blocks>("sparse_init_blocks"))
      .def_prop_rw("sparse_local_blocks", int_getter<&Config::sparse_local_blocks>(),
                   int_setter<&Config::sparse_local_blocks>("sparse_local_blocks"))
      .def_rw("sparse_score_type", &Config::sparse_score_type)
      .def_rw("sparse_disable_index_value", &Config::sparse_disable_index_value)
      .def_rw("indexer_kv_dtype", &Config::indexer_kv_dtype)
      .def_rw("fuse_qkv_index_projection", &Config::fuse_qkv_index_projection)
      .def_prop_rw("num_attention_heads", int_getter<&Config::num_attention_heads>(),
                   optional_int_setter<&Config::num_attention_heads>("num_attention_heads"))
      .def_prop_rw("num_key_value_heads", int_getter<&Config::num_key_value_heads>(),
                   optional_int_setter<&Config::num_key_value_heads>("num_key_value_heads"))
      .def_rw("implementation", &Config::implementation,
              "TensorRT-LLM's field, kept for parity of configs: 'triton' (its default) or "
              "'msa' (which its fp8 indexer and fused projection require). FlashMSA runs its own "
              "kernels either way; the value only takes part in validation.")
      .def_prop_rw("head_dim", int_getter<&Config::head_dim>(),
                   int_setter<&Config::head_dim>("head_dim"))
      .def_prop_rw(
          "kv_cache_dtype",
          [](const Config& c) { return std::string(to_string(c.kv_cache_dtype)); },
          [](Config& c, const std::string& s) {
            c.kv_cache_dtype = parse_dtype_arg(s, "kv_cache_dtype");
          })
      .def_prop_rw(
          "index_cache_dtype",
          [](const Config& c) { return std::string(to_string(c.index_cache_dtype)); },
          [](Config& c, const std::string& s) {
            c.set_index_cache_dtype(parse_dtype_arg(s, "index_cache_dtype"));
          },
          "bf16, fp8_e4m3 or nvfp4. Setting it also sets what it implies, as C++'s "
          "Config::set_index_cache_dtype does: fp8_e4m3 selects the fp8 indexer "
          "(indexer_kv_dtype 'fp8', implementation 'msa'), the others indexer_kv_dtype 'bf16'.")
      .def(
          "set_index_cache_dtype",
          [](Config& c, const std::string& s) {
            c.set_index_cache_dtype(parse_dtype_arg(s, "index_cache_dtype"));
          },
          nb::arg("dtype"), "The same as assigning index_cache_dtype.")
      .def_rw("softmax_scale", &Config::softmax_scale)
      .def_prop_rw("rope_dim", int_getter<&Config::rope_dim>(),
                   int_setter<&Config::rope_dim>("rope_dim"))
      .def_rw("rope_theta", &Config::rope_theta)
      .def_rw("rms_norm_eps", &Config::rms_norm_eps)
      .def_prop_rw(
          "topk_order", [](const Config& c) { return std::string(to_string(c.topk_order)); },
          [](Config& c, nb::handle v) {  // a name or a TopkOrder, as dtypes take names
            TopkOrder order;
            if (nb::try_cast(v, order, false)) {
              c.topk_order = order;
              return;
            }
            std::string name;
            const auto parsed =
                nb::try_cast(v, name, false) ? parse_topk_order(name) : std::nullopt;
            if (!parsed) {
              value_error(
                  "topk_order must be one of ascending, score_desc, local_last (or a "
                  "TopkOrder), got " +
                  std::string(nb::repr(v).c_str()));
            }
            c.topk_order = *parsed;
          })
      .def(
          "for_tensor_parallel",
          [](const Config& c, std::int64_t tp_size, std::int64_t rank) {
            return c.for_tensor_parallel(int_arg(tp_size, "tp_size"), int_arg(rank, "rank"));
          },
          nb::arg("tp_size"), nb::arg("rank"),
          "The layer as rank `rank` of `tp_size` serves it: q heads split evenly, kv and index "
          "heads split when Hkv >= tp_size and replicated otherwise, the index-K head on every "
          "rank. Returns a TensorParallelRank (config, first_q_head, first_kv_head, "
          "first_index_head); ValueError names an impossible split.")
      .def("__repr__",
           [](nb::handle self) {
             std::string out = "Config(";
             for (const char* field : kConfigFields) {
               out += std::string(out.size() > 7 ? ", " : "") + field + "=" +
                      nb::repr(nb::getattr(self, field)).c_str();
             }
             return out + ")";
           })
      .def(nb::self == nb::self)
      .def("__ne__", [](const Config& a, const Config& b) { return !(a == b); })
      .def("__copy__", [](const Config& c) { return c; })
      .def(
          "__deepcopy__", [](const Config& c, nb::handle) { return c; }, nb::arg("memo"))
      // Pickling (engines ship configs to worker processes): the fields in FIELDS order, restored
      // exactly as they were, index_cache_dtype without what it implies.
      .def("__getstate__",
           [](nb::handle self) {
             nb::list state;
             for (const char* field : kConfigFields) state.append(nb::getattr(self, field));
             return nb::tuple(state);
           })
      .def("__setstate__",
           [](Config* self, const nb::tuple& state) {
             if (state.size() != std::size(kConfigFields)) {
               value_error("Config state must hold " + std::to_string(std::size(kConfigFields)) +
                           " fields, got " + std::to_string(state.size()));
             }
             new (self) Config();
             nb::handle py = nb::find(self);
             nb::inst_mark_ready(py);
             for (std::size_t i = 0; i < state.size(); ++i) {
               if (std::string_view(kConfigFields[i]) == "index_cache_dtype") {
                 self->index_cache_dtype =
                     parse_dtype_arg(nb::cast<std::string>(state[i]), "index_cache_dtype");
               } else {
                 nb::setattr(py, kConfigFields[i], state[i]);
               }
             }
           })
      .def(
          "validate",
          [](const Config& c) {
            std::vector<std::string> out;
            for (const auto& p : c.validate()) out.push_back(p.to_string());
            return out;
          },
          "Every problem of this config (empty when valid), each naming field, value and rule.")
      .def(
          "check", [](const Config& c) { c.check(); },
          "Raise ValueError listing every problem, if any.")
      .def(
          "unsupported_reason",
          [](const Config& c, const std::string& backend) {
            const auto b = parse_backend(backend);
            if (!b) value_error("backend must be 'cpu' or 'cuda_sm90', got '" + backend + "'");
            return unsupported_reason(c, *b);
          },
          nb::arg("backend"), "Why `backend` cannot serve this layer, or None.");

  {
    nb::list fields;
    for (const char* f : kConfigFields) fields.append(f);
    m.attr("Config").attr("FIELDS") = nb::tuple(fields);  // keyword construction, repr
  }

  nb::class_<TensorParallelRank>(m, "TensorParallelRank",
                                 "What one tensor-parallel rank serves of a layer.")
      .def_ro("config", &TensorParallelRank::config)
      .def_ro("first_q_head", &TensorParallelRank::first_q_head)
      .def_ro("first_kv_head", &TensorParallelRank::first_kv_head)
      .def_ro("first_index_head", &TensorParallelRank::first_index_head)
      .def("__repr__", [](const TensorParallelRank& r) {
        return "TensorParallelRank(first_q_head=" + std::to_string(r.first_q_head) +
               ", first_kv_head=" + std::to_string(r.first_kv_head) +
               ", first_index_head=" + std::to_string(r.first_index_head) + ", config=<" +
               std::to_string(r.config.resolve_heads().num_attention_heads) + " q heads, " +
               std::to_string(r.config.resolve_heads().num_key_value_heads) + " kv heads>)";
      });

  nb::class_<KvCacheView>(m, "KvCache", "A view of a paged main K/V cache.")
      .def_prop_ro("dtype", [](const KvCacheView& v) { return std::string(to_string(v.dtype)); })
      .def_prop_ro("num_pages", [](const KvCacheView& v) { return v.shape.num_pages; })
      .def_prop_ro("num_kv_heads", [](const KvCacheView& v) { return v.shape.num_kv_heads; })
      .def_prop_ro("head_dim", [](const KvCacheView& v) { return v.shape.head_dim; })
      .def_prop_ro("page_size", [](const KvCacheView& v) { return v.shape.page_size; })
      .def_rw("k_scale", &KvCacheView::k_scale)
      .def_rw("v_scale", &KvCacheView::v_scale)
      .def("__repr__", [](const KvCacheView& v) { return kv_cache_repr(v); });
  nb::class_<IndexCacheView>(m, "IndexCache", "A view of the index-K side cache.")
      .def_prop_ro("dtype", [](const IndexCacheView& v) { return std::string(to_string(v.dtype)); })
      .def_prop_ro("num_pages", [](const IndexCacheView& v) { return v.num_pages; })
      .def_prop_ro("index_dim", [](const IndexCacheView& v) { return v.index_dim; })
      .def_prop_ro("page_size", [](const IndexCacheView& v) { return v.page_size; })
      .def("__repr__", [](const IndexCacheView& v) { return index_cache_repr(v); });

  m.def(
      "kv_cache",
      [](const std::string& layout, const std::string& dtype, nb::handle k, nb::handle v,
         nb::handle k_scales, nb::handle v_scales, std::optional<std::int64_t> num_kv_heads,
         std::optional<std::int64_t> head_dim, float k_scale, float v_scale) {
        const DType d = parse_dtype_arg(dtype, "dtype");
        KvCacheView out = KvCacheView::from_tensors(
            parse_layout(layout), d, cache_view(k, "k", d), cache_view(v, "v", d),
            cache_view(k_scales, "k_scales", d), cache_view(v_scales, "v_scales", d));
        if (num_kv_heads && *num_kv_heads != out.shape.num_kv_heads) {
          value_error("num_kv_heads is " + std::to_string(*num_kv_heads) + " but k's shape holds " +
                      std::to_string(out.shape.num_kv_heads) + " kv heads");
        }
        if (head_dim && *head_dim != out.shape.head_dim) {
          value_error("head_dim is " + std::to_string(*head_dim) +
                      " but k's shape holds head_dim " + std::to_string(out.shape.head_dim));
        }
        out.k_scale = k_scale;
        out.v_scale = v_scale;
        out.validate();
        return out;
      },
      nb::arg("layout"), nb::arg("dtype"), nb::arg("k"), nb::arg("v") = nb::none(),
      nb::arg("k_scales") = nb::none(), nb::arg("v_scales") = nb::none(),
      nb::arg("num_kv_heads") = nb::none(), nb::arg("head_dim") = nb::none(),
      nb::arg("k_scale") = 1.0f, nb::arg("v_scale") = 1.0f, nb::keep_alive<0, 3>(),
      nb::keep_alive<0, 4>(), nb::keep_alive<0, 5>(), nb::keep_alive<0, 6>(),
      "A KvCache over caller-owned arrays (no copy; any strides with a contiguous last "
      "dimension). layout: packed [pages, Hkv, 128, 2*E], separate / token_major (k and v "
      "arrays [pages, Hkv, 128, E] / [pages, 128, Hkv, E]), stacked [pages, 2, Hkv, 128, E]; "
      "E = D elements for bf16/fp16 (uint16 bits on numpy) and fp8 (uint8 or fp8 dtypes), D/2 "
      "uint8 bytes for nvfp4, whose k_scales (and v_scales) have the same layout with E = D/16. "
      "Heads, head dim and pages come from the shapes (num_kv_heads / head_dim, if given, must "
      "agree). The arrays are kept alive by the view.");

  m.def(
      "index_cache_view",
      [](const std::string& dtype, nb::handle data, nb::handle scales) {
        const DType d = parse_dtype_arg(dtype, "dtype");
        return IndexCacheView::from_tensors(d, cache_view(data, "index_cache", d),
                                            cache_view(scales, "index_cache scales", d));
      },
      nb::arg("dtype"), nb::arg("data"), nb::arg("scales") = nb::none(), nb::keep_alive<0, 2>(),
      nb::keep_alive<0, 3>(),
      "An IndexCache over a caller-owned [pages, 128, Di] array (NVFP4: uint8 data "
      "[pages, 128, Di/2] and scales [pages, 128, Di/16]).");

  nb::class_<CacheManager>(m, "CacheManager",
                           "Page pools for the main and index caches; requests, block tables, "
                           "slot mappings.")
      .def(
          "__init__",
          [](CacheManager* self, const Config& c, std::int64_t num_pages, const std::string& layout,
             const std::string& device, bool separate_index_pages, std::int64_t num_index_pages,
             std::optional<std::uint64_t> shuffle_seed) {
            CacheManagerOptions o;
            o.num_pages = num_pages;
            o.layout = parse_layout(layout);
            if (device != "cpu" && device != "cuda") {
              value_error("device must be 'cpu' or 'cuda', got '" + device + "'");
            }
            o.device = device == "cuda" ? Device::kCuda : Device::kCpu;
            o.separate_index_pages = separate_index_pages;
            o.num_index_pages = num_index_pages;
            o.shuffle_seed = shuffle_seed;
            new (self) CacheManager(c, o);
          },
          nb::arg("config"), nb::arg("num_pages"), nb::arg("layout") = "packed",
          nb::arg("device") = "cpu", nb::arg("separate_index_pages") = false,
          nb::arg("num_index_pages") = 0, nb::arg("shuffle_seed") = nb::none())
      .def("add_request", &CacheManager::add_request)
      .def("append", &CacheManager::append, nb::arg("request"), nb::arg("num_tokens"),
           "Grow a request by num_tokens; RuntimeError (nothing changed) when out of pages.")
      .def("free_request", &CacheManager::free_request)
      .def("length", &CacheManager::length)
      .def("free_pages", &CacheManager::free_pages)
      .def("pages",
           [](const CacheManager& cm, std::int64_t id) {
             const auto p = cm.pages(id);
             return std::vector<std::int32_t>(p.begin(), p.end());
           })
      .def(
          "block_table",
          [](const CacheManager& cm, const std::vector<std::int64_t>& ids, std::int64_t max_blocks,
             bool index_cache) {
            const auto t = cm.block_table(ids, max_blocks, index_cache);
            auto a = new_array<std::int32_t>({ids.size(), static_cast<size_t>(max_blocks)});
            std::memcpy(a.data(), t.data(), t.size() * sizeof(std::int32_t));
            return a;
          },
          nb::arg("requests"), nb::arg("max_blocks"), nb::arg("index_cache") = false,
          "int32 [len(requests), max_blocks]; -1 past each request's pages and for request -1.")
      .def(
          "slot_mapping",
          [](const CacheManager& cm, std::int64_t id, std::int64_t first, std::int64_t count,
             bool index_cache) {
            const auto s = cm.slot_mapping(id, first, count, index_cache);
            auto a = new_array<std::int64_t>({s.size()});
            std::memcpy(a.data(), s.data(), s.size() * sizeof(std::int64_t));
            return a;
          },
          nb::arg("request"), nb::arg("first"), nb::arg("count"), nb::arg("index_cache") = false,
          "int64 [count] slots of positions [first, first + count).")
      .def_prop_ro("kv_cache", &CacheManager::kv_cache, nb::rv_policy::reference_internal)
      .def_prop_ro("index_cache", &CacheManager::index_cache, nb::rv_policy::reference_internal)
      .def("check_invariants", &CacheManager::check_invariants)
      .def("__repr__", [](const CacheManager& cm) {
        return "CacheManager(requests=" + std::to_string(cm.live_requests().size()) +
               ", free_pages=" + std::to_string(cm.free_pages()) + "/" +
               std::to_string(cm.num_pages()) +
               ", free_index_pages=" + std::to_string(cm.free_index_pages()) + "/" +
               std::to_string(cm.num_index_pages()) + ", kv_cache=" + kv_cache_repr(cm.kv_cache()) +
               ", index_cache=" + index_cache_repr(cm.index_cache()) + ")";
      });

  m.def(
      "build_batch_metadata",
      [](const std::vector<std::pair<std::int64_t, std::int64_t>>& decode,
         std::int64_t decode_query_len,
         const std::vector<std::pair<std::int64_t, std::int64_t>>& prefill,
         std::int64_t decode_capacity) {
        std::vector<RequestShape> d, p;
        for (auto [a, b] : decode) d.push_back({a, b});
        for (auto [a, b] : prefill) p.push_back({a, b});
        const BatchMetadata md = build_batch_metadata(
            d, int_arg(decode_query_len, "decode_query_len"), p, decode_capacity);
        nb::dict out;
        auto arr = [](const std::vector<std::int32_t>& v) {
          auto a = new_array<std::int32_t>({v.size()});
          std::memcpy(a.data(), v.data(), v.size() * sizeof(std::int32_t));
          return a;
        };
        out["cu_seqlens_q"] = arr(md.cu_seqlens_q);
        out["seq_lens"] = arr(md.seq_lens);
        out["prefix_lens"] = arr(md.prefix_lens);
        out["token_request"] = arr(md.token_request);
        out["token_position"] = arr(md.token_position);
        out["num_decode_requests"] = md.num_decode_requests;
        out["num_padding_requests"] = md.num_padding_requests;
        out["num_prefill_requests"] = md.num_prefill_requests;
        out["decode_query_len"] = md.decode_query_len;
        out["num_tokens"] = md.num_tokens;
        return out;
      },
      nb::arg("decode"), nb::arg("decode_query_len"), nb::arg("prefill"),
      nb::arg("decode_capacity") = 0,
      "Batch arrays from [(prefix_len, query_len)] lists: decode rows first (uniform query "
      "length 1..16), padding rows up to decode_capacity, then prefill rows.");

  m.def(
      "insert_kv",
      [](const KvCacheView& cache, const AnyArray& k, const AnyArray& v, const AnyArray& slots,
         bool checked, std::int64_t stream) {
        insert_kv(cache, view(k, "k"), view(v, "v"), view(slots, "slot_mapping"),
                  op_options(checked, 0, stream));
      },
      nb::arg("cache"), nb::arg("k"), nb::arg("v"), nb::arg("slot_mapping"),
      nb::arg("checked") = false, nb::arg("stream") = 0,
      "Write k, v [T, Hkv, D] (bf16/fp16/fp32) at slot_mapping [T] int64 (negative: skip), "
      "quantized to the cache dtype.");
  m.def(
      "insert_index_k",
      [](const IndexCacheView& cache, const AnyArray& ik, const AnyArray& slots, bool checked,
         std::int64_t stream) {
        insert_index_k(cache, view(ik, "index_k"), view(slots, "slot_mapping"),
                       op_options(checked, 0, stream));
      },
      nb::arg("cache"), nb::arg("index_k"), nb::arg("slot_mapping"), nb::arg("checked") = false,
      nb::arg("stream") = 0, "Write index_k [T, Di] at slot_mapping [T] int64.");

  m.def(
      "index_prefill",
      [](const Config& c, const AnyArray& index_q, const IndexCacheView& cache,
         const AnyArray& cu_seqlens_q, const AnyArray& seq_lens, const AnyArray& block_table,
         nb::handle out, nb::handle block_scores, bool checked, std::int64_t threads,
         nb::handle workspace, std::int64_t stream) -> nb::object {
        const TensorView q = c.indexer_kv_dtype == "fp8" ? as_fp8(view(index_q, "index_q"))
                                                         : view(index_q, "index_q");
        const std::int64_t hkv = c.resolve_heads().num_key_value_heads;
        auto [result, topk] = topk_output(out, hkv, q.shape[0], c.sparse_topk_blocks);
        PrefillBatch batch{view(cu_seqlens_q, "cu_seqlens_q"), view(seq_lens, "seq_lens"),
                           view(block_table, "block_table")};
        // Every view (they touch Python objects) before the GIL is released.
        const IndexOutputs outputs{topk, output_view(block_scores, "block_scores"),
                                   output_view(workspace, "workspace")};
        const OpOptions options = op_options(checked, threads, stream);
        {
          nb::gil_scoped_release release;
          index_prefill(c, q, cache, batch, outputs, options);
        }
        return result;
      },
      nb::arg("config"), nb::arg("index_q"), nb::arg("index_cache"), nb::arg("cu_seqlens_q"),
      nb::arg("seq_lens"), nb::arg("block_table"), nb::arg("out") = nb::none(),
      nb::arg("block_scores") = nb::none(), nb::arg("checked") = false, nb::arg("threads") = 0,
      nb::arg("workspace") = nb::none(), nb::arg("stream") = 0,
      "Top-k block ids int32 [Hkv, T, topk] for index_q [T, Hidx, Di] over a ragged batch. "
      "CUDA tensors also need `out`, a uint8 `workspace` of index_workspace_bytes(...) bytes and "
      "the cudaStream_t to run on as an integer (`stream`, e.g. torch.cuda.current_stream()."
      "cuda_stream).");

  m.def(
      "sparse_attention_prefill",
      [](const Config& c, const AnyArray& q, const KvCacheView& cache, const AnyArray& cu_seqlens_q,
         const AnyArray& seq_lens, const AnyArray& block_table, const AnyArray& topk,
         nb::handle out, nb::handle lse, bool checked, std::int64_t threads, nb::handle workspace,
         std::int64_t stream) {
        PrefillBatch batch{view(cu_seqlens_q, "cu_seqlens_q"), view(seq_lens, "seq_lens"),
                           view(block_table, "block_table")};
        AttentionOutputs o;
        o.out = output_view(out, "out");
        o.lse = output_view(lse, "lse");
        o.workspace = output_view(workspace, "workspace");
        const TensorView qv = view(q, "q"), tk = view(topk, "topk");
        const OpOptions options = op_options(checked, threads, stream);
        nb::gil_scoped_release release;
        sparse_attention_prefill(c, qv, cache, batch, tk, o, options);
      },
      nb::arg("config"), nb::arg("q"), nb::arg("kv_cache"), nb::arg("cu_seqlens_q"),
      nb::arg("seq_lens"), nb::arg("block_table"), nb::arg("topk"), nb::arg("out"),
      nb::arg("lse") = nb::none(), nb::arg("checked") = false, nb::arg("threads") = 0,
      nb::arg("workspace") = nb::none(), nb::arg("stream") = 0,
      "Sparse GQA attention of q [T, Hq, D] over each row's top-k blocks into out [T, Hq, D] "
      "(bf16 as uint16 on numpy, fp16, fp32) and optionally lse [T, Hq] fp32. CUDA tensors also "
      "need a uint8 `workspace` of attention_workspace_bytes(...) bytes and the stream.");

  m.def(
      "dense_attention",
      [](const Config& c, const AnyArray& q, const KvCacheView& cache, const AnyArray& cu_seqlens_q,
         const AnyArray& seq_lens, const AnyArray& block_table, nb::handle out, nb::handle lse,
         bool checked, std::int64_t threads, nb::handle workspace, std::int64_t stream) {
        PrefillBatch batch{view(cu_seqlens_q, "cu_seqlens_q"), view(seq_lens, "seq_lens"),
                           view(block_table, "block_table")};
        AttentionOutputs o;
        o.out = output_view(out, "out");
        o.lse = output_view(lse, "lse");
        o.workspace = output_view(workspace, "workspace");
        const TensorView qv = view(q, "q");
        const OpOptions options = op_options(checked, threads, stream);
        nb::gil_scoped_release release;
        dense_attention(c, qv, cache, batch, o, options);
      },
      nb::arg("config"), nb::arg("q"), nb::arg("kv_cache"), nb::arg("cu_seqlens_q"),
      nb::arg("seq_lens"), nb::arg("block_table"), nb::arg("out"), nb::arg("lse") = nb::none(),
      nb::arg("checked") = false, nb::arg("threads") = 0, nb::arg("workspace") = nb::none(),
      nb::arg("stream") = 0,
      "Causal GQA attention over every visible key of the paged cache (the cross-check).");

  m.def(
      "index_decode",
      [](const Config& c, const AnyArray& index_q, const IndexCacheView& cache,
         const AnyArray& seq_lens, const AnyArray& block_table, std::int64_t decode_query_len,
         nb::handle out, bool checked, std::int64_t threads, nb::handle workspace,
         std::int64_t stream) -> nb::object {
        const TensorView q = c.indexer_kv_dtype == "fp8" ? as_fp8(view(index_q, "index_q"))
                                                         : view(index_q, "index_q");
        const std::int64_t hkv = c.resolve_heads().num_key_value_heads;
        auto [result, topk] = topk_output(out, hkv, q.shape[0], c.sparse_topk_blocks);
        DecodeBatch batch{view(seq_lens, "seq_lens"), view(block_table, "block_table"),
                          int_arg(decode_query_len, "decode_query_len")};
        const IndexOutputs outputs{topk, {}, output_view(workspace, "workspace")};
        const OpOptions options = op_options(checked, threads, stream);
        {
          nb::gil_scoped_release release;
          index_decode(c, q, cache, batch, outputs, options);
        }
        return result;
      },
      nb::arg("config"), nb::arg("index_q"), nb::arg("index_cache"), nb::arg("seq_lens"),
      nb::arg("block_table"), nb::arg("decode_query_len") = 1, nb::arg("out") = nb::none(),
      nb::arg("checked") = false, nb::arg("threads") = 0, nb::arg("workspace") = nb::none(),
      nb::arg("stream") = 0,
      "Top-k block ids int32 [Hkv, B * decode_query_len, topk] for decode rows; rows of a "
      "request with seq_lens 0 (padding) select nothing. CUDA tensors: as index_prefill.");

  m.def("index_workspace_bytes", &index_workspace_bytes, nb::arg("config"), nb::arg("num_rows"),
        nb::arg("num_requests"), nb::arg("max_blocks"),
        "Bytes of the device workspace the CUDA indexer needs for such a batch (the CPU backend "
        "needs none).");

  m.def("attention_workspace_bytes", &attention_workspace_bytes, nb::arg("config"),
        nb::arg("num_rows"), nb::arg("num_requests"),
        "Bytes of the device workspace the CUDA attention needs for any prefill, dense or decode "
        "batch of at most num_requests requests and num_rows rows (the CPU backend needs none). "
        "The index ops' workspace can be the same buffer.");

  m.def("selects_every_block", &selects_every_block, nb::arg("config"), nb::arg("max_seq_len"),
        "Whether every row of a batch whose requests hold at most max_seq_len tokens each selects "
        "all of its visible blocks (full coverage): then dense_attention writes exactly the rows "
        "the indexer and the sparse attention would, and the indexer can be skipped.");

  m.def("decode_workspace_bytes", &decode_workspace_bytes, nb::arg("config"),
        nb::arg("max_requests"), nb::arg("max_decode_query_len"), nb::arg("max_blocks"),
        "Bytes of one device workspace serving a whole decode step (index_decode then "
        "sparse_attention_decode) for every batch up to these capacities.");

  m.def(
      "sparse_attention_decode",
      [](const Config& c, const AnyArray& q, const KvCacheView& cache, const AnyArray& seq_lens,
         const AnyArray& block_table, const AnyArray& topk, nb::handle out,
         std::int64_t decode_query_len, nb::handle lse, nb::handle mxfp8_scales,
         const std::string& scale_layout, bool checked, std::int64_t threads, nb::handle workspace,
         std::int64_t stream) {
        DecodeBatch batch{view(seq_lens, "seq_lens"), view(block_table, "block_table"),
                          int_arg(decode_query_len, "decode_query_len")};
        const AttentionOutputs o =
            decode_attention_outputs(out, lse, mxfp8_scales, scale_layout, workspace);
        const TensorView qv = view(q, "q"), tk = view(topk, "topk");
        const OpOptions options = op_options(checked, threads, stream);
        nb::gil_scoped_release release;
        sparse_attention_decode(c, qv, cache, batch, tk, o, options);
      },
      nb::arg("config"), nb::arg("q"), nb::arg("kv_cache"), nb::arg("seq_lens"),
      nb::arg("block_table"), nb::arg("topk"), nb::arg("out"), nb::arg("decode_query_len") = 1,
      nb::arg("lse") = nb::none(), nb::arg("mxfp8_scales") = nb::none(),
      nb::arg("scale_layout") = "row_major", nb::arg("checked") = false, nb::arg("threads") = 0,
      nb::arg("workspace") = nb::none(), nb::arg("stream") = 0,
      "Decode attention into out [T, Hq, D]; with mxfp8_scales, out is [T, Hq*D] E4M3 codes "
      "(uint8) and mxfp8_scales the E8M0 scales ([T, Hq*D/32] row-major, or the 128x4 swizzled "
      "buffer), bit-identical to quantizing the bf16 output.");

  m.def(
      "sparse_decode_step",
      [](const Config& c, const AnyArray& index_q, const IndexCacheView& index_cache,
         const AnyArray& q, const KvCacheView& cache, const AnyArray& seq_lens,
         const AnyArray& block_table, nb::handle out, std::int64_t decode_query_len,
         nb::handle topk, nb::handle block_scores, nb::handle lse, nb::handle mxfp8_scales,
         const std::string& scale_layout, bool checked, std::int64_t threads, nb::handle workspace,
         std::int64_t stream) -> nb::object {
        const TensorView iq = c.indexer_kv_dtype == "fp8" ? as_fp8(view(index_q, "index_q"))
                                                          : view(index_q, "index_q");
        const std::int64_t hkv = c.resolve_heads().num_key_value_heads;
        auto [result, topk_view] =
            topk_output(topk, hkv, iq.shape[0], c.sparse_topk_blocks, "topk");
        DecodeBatch batch{view(seq_lens, "seq_lens"), view(block_table, "block_table"),
                          int_arg(decode_query_len, "decode_query_len")};
        const AttentionOutputs o =
            decode_attention_outputs(out, lse, mxfp8_scales, scale_layout, workspace);
        const IndexOutputs index_outputs{topk_view, output_view(block_scores, "block_scores"),
                                         o.workspace};
        const TensorView qv = view(q, "q");
        const OpOptions options = op_options(checked, threads, stream);
        {
          nb::gil_scoped_release release;
          sparse_decode_step(c, iq, index_cache, qv, cache, batch, index_outputs, o, options);
        }
        return result;
      },
      nb::arg("config"), nb::arg("index_q"), nb::arg("index_cache"), nb::arg("q"),
      nb::arg("kv_cache"), nb::arg("seq_lens"), nb::arg("block_table"), nb::arg("out"),
      nb::arg("decode_query_len") = 1, nb::arg("topk") = nb::none(),
      nb::arg("block_scores") = nb::none(), nb::arg("lse") = nb::none(),
      nb::arg("mxfp8_scales") = nb::none(), nb::arg("scale_layout") = "row_major",
      nb::arg("checked") = false, nb::arg("threads") = 0, nb::arg("workspace") = nb::none(),
      nb::arg("stream") = 0,
      "One sparse layer's decode step in one call: index_decode, then sparse_attention_decode "
      "over the top-k lists it writes, bit for bit the same outputs (on CUDA the attention "
      "selects each row's blocks itself where it can: no top-k launch). Returns the top-k ids "
      "int32 [Hkv, T, topk] (written into `topk` when given); out, lse and mxfp8_scales as "
      "sparse_attention_decode. CUDA tensors also need one uint8 `workspace` of "
      "decode_workspace_bytes(...) bytes and the stream.");

  m.def(
      "produce_qkv_index",
      [](const Config& c, const AnyArray& qkv_index, const AnyArray& q_norm_weight,
         const AnyArray& k_norm_weight, const AnyArray& index_q_norm_weight,
         const AnyArray& index_k_norm_weight, const AnyArray& positions,
         const AnyArray& slot_mapping, const KvCacheView& kv, const IndexCacheView& index,
         nb::handle q_out, nb::handle index_q_out,
         const std::optional<AnyArray>& index_slot_mapping, bool checked, std::int64_t threads,
         std::int64_t stream) {
        ProducerInputs in;
        in.qkv_index = view(qkv_index, "qkv_index");
        in.q_norm_weight = view(q_norm_weight, "q_norm_weight");
        in.k_norm_weight = view(k_norm_weight, "k_norm_weight");
        in.index_q_norm_weight = view(index_q_norm_weight, "index_q_norm_weight");
        in.index_k_norm_weight = view(index_k_norm_weight, "index_k_norm_weight");
        in.positions = view(positions, "positions");
        in.slot_mapping = view(slot_mapping, "slot_mapping");
        in.index_slot_mapping = optional_view(index_slot_mapping, "index_slot_mapping");
        ProducerOutputs out{output_view(q_out, "q"), output_view(index_q_out, "index_q")};
        if (c.indexer_kv_dtype == "fp8") out.index_q = as_fp8(out.index_q);
        const OpOptions options = op_options(checked, threads, stream);
        nb::gil_scoped_release release;
        produce_qkv_index(c, in, kv, index, out, options);
      },
      nb::arg("config"), nb::arg("qkv_index"), nb::arg("q_norm_weight"), nb::arg("k_norm_weight"),
      nb::arg("index_q_norm_weight"), nb::arg("index_k_norm_weight"), nb::arg("positions"),
      nb::arg("slot_mapping"), nb::arg("kv_cache"), nb::arg("index_cache"), nb::arg("q"),
      nb::arg("index_q"), nb::arg("index_slot_mapping") = nb::none(), nb::arg("checked") = false,
      nb::arg("threads") = 0, nb::arg("stream") = 0,
      "The fused producer: qkv_index [T, Hq*D + 2*Hkv*D + Hidx*Di + Di] -> Gemma RMSNorm and "
      "partial NeoX RoPE -> q [T, Hq, D], index_q [T, Hidx, Di], k/v/index-k into the caches.");

  // ---- The fused FP8 Q/K/V + index projection (include/flashmsa/projection.hpp) ----
  m.attr("PROJECTION_LAYOUT_VERSION") = kProjectionLayoutVersion;
  m.def(
      "pack_qkv_index_projection",
      [](const Config& c, std::int64_t tp_size, std::int64_t rank, const AnyArray& q,
         const AnyArray& k, const AnyArray& v, const AnyArray& index_q, const AnyArray& index_k) {
        const ProjectionWeights w{view(q, "q"), view(k, "k"), view(v, "v"),
                                  view(index_q, "index_q"), view(index_k, "index_k")};
        PackedProjection p;
        {
          nb::gil_scoped_release release;
          p = pack_qkv_index_projection(c, int_arg(tp_size, "tp_size"), int_arg(rank, "rank"), w);
        }
        auto weight = new_array<std::uint8_t>(
            {static_cast<size_t>(p.out_features), static_cast<size_t>(p.hidden)});
        auto scale = new_array<float>({static_cast<size_t>(p.out_features)});
        std::memcpy(weight.data(), p.weight.data(), p.weight.size());
        std::memcpy(scale.data(), p.scale.data(), p.scale.size() * sizeof(float));
        return std::make_pair(nb::cast(weight), nb::cast(scale));
      },
      nb::arg("config"), nb::arg("tp_size"), nb::arg("rank"), nb::arg("q"), nb::arg("k"),
      nb::arg("v"), nb::arg("index_q"), nb::arg("index_k"),
      "Packs one tensor-parallel rank's fused projection weight (layout version "
      "PROJECTION_LAYOUT_VERSION) from the layer's bf16 weights (uint16 bits or bfloat16, "
      "[out, hidden] each, all heads): returns (weight uint8 [out_features, hidden] E4M3 codes, "
      "scale float32 [out_features]), the output channels in the producer's row order "
      "[q | k | v | index_q | index_k] of that rank.");

  m.def(
      "projection_source",
      [](const Config& c, std::int64_t tp_size, std::int64_t rank, std::int64_t n) {
        const ProjectionRow r =
            projection_source(c, int_arg(tp_size, "tp_size"), int_arg(rank, "rank"), n);
        static const char* const kNames[] = {"q", "k", "v", "index_q", "index_k"};
        return std::make_pair(std::string(kNames[static_cast<int>(r.source)]), r.row);
      },
      nb::arg("config"), nb::arg("tp_size"), nb::arg("rank"), nb::arg("n"),
      "Where output channel n of a rank's fused projection comes from: (weight name, row).");

  m.def(
      "project_qkv_index_cpu",
      [](const AnyArray& weight, const AnyArray& scale, const AnyArray& hidden, nb::handle out,
         std::int64_t version) {
        const TensorView wv = view(weight, "weight"), sv = view(scale, "scale");
        check_tensor(wv, "weight", DType::kUint8, Device::kCpu, {-1, -1});
        check_tensor(sv, "scale", DType::kFp32, Device::kCpu, {wv.shape[0]});
        PackedProjection p;
        p.version = int_arg(version, "version");
        p.out_features = wv.shape[0];
        p.hidden = wv.shape[1];
        p.weight.resize(static_cast<size_t>(p.out_features * p.hidden));
        p.scale.resize(static_cast<size_t>(p.out_features));
        for (std::int64_t n = 0; n < p.out_features; ++n) {
          std::memcpy(p.weight.data() + n * p.hidden,
                      wv.as<const std::uint8_t>() + n * wv.stride[0],
                      static_cast<size_t>(p.hidden));
          p.scale[n] = sv.as<const float>()[n * sv.stride[0]];
        }
        const TensorView x = view(hidden, "hidden");
        nb::object result;
        TensorView o;
        if (out.is_none()) {
          auto a = new_array<std::uint16_t>({static_cast<size_t>(x.rank > 0 ? x.shape[0] : 0),
                                             static_cast<size_t>(p.out_features)});
          o = TensorView::contiguous(a.data(), DType::kBf16,
                                     {x.rank > 0 ? x.shape[0] : 0, p.out_features});
          result = nb::cast(a);
        } else {
          o = output_view(out, "out");
          result = nb::borrow(out);
        }
        {
          nb::gil_scoped_release release;
          project_qkv_index_cpu(p, x, o);
        }
        return result;
      },
      nb::arg("weight"), nb::arg("scale"), nb::arg("hidden"), nb::arg("out") = nb::none(),
      nb::arg("version") = kProjectionLayoutVersion,
      "The fused projection on the CPU (the oracle of a GPU path): hidden [T, hidden] bf16 -> "
      "per-token E4M3 (scale max|x|/448) -> fp32 products with the packed weight -> bf16 "
      "[T, out_features] (uint16 bits when out is left out).");

  m.def(
      "projection_workspace_bytes",
      [](std::int64_t max_tokens, std::int64_t hidden) {
        return projection_workspace_bytes(max_tokens, hidden);
      },
      nb::arg("max_tokens"), nb::arg("hidden"),
      "Bytes of device workspace project_qkv_index needs for up to max_tokens tokens (CUDA).");

  m.def(
      "project_qkv_index",
      [](const AnyArray& weight, const AnyArray& scale, const AnyArray& hidden, nb::handle out,
         nb::handle workspace, std::int64_t stream) {
        // Every view (they touch Python objects) before the GIL is released.
        const ProjectionWeightView weights{as_fp8(view(weight, "weight")), view(scale, "scale")};
        const TensorView x = view(hidden, "hidden"), o = output_view(out, "out"),
                         ws = output_view(workspace, "workspace");
        const OpOptions options = op_options(false, 0, stream);
        nb::gil_scoped_release release;
        project_qkv_index(weights, x, o, ws, options);
      },
      nb::arg("weight"), nb::arg("scale"), nb::arg("hidden"), nb::arg("out"),
      nb::arg("workspace") = nb::none(), nb::arg("stream") = 0,
      "The fused projection on the arrays' device: hidden [T, hidden] bf16 -> out [T, "
      "out_features] bf16 (the producer's qkv_index), with the packed weight (E4M3 codes as "
      "uint8 or fp8, [out_features, hidden]) and its float32 scale. CUDA: per-token E4M3 "
      "quantization + FP8 GEMM on `stream`, with a uint8 workspace of "
      "projection_workspace_bytes(T, hidden) bytes; graph-capturable.");
}
