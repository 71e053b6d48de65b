#pragma once

/// \file
/// Converting between the article's wrapper, the fused module and LibTorch's MultiheadAttention.

#include <attention/export.h>
#include <attention/multi_head_attention.h>
#include <attention/multi_head_attention_wrapper.h>

#include <torch/nn/modules/activation.h>

namespace attention {

/// The fused module that computes what `wrapper` computes: its heads' matrices stacked into
/// W_query, W_key, W_value, an identity out_proj, causal off. Needs d_out_kq == d_out_v (the
/// fused module has one head size). Throws c10::ValueError otherwise.
///
/// Thread safety: this function, to_torch() and from_torch() only read their argument, so they
/// may run while other threads call its forward, not while one writes it.
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// attention::MultiHeadAttentionWrapper wrapper(/*d_in=*/3, /*d_out_kq=*/2, /*d_out_v=*/2,
///                                              /*num_heads=*/2);
/// attention::MultiHeadAttention fused = attention::to_fused(*wrapper);
/// torch::Tensor x = torch::rand({6, 3});
/// bool same = torch::allclose(fused(x).output, wrapper(x));  // true
/// \endcode
ATTENTION_API MultiHeadAttention to_fused(const MultiHeadAttentionWrapperImpl& wrapper);

/// LibTorch's torch::nn::MultiheadAttention with `mha`'s weights (in_proj_weight is W_query,
/// W_key, W_value stacked; in_proj_bias their biases, or zeros). Needs d_in == d_in_kv == d_out
/// and num_kv_heads == num_heads. LibTorch's module has no causal option: pass the causal mask
/// as its attn_mask when `mha` is causal.
ATTENTION_API torch::nn::MultiheadAttention to_torch(const MultiHeadAttentionImpl& mha);

/// A fused module (causal off, qkv_bias when `torch_mha` has biases) with `torch_mha`'s weights.
/// Needs a module without bias_k/bias_v and with equal query, key and value sizes.
ATTENTION_API MultiHeadAttention from_torch(const torch::nn::MultiheadAttentionImpl& torch_mha);

}  // namespace attention
