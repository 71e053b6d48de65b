#pragma once

// What the modules share besides the functional layer: the checks of their inputs and
// constructor arguments (every message names the module, what it expected and what it got) and
// the article's query/key/value parameters.

#include "checks.h"

#include <attention/functional.h>

#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <utility>

namespace attention {
namespace detail {

/// Checks a module input of shape (T, d_in) or (B, T, d_in) against the module's parameters:
/// rank, feature size, dtype and device. `what` names the argument in messages ("input", "x_2").
void check_module_input(const torch::Tensor& x, int64_t d_in, const torch::Tensor& parameter,
                        const char* module, const char* what);

/// Checks that two module inputs have the same rank and batch size; `names` is how messages call
/// them ("x_1 and x_2").
void check_same_batch(const torch::Tensor& a, const torch::Tensor& b, const char* module,
                      const char* name_a, const char* name_b);

/// Checks that a constructor argument is positive.
void check_positive(int64_t value, const char* name, const char* module);

/// The sizes every multi-head module of the book's chapter 4 is built from: d_in, d_out and
/// num_heads positive, num_heads dividing d_out, dropout in [0, 1).
void check_head_sizes(int64_t d_in, int64_t d_out, int64_t num_heads, double dropout,
                      const char* module);

/// A cache's append: keys and values of one shape (B, Hkv, T, head_dim), floating, of one dtype
/// and device, and, once the cache holds tokens (`cached` defined), like those.
void check_cache_append(const torch::Tensor& keys, const torch::Tensor& values,
                        const torch::Tensor& cached, const char* cache);

/// Puts a cache back as it was when the forward that appended to it fails afterwards, unless
/// keep() was called. A copy of a cache shares its storage, so positions past the old length may
/// be written, but the length, and the want of storage a first append fills, come back.
template <typename Cache>
class CacheRestore {
 public:
  /// `cache` may be null: nothing to restore then.
  explicit CacheRestore(Cache* cache) : cache_(cache) {
    if (cache_ != nullptr) saved_.emplace(*cache_);
  }
  CacheRestore(const CacheRestore&) = delete;
  CacheRestore& operator=(const CacheRestore&) = delete;
  ~CacheRestore() {
    if (cache_ != nullptr && !kept_) *cache_ = std::move(*saved_);
  }
  /// The forward succeeded: the append stays.
  void keep() { kept_ = true; }

 private:
  Cache* cache_;
  c10::optional<Cache> saved_;
  bool kept_ = false;
};

/// Refuses Backend::Native for a module whose functional entry has no Native kernel
/// (`what`, e.g. "sparse attention"): at construction, not at every forward.
void check_not_native(functional::Backend backend, const char* what, const char* module);

/// The article's projection matrices, registered as `W_query` (d_in, d_out_kq), `W_key`
/// (d_in_kv, d_out_kq), `W_value` (d_in_kv, d_out_v) and drawn with torch::rand in that order, so
/// that a seed gives the same weights as the Python classes.
struct QKVWeights {
  torch::Tensor W_query, W_key, W_value;
};
QKVWeights register_qkv(torch::nn::Module& module, int64_t d_in, int64_t d_in_kv, int64_t d_out_kq,
                        int64_t d_out_v, const char* name);

}  // namespace detail
}  // namespace attention
