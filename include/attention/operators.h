#pragma once

/// \file
/// The library's attention as PyTorch operators of namespace `attention`, for TorchScript,
/// Python (`torch.ops.attention.*`, see python/attention_ops) and torch.compile:
///
/// - %attention::scaled_dot_product_attention: functional::scaled_dot_product_attention() with
///   the arguments query, key, value, attn_mask, is_causal, causal_alignment, window_left,
///   window_right, alibi_slopes, softcap, sinks, scale, dropout_p, backend and block_size, the
///   options' names and defaults (None where unset); the enums as strings: "bottom_right" or
///   "top_left", and "auto", "math", "chunked" or "native".
/// - %attention::varlen_attention: functional::varlen_attention() with query, key, value,
///   cu_seqlens_q, cu_seqlens_k, then the same options from is_causal on (no attn_mask).
/// - %attention::apply_rotary: functional::apply_rotary() with x, positions, theta, rotary_dim
///   and layout ("half_split" or "interleaved").
///
/// No argument is keyword-only: AOTInductor's proxy executor of LibTorch 2.6 passes only the
/// positional arguments' defaults.
///
/// Each has a CPU kernel (the functional layer, with its checks; messages name the operator),
/// a Meta kernel (shapes, for fake tensors), and an Autograd kernel: on the fused CPU route
/// (backend "auto" or "chunked", float, double or bfloat16, no empty input) training records
/// one node whose backward is the fused CPU backward, through the private operators
/// `_fused_attention_forward` and `_fused_attention_backward`; the other routes are
/// differentiated as the C++ API differentiates them. Block masks, score modifications,
/// relative biases and attention weights are the C++ API's alone.
///
/// libattention_ops registers them when it is loaded; a program that links the library calls
/// register_operators() instead, before it runs a TorchScript module that calls them.

#include <attention/export.h>

namespace attention {

/// Registers the operators of namespace `attention` with LibTorch's dispatcher. Once per
/// process: later calls do nothing.
///
/// Thread safety: any thread, any number of times; a function-local static registers once (C++
/// initialization of statics is thread-safe). The operators' kernels are the functional layer's.
///
/// Example:
/// \code
/// #include <torch/script.h>
///
/// attention::register_operators();
/// torch::jit::Module model = torch::jit::load("scripted_model.pt");  // calls the operators
/// torch::Tensor y = model.forward({torch::randn({1, 16, 64})}).toTensor();
/// \endcode
ATTENTION_API void register_operators();

}  // namespace attention
