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

/// The positions a query may not see, true = masked, shape (Tq, Tk); queries are the last Tq of
/// the Tk positions.
torch::Tensor causal_mask(int64_t t_q, int64_t t_k, const torch::Device& device);

}  // namespace kernels
}  // namespace attention
