#pragma once

// What the attention operators' schemas carry beside query, key and value, and how it becomes
// the functional layer's options. Every operator kernel (CPU, Meta, Autograd) reads its
// arguments into one Arguments, so that the options are spelled once.

#include <attention/functional.h>

#include <torch/types.h>

#include <c10/util/Optional.h>

#include <initializer_list>
#include <string>
#include <utility>

namespace attention {
namespace operators {

/// The operators' names, for their messages.
constexpr const char* kAttentionOperator = "attention::scaled_dot_product_attention";
constexpr const char* kVarlenOperator = "attention::varlen_attention";

/// The options of scaled_dot_product_attention and varlen_attention as their schemas carry
/// them; `cu_seqlens_q` and `cu_seqlens_k` are set for varlen_attention only.
struct Arguments {
  const char* caller = kAttentionOperator;
  c10::optional<torch::Tensor> cu_seqlens_q, cu_seqlens_k;
  c10::optional<torch::Tensor> attn_mask;
  bool is_causal = false;
  std::string causal_alignment = "bottom_right";
  c10::optional<int64_t> window_left, window_right;
  c10::optional<torch::Tensor> alibi_slopes;
  c10::optional<double> softcap;
  c10::optional<torch::Tensor> sinks;
  c10::optional<double> scale;
  double dropout_p = 0.0;
  std::string backend = "auto";
  int64_t block_size = 256;

  bool packed() const { return cu_seqlens_q.has_value(); }
};

/// The functional layer's options for `args`. Throws c10::ValueError naming the operator for a
/// causal_alignment other than "bottom_right" and "top_left", and a backend other than "auto",
/// "math", "chunked" and "native"; every other value is checked where the functional layer checks
/// it.
functional::ScaledDotProductAttentionOptions to_options(const Arguments& args);

/// Whether a call is differentiated by the fused CPU backward through the operators' own
/// forward and backward (see attention_kernels.cpp), decided from metadata alone, so that
/// torch.compile's fake tensors decide as real ones do: backend auto or chunked, CPU (or meta)
/// tensors of float, double or bfloat16, no empty input (an empty problem is Math's), no
/// dropout, and a mask that needs no gradient (Math differentiates it).
bool takes_fused_route(const Arguments& args, const torch::Tensor& query, const torch::Tensor& key,
                       const torch::Tensor& value);

/// Refuses tensors on different devices before any kernel reads or allocates, as PyTorch's own
/// operators do: with the dispatcher choosing the kernel by the highest device among its tensors
/// (meta above the CPU), a CPU query with a meta key would otherwise reach the Meta kernel and
/// come back as an uninitialized CPU tensor. key, value, attn_mask and sinks must be on the
/// queries' device, the offsets and alibi_slopes there or on the CPU; `more` names further
/// tensors that must be on the queries' device (the fused backward's output, its gradient, the
/// log-sum-exp). Throws c10::Error naming the operator, the tensor and both devices.
void check_devices(const Arguments& args, const torch::Tensor& query, const torch::Tensor& key,
                   const torch::Tensor& value,
                   std::initializer_list<std::pair<const char*, const torch::Tensor*>> more = {});

/// scaled_dot_product_attention() or varlen_attention() as the operator named in `args`: the
/// same validation and kernels, the operator's name in every message.
torch::Tensor attention_of(const Arguments& args, const torch::Tensor& query,
                           const torch::Tensor& key, const torch::Tensor& value);

}  // namespace operators
}  // namespace attention
