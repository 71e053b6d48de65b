#pragma once

// The kernels behind the operators of namespace `attention` (registration.cpp gives their
// schemas): for each public operator a CPU kernel (the functional layer), a Meta kernel (shapes
// alone, for torch.compile's fake tensors and torch.export) and an Autograd kernel; and the two
// private operators through which the Autograd kernel's record runs the fused CPU forward and
// backward, so that a traced graph holds them as operators rather than LibTorch's ops.

#include <torch/types.h>

#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>

namespace attention {
namespace operators {

using OptionalTensor = c10::optional<torch::Tensor>;

/// attention::scaled_dot_product_attention on each dispatch key.
torch::Tensor attention_cpu(const torch::Tensor& query, const torch::Tensor& key,
                            const torch::Tensor& value, const OptionalTensor& attn_mask,
                            bool is_causal, c10::string_view causal_alignment,
                            c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
                            const OptionalTensor& alibi_slopes, c10::optional<double> softcap,
                            const OptionalTensor& sinks, c10::optional<double> scale,
                            double dropout_p, c10::string_view backend, int64_t block_size);
torch::Tensor attention_meta(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value, const OptionalTensor& attn_mask,
                             bool is_causal, c10::string_view causal_alignment,
                             c10::optional<int64_t> window_left,
                             c10::optional<int64_t> window_right,
                             const OptionalTensor& alibi_slopes, c10::optional<double> softcap,
                             const OptionalTensor& sinks, c10::optional<double> scale,
                             double dropout_p, c10::string_view backend, int64_t block_size);
torch::Tensor attention_autograd(const torch::Tensor& query, const torch::Tensor& key,
                                 const torch::Tensor& value, const OptionalTensor& attn_mask,
                                 bool is_causal, c10::string_view causal_alignment,
                                 c10::optional<int64_t> window_left,
                                 c10::optional<int64_t> window_right,
                                 const OptionalTensor& alibi_slopes, c10::optional<double> softcap,
                                 const OptionalTensor& sinks, c10::optional<double> scale,
                                 double dropout_p, c10::string_view backend, int64_t block_size);

/// attention::varlen_attention on each dispatch key.
torch::Tensor varlen_cpu(const torch::Tensor& query, const torch::Tensor& key,
                         const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                         const torch::Tensor& cu_seqlens_k, bool is_causal,
                         c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                         c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                         c10::optional<double> softcap, const OptionalTensor& sinks,
                         c10::optional<double> scale, double dropout_p, c10::string_view backend,
                         int64_t block_size);
torch::Tensor varlen_meta(const torch::Tensor& query, const torch::Tensor& key,
                          const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                          const torch::Tensor& cu_seqlens_k, bool is_causal,
                          c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                          c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                          c10::optional<double> softcap, const OptionalTensor& sinks,
                          c10::optional<double> scale, double dropout_p, c10::string_view backend,
                          int64_t block_size);
torch::Tensor varlen_autograd(const torch::Tensor& query, const torch::Tensor& key,
                              const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                              const torch::Tensor& cu_seqlens_k, bool is_causal,
                              c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                              c10::optional<int64_t> window_right,
                              const OptionalTensor& alibi_slopes, c10::optional<double> softcap,
                              const OptionalTensor& sinks, c10::optional<double> scale,
                              double dropout_p, c10::string_view backend, int64_t block_size);

/// attention::_fused_attention_forward: the output and every query's log-sum-exp (the query's
/// shape without its features; (H, total_q) for packed sequences; float, double for double
/// inputs), on the fused CPU kernels.
std::tuple<torch::Tensor, torch::Tensor> fused_forward_cpu(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
    const OptionalTensor& attn_mask, bool is_causal, c10::string_view causal_alignment,
    c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
    const OptionalTensor& alibi_slopes, c10::optional<double> softcap, const OptionalTensor& sinks,
    c10::optional<double> scale, int64_t block_size);
std::tuple<torch::Tensor, torch::Tensor> fused_forward_meta(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
    const OptionalTensor& attn_mask, bool is_causal, c10::string_view causal_alignment,
    c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
    const OptionalTensor& alibi_slopes, c10::optional<double> softcap, const OptionalTensor& sinks,
    c10::optional<double> scale, int64_t block_size);

/// attention::_fused_attention_backward: the gradients of query, key, value and sinks (empty
/// (0,) without sinks), on the fused CPU kernels.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> fused_backward_cpu(
    const torch::Tensor& grad_out, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
    const OptionalTensor& attn_mask, bool is_causal, c10::string_view causal_alignment,
    c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
    const OptionalTensor& alibi_slopes, c10::optional<double> softcap, const OptionalTensor& sinks,
    c10::optional<double> scale, int64_t block_size);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> fused_backward_meta(
    const torch::Tensor& grad_out, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
    const OptionalTensor& attn_mask, bool is_causal, c10::string_view causal_alignment,
    c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
    const OptionalTensor& alibi_slopes, c10::optional<double> softcap, const OptionalTensor& sinks,
    c10::optional<double> scale, int64_t block_size);

/// attention::apply_rotary: functional::apply_rotary, composite (LibTorch's ops differentiate
/// and trace it).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta,
                           int64_t rotary_dim, c10::string_view layout);

}  // namespace operators
}  // namespace attention
