#include "kernels/kernels.h"

#include <cmath>
#include <limits>

namespace attention {
namespace kernels {
namespace {

using torch::Tensor;

// Grouped-query attention without copying keys: the G query heads that share one key/value head
// are folded into that head's rows, (..., H, Tq, d) -> (..., Hkv, G * Tq, d).
Tensor fold_groups(const Tensor& t, int64_t kv_heads) {
  auto sizes = t.sizes().vec();
  const int64_t rows = sizes[sizes.size() - 3] / kv_heads * sizes[sizes.size() - 2];
  sizes.erase(sizes.end() - 3, sizes.end() - 1);
  sizes.insert(sizes.end() - 1, {kv_heads, rows});
  return t.reshape(sizes);
}

Tensor unfold_groups(const Tensor& t, int64_t heads) {
  auto sizes = t.sizes().vec();
  const int64_t rows = sizes[sizes.size() - 3] * sizes[sizes.size() - 2] / heads;
  sizes.erase(sizes.end() - 3, sizes.end() - 1);
  sizes.insert(sizes.end() - 1, {heads, rows});
  return t.view(sizes);
}

Tensor softmax_last_dim(const Tensor& scores) {
  // Half and bfloat16 scores are normalised in float32: their sums lose too much otherwise.
  if (scores.scalar_type() == at::kHalf || scores.scalar_type() == at::kBFloat16) {
    return at::softmax(scores, -1, at::kFloat).to(scores.scalar_type());
  }
  return at::softmax(scores, -1);
}

}  // namespace

Tensor causal_mask(int64_t t_q, int64_t t_k, const torch::Device& device) {
  return torch::ones({t_q, t_k}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .triu(t_k - t_q + 1);
}

Tensor dead_rows(const Tensor& hidden, const Tensor& float_mask) {
  Tensor blocked = float_mask.defined() ? float_mask.isneginf() : hidden;
  if (float_mask.defined() && hidden.defined()) blocked = blocked.logical_or(hidden);
  return blocked.defined() ? blocked.all(-1, /*keepdim=*/true) : Tensor();
}

functional::AttentionOutput math(const Tensor& query, const Tensor& key, const Tensor& value,
                                 const functional::ScaledDotProductAttentionOptions& options) {
  const int64_t t_q = query.size(-2), t_k = key.size(-2);
  const bool grouped = query.dim() >= 3 && query.size(-3) != key.size(-3);
  const int64_t heads = grouped ? query.size(-3) : 0, kv_heads = grouped ? key.size(-3) : 0;

  Tensor scores = (grouped ? fold_groups(query, kv_heads) : query).matmul(key.transpose(-2, -1));
  if (grouped) scores = unfold_groups(scores, heads);
  scores = options.scale() ? scores.mul(*options.scale())
                           : scores.div(std::sqrt(static_cast<double>(query.size(-1))));

  const Tensor& mask = options.attn_mask();
  const bool bool_mask = mask.defined() && mask.scalar_type() == at::kBool;
  const bool float_mask = mask.defined() && !bool_mask;
  Tensor hidden;  // bool, true = masked, broadcastable to scores
  if (options.is_causal()) hidden = causal_mask(t_q, t_k, query.device());
  if (bool_mask) hidden = hidden.defined() ? hidden.logical_or(mask) : mask;
  if (hidden.defined()) {
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
  if (float_mask) scores = scores + mask;

  // A query with every key masked would get 0/0 = NaN weights, and NaN gradients for every key.
  // Such rows are computed on zeros (finite everywhere) and then zeroed.
  Tensor dead;
  if (mask.defined() || (options.is_causal() && t_q > t_k)) {
    dead = dead_rows(hidden, float_mask ? mask : Tensor());
    scores = scores.masked_fill(dead, 0.0);
  }
  Tensor weights = softmax_last_dim(scores);
  if (dead.defined()) weights = weights.masked_fill(dead, 0.0);
  if (options.dropout_p() > 0.0) weights = at::dropout(weights, options.dropout_p(), true);

  Tensor output = (grouped ? fold_groups(weights, kv_heads) : weights).matmul(value);
  if (grouped) output = unfold_groups(output, heads);
  return {output, options.need_weights() ? weights : Tensor()};
}

}  // namespace kernels
}  // namespace attention
