#include "checks.h"
#include "kernels/kernels.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

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

// The score modification of each query matrix of `scores` (..., Tq, Tk), written over `out` (a
// tensor of the same shape, contiguous): the function, or with `grad` its derivative. `sequence`:
// the packed sequence these scores are of (the tiles' batch), or -1.
void each_matrix(const ScoreMod& mod, int64_t heads, int64_t query_offset, int64_t sequence,
                 const char* caller, const Tensor& scores, const Tensor& out,
                 const Tensor& grad = {}) {
  if (scores.numel() == 0) return;  // no tile to ask about
  const int64_t t_q = scores.size(-2), t_k = scores.size(-1);
  const auto matrices = scores.reshape({-1, t_q, t_k});
  const auto written = out.view({-1, t_q, t_k});
  for (int64_t m = 0; m < matrices.size(0); ++m) {
    const ScoreTile tile{sequence >= 0 ? sequence : m / heads, m % heads, 0, 0, query_offset};
    if (grad.defined()) {
      mod.apply_derivative(matrices[m], written[m], tile, caller);
    } else {
      mod.apply(written[m], tile, caller);
    }
  }
}

// What the autograd record of a score modification keeps for its backward.
struct SavedScoreMod : torch::CustomClassHolder {
  SavedScoreMod(ScoreMod m, int64_t h, int64_t offset, int64_t s, std::string name)
      : mod(std::move(m)), heads(h), query_offset(offset), sequence(s), caller(std::move(name)) {}
  ScoreMod mod;
  int64_t heads, query_offset, sequence;
  std::string caller;
};

// A score modification as an autograd function: its backward is the user's derivative.
class ModifiedScores : public torch::autograd::Function<ModifiedScores> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& scores,
                        const Problem& p) {
    Tensor out = scores.clone(at::MemoryFormat::Contiguous);
    each_matrix(*p.score_mod, p.heads, p.query_offset, p.sequence_index, p.caller, scores, out);
    ctx->save_for_backward({scores});
    ctx->saved_data["score_mod"] = c10::IValue::make_capsule(c10::make_intrusive<SavedScoreMod>(
        *p.score_mod, p.heads, p.query_offset, p.sequence_index, p.caller));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved =
        c10::static_intrusive_pointer_cast<SavedScoreMod>(ctx->saved_data["score_mod"].toCapsule());
    const Tensor scores = ctx->get_saved_variables()[0];
    Tensor grad = grads[0].clone(at::MemoryFormat::Contiguous);
    each_matrix(saved->mod, saved->heads, saved->query_offset, saved->sequence,
                saved->caller.c_str(), scores, grad, grad);
    return {grad, Tensor()};
  }
};

// The scores after the problem's score modification; recorded by autograd when they need a
// gradient (make_problem refused a modification without a derivative then).
Tensor modified(const Problem& p, const Tensor& scores) {
  if (detail::records_grad(scores)) return ModifiedScores::apply(scores, p);
  Tensor out = scores.clone(at::MemoryFormat::Contiguous);
  each_matrix(*p.score_mod, p.heads, p.query_offset, p.sequence_index, p.caller, scores, out);
  return out;
}

}  // namespace

functional::AttentionOutput math(const Problem& p, const Tensor& query, const Tensor& key,
                                 const Tensor& value) {
  if (p.packed()) return each_sequence(p, query, key, value, math);
  const bool grouped = p.g != 1;
  Tensor scores = (grouped ? fold_groups(query, p.kv_heads) : query).matmul(key.transpose(-2, -1));
  if (grouped) scores = unfold_groups(scores, p.heads);
  // The default scale divides by sqrt(d), as the article writes it (bit for bit with Python).
  scores = p.scale_is_default && p.d > 0 ? scores.div(std::sqrt(static_cast<double>(p.d)))
                                         : scores.mul(p.scale);

  // Soft-capping, ALiBi and a score modification change the scaled scores before any mask is
  // added.
  if (p.softcap > 0.0) scores = scores.div(p.softcap).tanh().mul(p.softcap);
  if (!p.alibi.empty()) scores = scores + alibi_bias(p, scores.options());
  // The user's score modification last, so that no mask reaches it.
  if (p.score_mod) scores = modified(p, scores);

  // The additive mask first, then the hidden keys: a hidden key stays hidden whatever the float
  // mask holds there (NaN, +inf), as in the blockwise backends, which never read it.
  const Tensor hidden = hidden_keys(p), additive = additive_mask(p);
  if (additive.defined()) scores = scores + additive;
  if (hidden.defined()) {
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }

  Tensor weights;
  if (p.sinks.defined()) {
    // Each head's sink logit is one more column of the softmax, then dropped: it takes its share
    // of the normalizer and adds no value. A query that sees no key gives it all.
    auto shape = scores.sizes().vec();
    shape.back() = 1;
    const auto column = p.sinks.view({-1, 1, 1}).expand({p.heads, p.t_q, 1});
    const auto extended =
        torch::cat({scores, (p.lead.empty() ? column[0] : column).expand(shape)}, -1);
    weights = softmax_last_dim(extended).narrow(-1, 0, p.t_k);
  } else {
    // A query whose scores are all -inf (every key hidden) would get 0/0 = NaN weights, and NaN
    // gradients for every key. Such rows are computed on zeros (finite everywhere) and then
    // zeroed, as the blockwise backends' online softmax does.
    const Tensor dead = scores.isneginf().all(-1, /*keepdim=*/true);
    weights = softmax_last_dim(scores.masked_fill(dead, 0.0)).masked_fill(dead, 0.0);
  }
  if (p.dropout_p > 0.0) weights = at::dropout(weights, p.dropout_p, true);

  Tensor output = (grouped ? fold_groups(weights, p.kv_heads) : weights).matmul(value);
  if (grouped) output = unfold_groups(output, p.heads);
  return {output, p.need_weights ? weights : Tensor()};
}

functional::AttentionOutput math_in_float(const Problem& p, const Tensor& query, const Tensor& key,
                                          const Tensor& value) {
  const auto widened = [](const Tensor& t) {
    return t.defined() && t.is_floating_point() ? t.to(at::kFloat) : t;
  };
  Problem in_float = p;
  in_float.mask = widened(p.mask);
  in_float.sinks = widened(p.sinks);
  const auto result = math(in_float, widened(query), widened(key), widened(value));
  const auto rounded = [&](const Tensor& t) { return t.defined() ? t.to(query.scalar_type()) : t; };
  return {rounded(result.output), rounded(result.weights)};
}

}  // namespace kernels
}  // namespace attention
