#include <attention/conversions.h>

#include <torch/torch.h>

#include <vector>

namespace attention {

namespace {

void copy_linear(torch::nn::Linear& to, const torch::Tensor& weight, const torch::Tensor& bias) {
  torch::NoGradGuard no_grad;
  to->weight.copy_(weight);
  if (to->bias.defined()) to->bias.copy_(bias.defined() ? bias : torch::zeros_like(to->bias));
}

}  // namespace

MultiHeadAttention to_fused(const MultiHeadAttentionWrapperImpl& wrapper) {
  const auto& o = wrapper.options;
  TORCH_CHECK_VALUE(o.d_out_kq() == o.d_out_v(), "attention::to_fused: expected a wrapper with ",
                    "d_out_kq == d_out_v (one head size), got d_out_kq ", o.d_out_kq(),
                    " and d_out_v ", o.d_out_v());
  MultiHeadAttention fused(
      MultiHeadAttentionOptions(o.d_in(), o.num_heads() * o.d_out_v(), o.num_heads())
          .causal(false));
  const auto reference = wrapper.parameters().front();
  fused->to(reference.device(), reference.scalar_type());
  std::vector<torch::Tensor> q, k, v;
  for (const auto& module : *wrapper.heads) {
    const auto* head = module->as<SelfAttentionImpl>();
    q.push_back(head->W_query.t());
    k.push_back(head->W_key.t());
    v.push_back(head->W_value.t());
  }
  copy_linear(fused->W_query, torch::cat(q), {});
  copy_linear(fused->W_key, torch::cat(k), {});
  copy_linear(fused->W_value, torch::cat(v), {});
  copy_linear(fused->out_proj, torch::eye(fused->options.d_out()), {});
  return fused;
}

torch::nn::MultiheadAttention to_torch(const MultiHeadAttentionImpl& mha) {
  const auto& o = mha.options;
  TORCH_CHECK_VALUE(o.output_projection(), "attention::to_torch: torch::nn::MultiheadAttention ",
                    "has an output projection, and this module was built without one");
  TORCH_CHECK_VALUE(
      o.d_in() == o.d_out() && o.d_in_kv() == o.d_in() && o.num_kv_heads() == o.num_heads(),
      "attention::to_torch: torch::nn::MultiheadAttention needs d_in == d_in_kv == ",
      "d_out and num_kv_heads == num_heads, got d_in ", o.d_in(), ", d_in_kv ", o.d_in_kv(),
      ", d_out ", o.d_out(), ", num_kv_heads ", o.num_kv_heads(), ", num_heads ", o.num_heads());
  // A causal mask or a window, the caller passes to torch's module as a mask; these it cannot take.
  TORCH_CHECK_VALUE(
      !o.rope() && !o.softcap() && !o.alibi() && !o.sinks() && !o.gate() && !o.relative_bias(),
      "attention::to_torch: torch::nn::MultiheadAttention has no rotary embedding, ",
      "soft-capping, ALiBi, sinks, output gate or relative position bias, and this "
      "module uses one of them");
  TORCH_CHECK_VALUE(!o.qk_norm() && !o.value_norm() && !o.scale() &&
                        (o.head_dim() == 0 || o.head_dim() * o.num_heads() == o.d_out()),
                    "attention::to_torch: torch::nn::MultiheadAttention has no QK-norm, value "
                    "norm, scale of its own or head size apart from d_out / num_heads, and this "
                    "module uses one of them");
  torch::nn::MultiheadAttention out(torch::nn::MultiheadAttentionOptions(o.d_out(), o.num_heads())
                                        .dropout(o.dropout())
                                        .bias(true));
  const auto& weight = mha.W_query->weight;
  out->to(weight.device(), weight.scalar_type());
  torch::NoGradGuard no_grad;
  out->in_proj_weight.copy_(
      torch::cat({mha.W_query->weight, mha.W_key->weight, mha.W_value->weight}));
  if (o.qkv_bias()) {
    out->in_proj_bias.copy_(torch::cat({mha.W_query->bias, mha.W_key->bias, mha.W_value->bias}));
  } else {
    out->in_proj_bias.zero_();
  }
  out->out_proj->weight.copy_(mha.out_proj->weight);
  if (o.out_bias()) {
    out->out_proj->bias.copy_(mha.out_proj->bias);
  } else {
    out->out_proj->bias.zero_();
  }
  return out;
}

MultiHeadAttention from_torch(const torch::nn::MultiheadAttentionImpl& torch_mha) {
  const auto& o = torch_mha.options;
  TORCH_CHECK_VALUE(!o.add_bias_kv() && !o.add_zero_attn() && o.kdim() == o.embed_dim() &&
                        o.vdim() == o.embed_dim(),
                    "attention::from_torch: expected a torch::nn::MultiheadAttention without ",
                    "bias_k/bias_v or zero attention and with kdim == vdim == embed_dim");
  const int64_t e = o.embed_dim();
  const bool bias = torch_mha.in_proj_bias.defined();
  MultiHeadAttention fused(MultiHeadAttentionOptions(e, e, o.num_heads())
                               .causal(false)
                               .qkv_bias(bias)
                               .out_bias(torch_mha.out_proj->bias.defined())
                               .dropout(o.dropout()));
  fused->to(torch_mha.in_proj_weight.device(), torch_mha.in_proj_weight.scalar_type());
  const auto w = torch_mha.in_proj_weight.chunk(3);
  const auto b = bias ? torch_mha.in_proj_bias.chunk(3) : std::vector<torch::Tensor>(3);
  copy_linear(fused->W_query, w[0], b[0]);
  copy_linear(fused->W_key, w[1], b[1]);
  copy_linear(fused->W_value, w[2], b[2]);
  copy_linear(fused->out_proj, torch_mha.out_proj->weight, torch_mha.out_proj->bias);
  return fused;
}

}  // namespace attention
