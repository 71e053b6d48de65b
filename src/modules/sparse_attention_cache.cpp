#include <attention/sparse_attention_cache.h>

#include "checks.h"

#include <torch/torch.h>

namespace attention {

namespace {
constexpr const char* kSparseAttentionCacheName = "attention::SparseAttentionCache";
}

SparseAttentionCache::SparseAttentionCache(int64_t max_length)
    : kv_(max_length), index_keys_(max_length) {}

SparseAttentionCache::Cached SparseAttentionCache::append(const torch::Tensor& keys,
                                                          const torch::Tensor& values,
                                                          const torch::Tensor& index_keys) {
  // The index keys' own checks first, so that the index append refuses only what its cache
  // alone knows.
  TORCH_CHECK_VALUE(keys.defined() && keys.dim() == 4 && index_keys.defined() &&
                        index_keys.dim() == 3 && index_keys.size(0) == keys.size(0) &&
                        index_keys.size(1) == keys.size(2),
                    kSparseAttentionCacheName,
                    ": expected keys (B, H, T, head_dim) and index keys (B, T, index_head_dim) of "
                    "one B and T, got ",
                    keys.defined() ? detail::shape_str(keys.sizes()) : "undefined", " and ",
                    index_keys.defined() ? detail::shape_str(index_keys.sizes()) : "undefined");
  TORCH_CHECK_TYPE(index_keys.scalar_type() == keys.scalar_type(), kSparseAttentionCacheName,
                   ": expected index keys of the keys' dtype ", keys.scalar_type(), ", got ",
                   index_keys.scalar_type());
  TORCH_CHECK(index_keys.device() == keys.device(), kSparseAttentionCacheName,
              ": expected index keys on the keys' device ", keys.device(), ", got ",
              index_keys.device());
  const auto cached_index = index_keys_.latent();
  TORCH_CHECK_VALUE(!cached_index.defined() || index_keys.size(2) == cached_index.size(2),
                    kSparseAttentionCacheName, ": expected index keys of ",
                    cached_index.defined() ? cached_index.size(2) : 0,
                    " features like the cached ones, got ", index_keys.size(2));
  TORCH_CHECK_VALUE(
      cached_index.defined() ||
          detail::fits_in_bytes({index_keys.size(0), max_length(), index_keys.size(2)},
                                static_cast<int64_t>(index_keys.element_size())),
      kSparseAttentionCacheName, ": storage for max_length = ", max_length(),
      " tokens of index keys (", index_keys.size(0), ", T, ", index_keys.size(2),
      ") would exceed 2^63 - 1 bytes");
  // The keys' cache as it was: a copy shares its storage, so a refused index append puts back
  // its length and, on the first append, its want of storage (which fixes the keys' shape).
  const KVCache before = kv_;
  auto [all_keys, all_values] = kv_.append(keys, values);
  try {
    return {all_keys, all_values, index_keys_.append(index_keys)};
  } catch (...) {
    kv_ = before;
    throw;
  }
}

void SparseAttentionCache::reset() {
  kv_.reset();
  index_keys_.reset();
}

void SparseAttentionCache::truncate(int64_t length) {
  kv_.truncate(length);
  index_keys_.truncate(length);
}

int64_t SparseAttentionCache::bytes_per_token() const {
  const auto keys = kv_.keys();
  if (!keys.defined()) return 0;
  const int64_t kv = 2 * keys.size(1) * keys.size(3) * static_cast<int64_t>(keys.element_size());
  return kv + index_keys_.bytes_per_token();
}

}  // namespace attention
