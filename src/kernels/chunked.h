#pragma once

// Shared by the two halves of the chunked backend: the device-generic tiles made of LibTorch
// ops (chunked.cpp, forward and backward) and the fused CPU kernels (chunked_cpu.cpp, forward;
// chunked_cpu_backward.cpp, backward); and the backend's two halves without autograd, for
// callers that merge the results of several key blocks through their log-sum-exp (ring
// attention).

#include "kernels/problem.h"

#include <torch/torch.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace attention {
namespace kernels {

/// Whether the fused CPU forward and backward take these queries: CPU, float, double or bfloat16
/// (computed in float; its log-sum-exp is float).
bool fused_cpu_applies(const torch::Tensor& query);

/// The fused CPU forward of `p`, whose mask (if any) is expanded to the scores' shape. Inputs
/// keep their shapes (..., H, T, d) (rank 3 at least) and may be strided views.
/// Returns the output, shaped like the queries with dv features and laid out in memory like them
/// (so that a module's transpose back to (B, T, H, dv) is a view), and the log-sum-exp of every
/// query's scaled scores (N, G, Tq), +inf for a query whose keys are all masked; with_lse false
/// leaves the log-sum-exp undefined and never allocates it (inference: nothing reads it).
std::pair<torch::Tensor, torch::Tensor> cpu_forward(const Problem& p, const torch::Tensor& query,
                                                    const torch::Tensor& key,
                                                    const torch::Tensor& value,
                                                    bool with_lse = true);

/// The fused CPU backward of `p` (FlashAttention-2's): the gradients of query, key and value,
/// shaped like them, from the output `out` and log-sum-exp `lse` (N, G, Tq) of the forward. For
/// the queries fused_cpu_applies() takes.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> cpu_backward(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

/// The Chunked forward of `p` (its mask expanded to the scores' shape) without autograd: the fused
/// CPU forward where it applies, else the tiles. Returns the output shaped like the queries with
/// dv features and the log-sum-exp (N, G, Tq), +inf for a query that sees no key.
/// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
ATTENTION_API std::pair<torch::Tensor, torch::Tensor> forward_with_lse(const Problem& p,
                                                                       const torch::Tensor& query,
                                                                       const torch::Tensor& key,
                                                                       const torch::Tensor& value);

/// forward_with_lse on the device-generic tiles, for any device and dtype: the forward of every
/// input the fused CPU kernel does not take (and checked on the CPU against Math).
std::pair<torch::Tensor, torch::Tensor> tiles_forward_with_lse(const Problem& p,
                                                               const torch::Tensor& query,
                                                               const torch::Tensor& key,
                                                               const torch::Tensor& value);

/// The gradients of query, key and value (shaped like them) of the keys of `p`, given the final
/// output `out` and log-sum-exp `lse` (N, G, Tq) of the queries. When the keys of `p` are one
/// block of a longer sequence, `out` and `lse` are those of the whole sequence, and the results
/// are that block's share of the gradients. The fused CPU backward where it applies, else the
/// tiles.
/// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
ATTENTION_API std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward_with_lse(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

/// backward_with_lse on the device-generic tiles, for any device and dtype: the backward of
/// every input the fused CPU kernel does not take (and checked on the CPU against Math).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> tiles_backward_with_lse(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

}  // namespace kernels
}  // namespace attention
