#include "operators/arguments.h"

#include "functional/named_entry.h"
#include "operators/symbolic_sizes.h"

namespace attention {
namespace operators {

namespace F = functional;

namespace {

F::CausalAlignment alignment_named(const std::string& name, const char* caller) {
  if (name == "bottom_right") return F::CausalAlignment::BottomRight;
  if (name == "top_left") return F::CausalAlignment::TopLeft;
  TORCH_CHECK_VALUE(false, caller,
                    ": expected causal_alignment 'bottom_right' or 'top_left', got '", name, "'");
}

F::Backend backend_named(const std::string& name, const char* caller) {
  if (name == "auto") return F::Backend::Auto;
  if (name == "math") return F::Backend::Math;
  if (name == "chunked") return F::Backend::Chunked;
  if (name == "native") return F::Backend::Native;
  TORCH_CHECK_VALUE(false, caller,
                    ": expected backend 'auto', 'math', 'chunked' or 'native', got '", name, "'");
}

}  // namespace

F::ScaledDotProductAttentionOptions to_options(const Arguments& args) {
  auto options = F::ScaledDotProductAttentionOptions()
                     .is_causal(args.is_causal)
                     .causal_alignment(alignment_named(args.causal_alignment, args.caller))
                     .window_left(args.window_left)
                     .window_right(args.window_right)
                     .softcap(args.softcap)
                     .scale(args.scale)
                     .dropout_p(args.dropout_p)
                     .backend(backend_named(args.backend, args.caller))
                     .block_size(args.block_size);
  if (args.attn_mask) options.attn_mask(*args.attn_mask);
  if (args.alibi_slopes) options.alibi_slopes(*args.alibi_slopes);
  if (args.sinks) options.sinks(*args.sinks);
  return options;
}

bool takes_fused_route(const Arguments& args, const torch::Tensor& query, const torch::Tensor& key,
                       const torch::Tensor& value) {
  const auto dtype = query.scalar_type();
  const bool kernel_dtype = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16;
  const bool host = query.device().is_cpu() || query.device().is_meta();
  const bool mask_gradient = args.attn_mask && args.attn_mask->requires_grad();
  return (args.backend == "auto" || args.backend == "chunked") && kernel_dtype && host &&
         has_elements(query) && has_elements(key) && has_elements(value) && args.dropout_p == 0.0 &&
         !mask_gradient;
}

void check_devices(const Arguments& args, const torch::Tensor& query, const torch::Tensor& key,
                   const torch::Tensor& value,
                   std::initializer_list<std::pair<const char*, const torch::Tensor*>> more) {
  const auto device = query.device();
  const auto on_device = [&](const char* name, const torch::Tensor& t) {
    TORCH_CHECK(t.device() == device, args.caller, ": expected ", name, " on the queries' device (",
                device, "), got ", t.device());
  };
  const auto here_or_cpu = [&](const char* name, const c10::optional<torch::Tensor>& t) {
    TORCH_CHECK(!t || t->device() == device || t->device().is_cpu(), args.caller, ": expected ",
                name, " on the queries' device (", device, ") or the CPU, got ", t->device());
  };
  on_device("key", key);
  on_device("value", value);
  if (args.attn_mask) on_device("attn_mask", *args.attn_mask);
  if (args.sinks) on_device("sinks", *args.sinks);
  for (const auto& [name, tensor] : more) on_device(name, *tensor);
  here_or_cpu("cu_seqlens_q", args.cu_seqlens_q);
  here_or_cpu("cu_seqlens_k", args.cu_seqlens_k);
  here_or_cpu("alibi_slopes", args.alibi_slopes);
}

torch::Tensor attention_of(const Arguments& args, const torch::Tensor& query,
                           const torch::Tensor& key, const torch::Tensor& value) {
  const auto options = to_options(args);
  if (args.packed()) {
    return F::varlen_attention_named(query, key, value, *args.cu_seqlens_q, *args.cu_seqlens_k,
                                     options, args.caller);
  }
  return F::scaled_dot_product_attention_named(query, key, value, options, args.caller).output;
}

}  // namespace operators
}  // namespace attention
