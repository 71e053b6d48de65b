// LibTorch's own scaled dot-product attention. The one place where the two LibTorch generations
// differ: 2.x has the public at::scaled_dot_product_attention (with a fused CPU flash kernel),
// 1.13 only the private at::_scaled_dot_product_attention (the composite math).

#include "kernels/kernels.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>

namespace attention {
namespace kernels {

bool native_is_fused() {
  return TORCH_VERSION_MAJOR >= 2;
}

functional::AttentionOutput native(const torch::Tensor& query, const torch::Tensor& key,
                                   const torch::Tensor& value,
                                   const functional::ScaledDotProductAttentionOptions& options) {
  TORCH_CHECK(!options.need_weights(),
              "attention::functional::scaled_dot_product_attention: the Native backend returns no "
              "attention weights; use Backend::Math (or Auto) for them");
  const int64_t t_q = query.size(-2), t_k = key.size(-2);
  torch::Tensor k = key, v = value;
  if (query.dim() >= 3 && query.size(-3) != key.size(-3)) {
    // Grouped-query attention: LibTorch before 2.5 has no enable_gqa.
    const int64_t group = query.size(-3) / key.size(-3);
    k = key.repeat_interleave(group, -3);
    v = value.repeat_interleave(group, -3);
  }
  // LibTorch aligns a causal mask to the top-left corner (here the queries are the last Tq
  // positions) and refuses is_causal with an explicit mask: in both cases the causal mask is made
  // explicit.
  const auto& mask = options.attn_mask();
  const bool builtin_causal = options.is_causal() && t_q == t_k && !mask.defined();
  torch::Tensor hidden;  // true = masked (this library's convention)
  if (options.is_causal() && !builtin_causal) hidden = causal_mask(t_q, t_k, query.device());
  const bool float_mask = mask.defined() && mask.scalar_type() != at::kBool;
  if (mask.defined() && !float_mask) hidden = hidden.defined() ? hidden.logical_or(mask) : mask;
  torch::Tensor native_mask;  // LibTorch's bool convention is the opposite: true = attend
  if (float_mask) {
    native_mask = hidden.defined() ? mask.masked_fill(hidden, -INFINITY) : mask;
  } else if (hidden.defined()) {
    native_mask = hidden.logical_not();
  }
  // An undefined tensor is not "no mask" to LibTorch: it wants nullopt.
  const c10::optional<torch::Tensor> mask_arg =
      native_mask.defined() ? c10::optional<torch::Tensor>(native_mask) : c10::nullopt;
  const double scale =
      options.scale() ? *options.scale() : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));

#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1)
  torch::Tensor out = at::scaled_dot_product_attention(query, k, v, mask_arg, options.dropout_p(),
                                                       builtin_causal, scale);
#else
  // No scale argument: LibTorch divides by sqrt(d), so the queries are rescaled to match.
  const torch::Tensor q =
      options.scale() ? query * (scale * std::sqrt(static_cast<double>(query.size(-1)))) : query;
#if TORCH_VERSION_MAJOR >= 2
  torch::Tensor out =
      at::scaled_dot_product_attention(q, k, v, mask_arg, options.dropout_p(), builtin_causal);
#else
  torch::Tensor out = std::get<0>(at::_scaled_dot_product_attention(
      q, k, v, mask_arg, options.dropout_p(), /*need_attn_weights=*/false, builtin_causal));
#endif
#endif
  // LibTorch gives NaN for a query whose keys are all masked; this library gives zeros.
  if (mask.defined() || (options.is_causal() && t_q > t_k)) {
    out = out.masked_fill(dead_rows(hidden, float_mask ? mask : torch::Tensor()), 0.0);
  }
  return {out, {}};
}

}  // namespace kernels
}  // namespace attention
