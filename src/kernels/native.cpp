// LibTorch's own scaled dot-product attention. The one place where the two LibTorch generations
// differ: 2.x has the public at::scaled_dot_product_attention (with a fused CPU flash kernel),
// 1.13 only the private at::_scaled_dot_product_attention (the composite math).

#include "kernels/kernels.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>

namespace attention {
namespace kernels {

functional::AttentionOutput native(const Problem& p, const torch::Tensor& query,
                                   const torch::Tensor& key, const torch::Tensor& value) {
  if (p.packed()) return each_sequence(p, query, key, value, native);
  torch::Tensor k = key, v = value;
  if (p.g != 1) {
    // Grouped-query attention: LibTorch before 2.5 has no enable_gqa.
    k = key.repeat_interleave(p.g, -3);
    v = value.repeat_interleave(p.g, -3);
  }
  // LibTorch aligns a causal mask to the top-left corner and refuses is_causal with an explicit
  // mask: a bottom-right diagonal with Tq != Tk, a window or a mask make the causal mask explicit.
  const bool builtin_causal =
      p.causal && p.query_offset == 0 && !p.bounded_left() && !p.mask.defined();
  torch::Tensor hidden = builtin_causal ? torch::Tensor() : hidden_keys(p);  // true = hidden
  torch::Tensor additive = additive_mask(p);
  // LibTorch gives NaN for a query whose keys are all masked, and NaN gradients to every key in
  // training. Such rows attend to everything here (finite values and gradients) and are zeroed
  // afterwards, which also stops their gradient.
  const torch::Tensor dead = builtin_causal ? torch::Tensor() : rows_without_keys(p);
  if (dead.defined()) {
    if (hidden.defined()) hidden = hidden.logical_and(dead.logical_not());
    if (additive.defined())
      additive = torch::where(dead, torch::zeros({}, additive.options()), additive);
  }
  torch::Tensor native_mask;  // LibTorch's bool convention is the opposite: true = attend
  if (additive.defined()) {
    // where(), not masked_fill: either mask may have the smaller broadcast shape.
    native_mask =
        hidden.defined()
            ? torch::where(hidden, torch::full({}, -INFINITY, additive.options()), additive)
            : additive;
  } else if (hidden.defined()) {
    native_mask = hidden.logical_not();
  }
  // An undefined tensor is not "no mask" to LibTorch: it wants nullopt.
  const c10::optional<torch::Tensor> mask_arg =
      native_mask.defined() ? c10::optional<torch::Tensor>(native_mask) : c10::nullopt;

#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1)
  torch::Tensor out =
      at::scaled_dot_product_attention(query, k, v, mask_arg, p.dropout_p, builtin_causal, p.scale);
#else
  // No scale argument: LibTorch divides by sqrt(d), so the queries are rescaled to match.
  const torch::Tensor q =
      p.scale_is_default ? query : query * (p.scale * std::sqrt(static_cast<double>(p.d)));
#if TORCH_VERSION_MAJOR >= 2
  torch::Tensor out =
      at::scaled_dot_product_attention(q, k, v, mask_arg, p.dropout_p, builtin_causal);
#else
  torch::Tensor out = std::get<0>(at::_scaled_dot_product_attention(
      q, k, v, mask_arg, p.dropout_p, /*need_attn_weights=*/false, builtin_causal));
#endif
#endif
  if (dead.defined()) out = out.masked_fill(dead, 0.0);
  return {out, {}};
}

}  // namespace kernels
}  // namespace attention
