#pragma once

// The backends behind functional::scaled_dot_product_attention. Inputs arrive validated; a
// kernel never knows which module called it.

#include <attention/functional.h>

namespace attention {
namespace kernels {

/// Whole score matrices, the article's formula. Reference for every other backend.
functional::AttentionOutput math(const torch::Tensor& query, const torch::Tensor& key,
                                 const torch::Tensor& value,
                                 const functional::ScaledDotProductAttentionOptions& options);

/// Query and key blocks with an online softmax; never makes a Tq x Tk tensor. Differentiable
/// (backward recomputes the blocks). No attention weights, no dropout.
functional::AttentionOutput chunked(const torch::Tensor& query, const torch::Tensor& key,
                                    const torch::Tensor& value,
                                    const functional::ScaledDotProductAttentionOptions& options,
                                    int64_t block_size);

/// Whether Auto should prefer native() over chunked() for large unmasked scores: true where
/// LibTorch has a fused, memory-efficient CPU kernel (2.x), false where it has only the
/// composite math (1.13).
bool native_is_fused();

/// LibTorch's own scaled dot-product attention (the public one from 2.0, the private one in
/// 1.13), adapted to this library's conventions. No attention weights.
functional::AttentionOutput native(const torch::Tensor& query, const torch::Tensor& key,
                                   const torch::Tensor& value,
                                   const functional::ScaledDotProductAttentionOptions& options);

/// Whether tiny() can take these inputs: CPU, float or double, contiguous, at most 64 tokens and
/// 64 features, and no gradient needed.
bool tiny_applies(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
                  const torch::Tensor& w_k, const torch::Tensor& w_v);

/// The article's projections and attention in plain loops, for inputs where LibTorch's per-op
/// dispatch would cost more than the arithmetic.
torch::Tensor tiny(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
                   const torch::Tensor& w_k, const torch::Tensor& w_v, bool causal);

/// The positions a query may not see, true = masked, shape (Tq, Tk); queries are the last Tq of
/// the Tk positions.
torch::Tensor causal_mask(int64_t t_q, int64_t t_k, const torch::Device& device);

/// True for query rows (..., Tq, 1) whose keys are all hidden by `hidden` (bool, true = masked)
/// and/or by -inf entries of the additive `float_mask`; undefined when neither is given.
torch::Tensor dead_rows(const torch::Tensor& hidden, const torch::Tensor& float_mask);

}  // namespace kernels
}  // namespace attention
