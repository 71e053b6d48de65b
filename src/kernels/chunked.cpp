// Memory-efficient attention: queries and keys in blocks with an online softmax (a running
// maximum and a running sum per query), so that no Tq x Tk tensor is ever made. Blocks above the
// causal diagonal are skipped, and the block buffers are allocated once per call and reused:
// large fresh allocations are what makes whole-matrix attention slow on many allocators.
// Backward recomputes the blocks from the saved log-sum-exp, so it stays linear in T as well.

#include "kernels/kernels.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>

namespace attention {
namespace kernels {
namespace {

using torch::Tensor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The shapes of one call. Queries are (N, G, Tq, d): N = leading dims x key/value heads, G query
// heads per key/value head. Keys and values are (N, Tk, d) and (N, Tk, dv).
struct Problem {
  int64_t n, g, t_q, t_k, d, dv, block;
  bool causal;
  std::vector<int64_t> lead;  // (..., H): the leading dims of the scores
  Tensor mask;                // undefined, or expanded to (..., H, Tq, Tk)
};

// A contiguous view of the front of a flat buffer: reused buffers for blocks of any size.
Tensor front(const Tensor& flat, c10::IntArrayRef shape) {
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  return flat.narrow(0, 0, numel).view(shape);
}

// Where causal attention of query block [i0, i0 + bq) ends among the keys.
int64_t keys_end(const Problem& p, int64_t i0, int64_t bq) {
  if (!p.causal) return p.t_k;
  return std::clamp<int64_t>(i0 + bq + (p.t_k - p.t_q), 0, p.t_k);
}

// Applies the causal and the user's mask to a block of scores (N, G * bq, bk) in place.
void mask_block(const Problem& p, Tensor& scores, int64_t i0, int64_t bq, int64_t j0, int64_t bk) {
  const int64_t offset = p.t_k - p.t_q;
  if (p.causal && j0 + bk - 1 > i0 + offset) {
    auto opts = torch::TensorOptions().dtype(torch::kLong).device(scores.device());
    auto hidden = torch::arange(j0, j0 + bk, opts).unsqueeze(0) >
                  torch::arange(i0 + offset, i0 + offset + bq, opts).unsqueeze(1);
    scores.view({p.n, p.g, bq, bk}).masked_fill_(hidden, -kInf);
  }
  if (p.mask.defined()) {
    auto shape = p.lead;
    shape.insert(shape.end(), {bq, bk});
    auto view = scores.view(shape);
    auto block = p.mask.narrow(-2, i0, bq).narrow(-1, j0, bk);
    if (block.scalar_type() == at::kBool) {
      view.masked_fill_(block, -kInf);
    } else {
      view.add_(block);
    }
  }
}

// Forward: the output (N, G, Tq, dv) and the log-sum-exp of every query's scores (N, G, Tq),
// +inf for a query whose keys are all masked (its output is 0).
std::pair<Tensor, Tensor> forward_blocks(const Problem& p, const Tensor& q, const Tensor& k,
                                         const Tensor& v) {
  const auto opts = q.options();
  const int64_t rows = p.g * p.block;
  Tensor out = torch::empty({p.n, p.g, p.t_q, p.dv}, opts);
  Tensor lse = torch::empty({p.n, p.g, p.t_q}, opts);
  Tensor q_buf = torch::empty({p.n * rows * p.d}, opts);
  Tensor s_buf = torch::empty({p.n * rows * p.block}, opts);
  Tensor acc_buf = torch::empty({p.n * rows * p.dv}, opts);
  Tensor m_buf = torch::empty({p.n * rows}, opts), l_buf = torch::empty({p.n * rows}, opts);

  for (int64_t i0 = 0; i0 < p.t_q; i0 += p.block) {
    const int64_t bq = std::min(p.block, p.t_q - i0);
    auto q_blk = front(q_buf, {p.n, p.g, bq, p.d});
    q_blk.copy_(q.narrow(2, i0, bq));
    auto q_rows = q_blk.view({p.n, p.g * bq, p.d});
    auto acc = front(acc_buf, {p.n, p.g * bq, p.dv}).zero_();
    auto m = front(m_buf, {p.n, p.g * bq, 1}).fill_(-kInf);
    auto l = front(l_buf, {p.n, p.g * bq, 1}).zero_();

    const int64_t end = keys_end(p, i0, bq);
    for (int64_t j0 = 0; j0 < end; j0 += p.block) {
      const int64_t bk = std::min(p.block, end - j0);
      auto s = front(s_buf, {p.n, p.g * bq, bk});
      at::bmm_out(s, q_rows, k.narrow(1, j0, bk).transpose(1, 2));
      mask_block(p, s, i0, bq, j0, bk);
      auto m_new = at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
      // Rows with every key masked so far keep a maximum of -inf; subtracting 0 instead keeps
      // their exponentials at 0 rather than NaN.
      auto m_safe = m_new.masked_fill(m_new == -kInf, 0.0);
      s.sub_(m_safe).exp_();
      auto correction = (m - m_safe).exp_();
      l.mul_(correction).add_(s.sum(-1, /*keepdim=*/true));
      acc.mul_(correction).baddbmm_(s, v.narrow(1, j0, bk));
      m.copy_(m_new);
    }
    auto dead = l == 0;
    out.narrow(2, i0, bq).copy_(acc.div(l.masked_fill(dead, 1.0)).view({p.n, p.g, bq, p.dv}));
    auto m_final = m.masked_fill(dead, 0.0);
    lse.narrow(2, i0, bq).copy_(m_final.add(l.log()).masked_fill(dead, kInf).view({p.n, p.g, bq}));
  }
  return {out, lse};
}

// Backward by recomputation: the attention probabilities of each block are rebuilt from the
// log-sum-exp. Returns the gradients of the scaled queries, the keys and the values.
std::tuple<Tensor, Tensor, Tensor> backward_blocks(const Problem& p, const Tensor& q,
                                                   const Tensor& k, const Tensor& v,
                                                   const Tensor& out, const Tensor& lse,
                                                   const Tensor& grad_out) {
  const auto opts = q.options();
  const int64_t rows = p.g * p.block;
  Tensor dq = torch::empty_like(q), dk = torch::zeros_like(k), dv = torch::zeros_like(v);
  Tensor delta = (grad_out * out).sum(-1);  // (N, G, Tq)
  Tensor q_buf = torch::empty({p.n * rows * p.d}, opts);
  Tensor g_buf = torch::empty({p.n * rows * p.dv}, opts);
  Tensor s_buf = torch::empty({p.n * rows * p.block}, opts);
  Tensor dp_buf = torch::empty({p.n * rows * p.block}, opts);
  Tensor dq_buf = torch::empty({p.n * rows * p.d}, opts);

  for (int64_t i0 = 0; i0 < p.t_q; i0 += p.block) {
    const int64_t bq = std::min(p.block, p.t_q - i0);
    auto q_blk = front(q_buf, {p.n, p.g, bq, p.d});
    q_blk.copy_(q.narrow(2, i0, bq));
    auto g_blk = front(g_buf, {p.n, p.g, bq, p.dv});
    g_blk.copy_(grad_out.narrow(2, i0, bq));
    auto q_rows = q_blk.view({p.n, p.g * bq, p.d});
    auto g_rows = g_blk.view({p.n, p.g * bq, p.dv});
    auto lse_blk = lse.narrow(2, i0, bq).reshape({p.n, p.g * bq, 1});
    auto delta_blk = delta.narrow(2, i0, bq).reshape({p.n, p.g * bq, 1});
    auto dq_acc = front(dq_buf, {p.n, p.g * bq, p.d}).zero_();

    const int64_t end = keys_end(p, i0, bq);
    for (int64_t j0 = 0; j0 < end; j0 += p.block) {
      const int64_t bk = std::min(p.block, end - j0);
      auto k_blk = k.narrow(1, j0, bk), v_blk = v.narrow(1, j0, bk);
      auto probs = front(s_buf, {p.n, p.g * bq, bk});
      at::bmm_out(probs, q_rows, k_blk.transpose(1, 2));
      mask_block(p, probs, i0, bq, j0, bk);
      probs.sub_(lse_blk).exp_();
      dv.narrow(1, j0, bk).baddbmm_(probs.transpose(1, 2), g_rows);
      auto ds = front(dp_buf, {p.n, p.g * bq, bk});
      at::bmm_out(ds, g_rows, v_blk.transpose(1, 2));
      ds.sub_(delta_blk).mul_(probs);
      dq_acc.baddbmm_(ds, k_blk);
      dk.narrow(1, j0, bk).baddbmm_(ds.transpose(1, 2), q_rows);
    }
    dq.narrow(2, i0, bq).copy_(dq_acc.view({p.n, p.g, bq, p.d}));
  }
  return {dq, dk, dv};
}

class ChunkedAttention : public torch::autograd::Function<ChunkedAttention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Problem& problem, double scale) {
    auto q_scaled = q.mul(scale).contiguous();
    auto kc = k.contiguous(), vc = v.contiguous();
    auto [out, lse] = forward_blocks(problem, q_scaled, kc, vc);
    ctx->save_for_backward({q_scaled, kc, vc, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mask"] = problem.mask;
    ctx->saved_data["shape"] = std::vector<int64_t>{
        problem.n, problem.g, problem.t_q, problem.t_k, problem.d, problem.dv, problem.block};
    ctx->saved_data["causal"] = problem.causal;
    ctx->saved_data["lead"] = problem.lead;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    Problem p{shape[0],
              shape[1],
              shape[2],
              shape[3],
              shape[4],
              shape[5],
              shape[6],
              ctx->saved_data["causal"].toBool(),
              ctx->saved_data["lead"].toIntVector(),
              ctx->saved_data["mask"].toTensor()};
    auto [dq, dk, dv] =
        backward_blocks(p, saved[0], saved[1], saved[2], saved[3], saved[4], grads[0].contiguous());
    return {dq.mul_(ctx->saved_data["scale"].toDouble()), dk, dv, Tensor(), Tensor()};
  }
};

}  // namespace

functional::AttentionOutput chunked(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const functional::ScaledDotProductAttentionOptions& options,
                                    int64_t block_size) {
  TORCH_CHECK(!options.need_weights() && options.dropout_p() == 0.0,
              "attention::functional::scaled_dot_product_attention: the Chunked backend computes "
              "neither attention weights nor dropout; use Backend::Math (or Auto) for those");
  // Unbatched (T, d) inputs become one head of one batch.
  const bool unbatched = query.dim() == 2;
  const Tensor q = unbatched ? query.unsqueeze(0) : query;
  const Tensor k = unbatched ? key.unsqueeze(0) : key;
  const Tensor v = unbatched ? value.unsqueeze(0) : value;

  Problem p;
  p.t_q = q.size(-2);
  p.t_k = k.size(-2);
  p.d = q.size(-1);
  p.dv = v.size(-1);
  p.g = q.size(-3) / k.size(-3);
  p.n = 1;
  for (int64_t i = 0; i < k.dim() - 2; ++i) p.n *= k.size(i);
  p.block = block_size;
  p.causal = options.is_causal();
  p.lead = q.sizes().slice(0, q.dim() - 2).vec();
  if (options.attn_mask().defined()) {
    auto full = p.lead;
    full.insert(full.end(), {p.t_q, p.t_k});
    p.mask = options.attn_mask().expand(full);
  }
  const double scale =
      options.scale() ? *options.scale() : 1.0 / std::sqrt(static_cast<double>(p.d));
  if (p.n == 0 || p.t_q == 0 || p.t_k == 0) {
    auto shape = q.sizes().vec();
    shape.back() = p.dv;
    auto empty = torch::zeros(shape, v.options());
    return {unbatched ? empty.squeeze(0) : empty, {}};
  }

  auto out =
      ChunkedAttention::apply(q.reshape({p.n, p.g, p.t_q, p.d}), k.reshape({p.n, p.t_k, p.d}),
                              v.reshape({p.n, p.t_k, p.dv}), p, scale);
  auto shape = q.sizes().vec();
  shape.back() = p.dv;
  out = out.view(shape);
  return {unbatched ? out.squeeze(0) : out, {}};
}

}  // namespace kernels
}  // namespace attention
