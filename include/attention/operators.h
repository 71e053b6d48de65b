#pragma once

/// \file
/// The library's attention as PyTorch operators of namespace `attention`, for TorchScript,
/// Python (`torch.ops.attention.*`, see python/attention_ops) and torch.compile:
///
/// - `attention::scaled_dot_product_attention(query, key, value, attn_mask=None,
///   is_causal=False, causal_alignment="bottom_right", window_left=None, window_right=None,
///   alibi_slopes=None, softcap=None, sinks=None, scale=None, dropout_p=0.0, backend="auto",
///   block_size=256)`: functional::scaled_dot_product_attention() with those options (the
///   enums as strings: "bottom_right" or "top_left"; "auto", "math", "chunked" or "native").
///   No argument is keyword-only: AOTInductor's proxy executor of LibTorch 2.6 passes only the
///   positional ones' defaults.
/// - `attention::varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k,
///   is_causal=False, ...)`: functional::varlen_attention() with the same options.
/// - `attention::apply_rotary(x, positions, theta=10000.0, rotary_dim=0,
///   layout="half_split")`: functional::apply_rotary() ("half_split" or "interleaved").
///
/// Each has a CPU kernel (the functional layer, with its checks; messages name the operator),
/// a Meta kernel (shapes, for fake tensors), and an Autograd kernel: on the fused CPU route
/// (backend "auto" or "chunked", float, double or bfloat16, no empty input) training records
/// one node whose backward is the fused CPU backward, through the private operators
/// `_fused_attention_forward` and `_fused_attention_backward`; the other routes are
/// differentiated as the C++ API differentiates them. Block masks, score modifications,
/// relative biases, dropout and attention weights are the C++ API's alone.
///
/// libattention_ops registers them when it is loaded; a program that links the library calls
/// register_operators() instead, before it runs a TorchScript module that calls them.

#include <attention/export.h>

namespace attention {

/// Registers the operators of namespace `attention` with LibTorch's dispatcher. Once per
/// process: later calls do nothing. Thread-safe.
///
/// Example:
/// \code
/// attention::register_operators();
/// torch::jit::Module model = torch::jit::load("scripted_model.pt");  // calls the operators
/// torch::Tensor y = model.forward({torch::randn({1, 16, 64})}).toTensor();
/// \endcode
ATTENTION_API void register_operators();

}  // namespace attention
