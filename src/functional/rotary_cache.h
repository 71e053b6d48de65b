#pragma once

// The cos and sin tables of a module's rotary embedding, computed once per dtype and device and
// grown (doubling, up to a bound) when a longer sequence comes; apply_rotary's rotation on tables
// given.

#include <attention/rotary.h>

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace attention {
namespace detail {

/// x (..., T, d) rotated with cos and sin (T, r / 2) in x's computing dtype: the first r
/// features in pairs of `layout`, the rest unchanged. Inputs are checked by the caller.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     functional::RotaryLayout layout);

/// `options` checked against a head of `head_dim` features, with rotary_dim 0 resolved to it.
functional::RotaryOptions resolve_rotary(functional::RotaryOptions options, int64_t head_dim,
                                         const char* caller);

/// The dtype rotations are computed in: float for bfloat16 and half, else x's own.
at::ScalarType rotary_compute_dtype(at::ScalarType dtype);

class RotaryCache {
 public:
  /// Positions up to this are kept in the tables (at most 64 Ki rows of rotary_dim / 2 cos and
  /// sin values per dtype and device); rows beyond are computed per call.
  static constexpr int64_t kMaxCachedPositions = int64_t{1} << 16;

  /// `options` with rotary_dim resolved (> 0) and checked.
  explicit RotaryCache(const functional::RotaryOptions& options);

  /// Rows [start, start + count) of the cos and sin tables in `dtype` on `device`.
  std::pair<torch::Tensor, torch::Tensor> rows(int64_t start, int64_t count, at::ScalarType dtype,
                                               const at::Device& device);

  const functional::RotaryOptions& options() const { return options_; }

 private:
  functional::RotaryOptions options_;
  std::mutex mutex_;  // forwards on several threads share one module
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> tables_;
};

}  // namespace detail
}  // namespace attention
