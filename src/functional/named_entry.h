#pragma once

// The functional entry points under another caller's name: the operators of
// src/operators/ validate and compute exactly as scaled_dot_product_attention() and
// varlen_attention() do, and every message names the operator the user called.

#include <attention/functional.h>

namespace attention {
namespace functional {

/// scaled_dot_product_attention() with `caller` in its messages.
AttentionOutput scaled_dot_product_attention_named(const torch::Tensor& query,
                                                   const torch::Tensor& key,
                                                   const torch::Tensor& value,
                                                   const ScaledDotProductAttentionOptions& options,
                                                   const char* caller);

/// varlen_attention() with `caller` in its messages.
torch::Tensor varlen_attention_named(const torch::Tensor& query, const torch::Tensor& key,
                                     const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                                     const torch::Tensor& cu_seqlens_k,
                                     const ScaledDotProductAttentionOptions& options,
                                     const char* caller);

}  // namespace functional
}  // namespace attention
