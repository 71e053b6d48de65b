#pragma once

// Attention of each query over the keys its indices select (functional::sparse_attention's fused
// CPU route): per query, one score per selected key and an exact softmax over them; keys that no
// index names are never read. The indices of a token are shared by all its heads, as DeepSeek's
// lightning indexer makes them.

#include <torch/types.h>

namespace attention {
namespace kernels {
namespace cpu {

/// q (B, H, T, d), k (B, Hkv, S, d), v (B, Hkv, S, dv): contiguous, float or double, Hkv dividing
/// H; indices (B, T, K) int64 in [-1, S), -1 for none. Returns the output (B, H, T, dv) and
/// writes each row's log-sum-exp (B, H, T) to `lse` when it is defined (-inf for a row with no
/// key: its output is 0).
torch::Tensor sparse_attention_forward(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, const torch::Tensor& indices,
                                       double scale, const torch::Tensor& lse);

/// Gradients of q, k and v from the output's gradient, with the forward's output and lse.
struct SparseAttentionGradients {
  torch::Tensor q, k, v;
};
SparseAttentionGradients sparse_attention_backward(const torch::Tensor& grad_output,
                                                   const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v,
                                                   const torch::Tensor& indices,
                                                   const torch::Tensor& output,
                                                   const torch::Tensor& lse, double scale);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
