// FlashMSA: MiniMax-M3 sparse attention for inference engines. The one header to include.
#pragma once

#include "flashmsa/backend.hpp"
#include "flashmsa/cache.hpp"
#include "flashmsa/cache_manager.hpp"
#include "flashmsa/config.hpp"
#include "flashmsa/dtype.hpp"
#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/metadata.hpp"
#include "flashmsa/ops.hpp"
#include "flashmsa/projection.hpp"
#include "flashmsa/tensor.hpp"
#include "flashmsa/version.hpp"
