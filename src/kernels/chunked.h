#pragma once

// Shared by the two halves of the chunked backend: the device-generic tiles made of LibTorch
// ops (chunked.cpp, forward and backward) and the fused CPU kernels (kernels/cpu/forward.cpp,
// forward; kernels/cpu/backward.cpp, backward). Its halves without autograd are in
// kernels/blockwise.h.

#include "kernels/blockwise.h"
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
/// With a relative position bias, `relative_grad` (when given) receives the gradient of its bias
/// by relative position, (H, Tq + Tk - 1) in float or double (relative_bias_by_position's layout).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> cpu_backward(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out, torch::Tensor* relative_grad = nullptr);

/// forward_with_lse on the device-generic tiles, for any device and dtype: the forward of every
/// input the fused CPU kernel does not take (and checked on the CPU against Math).
std::pair<torch::Tensor, torch::Tensor> tiles_forward_with_lse(const Problem& p,
                                                               const torch::Tensor& query,
                                                               const torch::Tensor& key,
                                                               const torch::Tensor& value);

/// backward_with_lse on the device-generic tiles, for any device and dtype: the backward of
/// every input the fused CPU kernel does not take (and checked on the CPU against Math).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> tiles_backward_with_lse(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

/// chunked() on the fused CPU kernels for a caller that records its own autograd node (the
/// operators of src/operators/): the output and the log-sum-exp (N, G, Tq) of every query,
/// attention sinks included, for a problem that is not degenerate and has no relative bias, with
/// the inputs as the caller gave them (rank 2 too; the (H, total, d) views of a packed problem).
std::pair<torch::Tensor, torch::Tensor> fused_forward_with_lse(const Problem& problem,
                                                               const torch::Tensor& query,
                                                               const torch::Tensor& key,
                                                               const torch::Tensor& value);

/// The backward of fused_forward_with_lse(): the gradients of query, key and value, shaped like
/// them, and of the sinks (undefined without sinks).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> fused_backward_with_lse(
    const Problem& problem, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

}  // namespace kernels
}  // namespace attention
