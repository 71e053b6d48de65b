#pragma once

// The backends behind functional::scaled_dot_product_attention and projected_attention. Each
// receives the validated Problem (kernels/problem.h) and the tensors it describes; none reads the
// user's options or re-derives masking, and none knows which module called it.

#include "kernels/problem.h"

#include <attention/functional.h>

namespace attention {
namespace kernels {

/// Whole score matrices, the article's formula. Reference for every other backend; also takes
/// every empty problem, so that empty inputs give the same result on every backend.
functional::AttentionOutput math(const Problem& p, const torch::Tensor& query,
                                 const torch::Tensor& key, const torch::Tensor& value);

/// math() on float copies of bfloat16 inputs, its results rounded back once: a degenerate
/// problem handed to the Chunked backend keeps the fused kernels' float accuracy (a bfloat16
/// matmul sums its products in bfloat16, off by a few percent over 40 keys).
functional::AttentionOutput math_in_float(const Problem& p, const torch::Tensor& query,
                                          const torch::Tensor& key, const torch::Tensor& value);

/// Query and key blocks with an online softmax; never makes a Tq x Tk tensor. Differentiable
/// (backward recomputes the blocks). No attention weights, no dropout, no gradient for the mask.
functional::AttentionOutput chunked(const Problem& p, const torch::Tensor& query,
                                    const torch::Tensor& key, const torch::Tensor& value);

/// LibTorch's own scaled dot-product attention (the public one from 2.0, the private one in
/// 1.13), adapted to this library's conventions. No attention weights; queries and keys must be
/// finite (the caller checks).
functional::AttentionOutput native(const Problem& p, const torch::Tensor& query,
                                   const torch::Tensor& key, const torch::Tensor& value);

/// A backend's signature: math, chunked and native.
using Kernel = functional::AttentionOutput (*)(const Problem&, const torch::Tensor&,
                                               const torch::Tensor&, const torch::Tensor&);

/// A packed problem (Problem::packed) one sequence at a time: `kernel` on each sequence's problem
/// (Problem::sequence) and its rows of the (H, total, d) inputs (Math where that problem is
/// degenerate), the outputs joined, (H, total_q, dv), in memory as (total_q, H, dv). Math,
/// Native and Chunked's device-generic tiles compute packed problems so; with autograd through
/// the joins. (Chunked's fused CPU kernels take every sequence in one pass.)
functional::AttentionOutput each_sequence(const Problem& p, const torch::Tensor& query,
                                          const torch::Tensor& key, const torch::Tensor& value,
                                          Kernel kernel);

/// Whether tiny() can take these (validated) inputs: CPU, float or double, contiguous, at most 64
/// tokens and 64 features. The caller checks that no gradient, mask, dropout or weights are needed.
bool tiny_applies(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
                  const torch::Tensor& w_k, const torch::Tensor& w_v);

/// The article's projections and attention in plain loops, for inputs where LibTorch's per-op
/// dispatch would cost more than the arithmetic. `p` describes the projected problem.
torch::Tensor tiny(const Problem& p, const torch::Tensor& x_q, const torch::Tensor& x_kv,
                   const torch::Tensor& w_q, const torch::Tensor& w_k, const torch::Tensor& w_v);

}  // namespace kernels
}  // namespace attention
