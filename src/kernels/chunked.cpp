// Memory-efficient attention: queries and keys in blocks with an online softmax (a running
// maximum and a running sum per query), so that no Tq x Tk tensor is ever made. Blocks above the
// causal diagonal are skipped, and the block buffers are allocated once per call and reused:
// large fresh allocations are what makes whole-matrix attention slow on many allocators.
// Backward recomputes the blocks from the saved log-sum-exp, so it stays linear in T as well. On
// the CPU, float, double and bfloat16 take the fused kernels of kernels/cpu/forward.cpp and
// kernels/cpu/backward.cpp instead; the tiles here serve every other device and dtype.

#include "kernels/chunked.h"

#include "checks.h"
#include "kernels/kernels.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

namespace attention {
namespace kernels {
namespace {

using torch::Tensor;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A contiguous view of the front of a flat buffer: reused buffers for blocks of any size.
Tensor front(const Tensor& flat, c10::IntArrayRef shape) {
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  return flat.narrow(0, 0, numel).view(shape);
}

// The user's mask of each query head of key/value head n, (Tq, Tk) views; empty without a mask.
// Query head g of n is head n * G + g of the flattened leading dims (..., H).
std::vector<Tensor> head_masks(const Problem& p, int64_t n) {
  std::vector<Tensor> masks;
  if (!p.mask.defined()) return masks;
  for (int64_t g = 0; g < p.g; ++g) {
    int64_t flat = n * p.g + g;
    Tensor m = p.mask;
    std::vector<int64_t> index(p.lead.size());
    for (int64_t dim = static_cast<int64_t>(p.lead.size()) - 1; dim >= 0; --dim) {
      index[dim] = flat % p.lead[dim];
      flat /= p.lead[dim];
    }
    for (size_t dim = 0; dim < index.size(); ++dim) m = m.select(0, index[dim]);
    masks.push_back(m);
  }
  return masks;
}

// Soft-capping of a tile of scaled scores, in place. Returns 1 - tanh^2, the derivative of the
// capped scores, when `derivative` (for the backward); undefined otherwise or without capping.
Tensor cap_tile(const Problem& p, Tensor& scores, bool derivative) {
  if (p.softcap <= 0.0) return {};
  scores.div_(p.softcap).tanh_();
  Tensor slope = derivative ? 1 - scores.square() : Tensor();
  scores.mul_(p.softcap);
  return slope;
}

// Applies ALiBi, the user's mask, causality and the window to a tile of scores (nc, G * bq, bk)
// of key/value heads [n0, n0 + nc) in place; `masks` holds the user's masks of those heads, G
// each. The hidden keys come last, so that what a float mask holds at a hidden position (NaN,
// +inf) stays hidden, as in every backend.
void mask_tile(const Problem& p, int64_t n0, const std::vector<Tensor>& masks, Tensor& scores,
               int64_t i0, int64_t bq, int64_t j0, int64_t bk) {
  auto by_head = scores.view({-1, bq, bk});
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(scores.device());
  // The tile's query indices (a column) and keys (a row).
  const auto queries = torch::arange(i0, i0 + bq, opts).unsqueeze(1);
  const auto keys = torch::arange(j0, j0 + bk, opts).unsqueeze(0);
  if (!p.alibi.empty()) {
    const auto distance = (queries + p.query_offset - keys).abs_().to(scores.dtype());
    for (int64_t g = 0; g < by_head.size(0); ++g) {
      by_head[g].sub_(distance * p.alibi[(n0 * p.g + g) % p.heads]);
    }
  }
  for (int64_t g = 0; g < static_cast<int64_t>(masks.size()); ++g) {
    auto tile = masks[g].narrow(0, i0, bq).narrow(1, j0, bk);
    if (tile.scalar_type() == at::kBool) {
      by_head[g].masked_fill_(tile, -kInf);
    } else {
      by_head[g].add_(tile);
    }
  }
  // Query i hides keys j > i + diagonal() and j < i + left_diagonal().
  if (p.bounded_right() && j0 + bk - 1 > i0 + p.diagonal()) {
    by_head.masked_fill_(keys > queries + p.diagonal(), -kInf);
  }
  if (p.bounded_left() && j0 < i0 + bq - 1 + p.left_diagonal()) {
    by_head.masked_fill_(keys < queries + p.left_diagonal(), -kInf);
  }
}

// The user's masks of key/value heads [n0, n0 + nc), G each.
std::vector<Tensor> chunk_masks(const Problem& p, int64_t n0, int64_t nc) {
  std::vector<Tensor> masks;
  for (int64_t n = n0; n < n0 + nc; ++n) {
    auto m = head_masks(p, n);
    masks.insert(masks.end(), m.begin(), m.end());
  }
  return masks;
}

// Work buffers, allocated once per call and reused for every tile of nc key/value heads.
struct Buffers {
  Tensor q, s, acc, m, m_new, l, row;
  Buffers(const Problem& p, const torch::TensorOptions& opts, int64_t width, int64_t nc) {
    const int64_t rows = nc * p.g * p.block;
    q = torch::empty({rows * p.d}, opts);
    s = torch::empty({rows * p.block}, opts);
    acc = torch::empty({rows * width}, opts);
    m = torch::empty({rows}, opts);
    m_new = torch::empty({rows}, opts);
    l = torch::empty({rows}, opts);
    row = torch::empty({rows}, opts);
  }
};

// Forward of one query block of key/value heads [n0, n0 + nc): writes its output and log-sum-exp
// (+inf for a query whose keys are all masked; its output is 0).
void forward_tile(const Problem& p, int64_t n0, int64_t nc, int64_t i0,
                  const std::vector<Tensor>& masks, const Tensor& q, const Tensor& k,
                  const Tensor& v, Tensor& out, Tensor& lse, Buffers& b) {
  const int64_t bq = std::min(p.block, p.t_q - i0), rows = p.g * bq;
  auto q_blk = front(b.q, {nc, p.g, bq, p.d});
  q_blk.copy_(q.narrow(0, n0, nc).narrow(2, i0, bq));
  auto q_rows = q_blk.view({nc, rows, p.d});
  auto acc = front(b.acc, {nc, rows, p.dv}).zero_();
  auto m = front(b.m, {nc, rows, 1}).fill_(-kInf);
  auto m_new = front(b.m_new, {nc, rows, 1});
  auto l = front(b.l, {nc, rows, 1}).zero_();
  auto row = front(b.row, {nc, rows, 1});
  const auto k_n = k.narrow(0, n0, nc), v_n = v.narrow(0, n0, nc);

  const int64_t end = keys_end(p, i0, bq);
  for (int64_t j0 = keys_begin(p, i0); j0 < end; j0 += p.block) {
    const int64_t bk = std::min(p.block, end - j0);
    auto s = front(b.s, {nc, rows, bk});
    at::bmm_out(s, q_rows, k_n.narrow(1, j0, bk).transpose(1, 2));
    cap_tile(p, s, false);
    mask_tile(p, n0, masks, s, i0, bq, j0, bk);
    at::amax_out(row, s, {-1}, /*keepdim=*/true);
    at::maximum_out(m_new, m, row);
    // Rows with every key masked so far keep a maximum of -inf; subtracting 0 instead keeps
    // their exponentials at 0 rather than NaN. `row` becomes that safe maximum.
    row.copy_(m_new).masked_fill_(m_new == -kInf, 0.0);
    s.sub_(row).exp_();
    m.sub_(row).exp_();  // the correction of everything accumulated so far
    l.mul_(m).add_(s.sum(-1, /*keepdim=*/true));
    acc.mul_(m).baddbmm_(s, v_n.narrow(1, j0, bk));
    m.copy_(m_new);
  }
  auto dead = l == 0;
  out.narrow(0, n0, nc).narrow(2, i0, bq).copy_(
      acc.div_(l.masked_fill(dead, 1.0)).view({nc, p.g, bq, p.dv}));
  lse.narrow(0, n0, nc).narrow(2, i0, bq).copy_(
      m.masked_fill_(dead, 0.0).add_(l.log()).masked_fill_(dead, kInf).view({nc, p.g, bq}));
}

// How many key/value heads a tile holds: enough for the batched products and LibTorch's
// two-thread element-wise ops to pay off, few enough for a tile of scores to stay near the
// cores (about 2 MiB; measured best at B=8, H=12, T=1024, d=64 with 256-token blocks).
int64_t heads_per_tile(const Problem& p) {
  const int64_t tile = p.g * p.block * p.block * 4;
  return std::clamp<int64_t>((int64_t{2} << 20) / tile, 1, p.n);
}

// Forward: the output (N, G, Tq, dv) and the log-sum-exp of every query's scores (N, G, Tq).
std::pair<Tensor, Tensor> forward_blocks(const Problem& p, const Tensor& q, const Tensor& k,
                                         const Tensor& v) {
  Tensor out = torch::empty({p.n, p.g, p.t_q, p.dv}, q.options());
  Tensor lse = torch::empty({p.n, p.g, p.t_q}, q.options());
  const int64_t nc = heads_per_tile(p);
  Buffers buffers(p, q.options(), p.dv, nc);
  for (int64_t n0 = 0; n0 < p.n; n0 += nc) {
    const int64_t count = std::min(nc, p.n - n0);
    const auto masks = chunk_masks(p, n0, count);
    for (int64_t i0 = 0; i0 < p.t_q; i0 += p.block) {
      forward_tile(p, n0, count, i0, masks, q, k, v, out, lse, buffers);
    }
  }
  return {out, lse};
}

// Backward by recomputation: the attention probabilities of each tile are rebuilt from the
// log-sum-exp. Returns the gradients of the scaled queries, the keys and the values.
std::tuple<Tensor, Tensor, Tensor> backward_blocks(const Problem& p, const Tensor& q,
                                                   const Tensor& k, const Tensor& v,
                                                   const Tensor& out, const Tensor& lse,
                                                   const Tensor& grad_out) {
  Tensor dq = torch::empty_like(q), dk = torch::zeros_like(k), dv = torch::zeros_like(v);
  Tensor delta = (grad_out * out).sum(-1);  // (N, G, Tq)
  const int64_t nc = heads_per_tile(p);
  Buffers b(p, q.options(), p.d, nc);
  Tensor g_buf = torch::empty({nc * p.g * p.block * p.dv}, q.options());
  Tensor ds_buf = torch::empty({nc * p.g * p.block * p.block}, q.options());
  for (int64_t n0 = 0; n0 < p.n; n0 += nc) {
    const int64_t count = std::min(nc, p.n - n0);
    const auto masks = chunk_masks(p, n0, count);
    const auto k_n = k.narrow(0, n0, count), v_n = v.narrow(0, n0, count);
    const auto dk_n = dk.narrow(0, n0, count), dv_n = dv.narrow(0, n0, count);
    for (int64_t i0 = 0; i0 < p.t_q; i0 += p.block) {
      const int64_t bq = std::min(p.block, p.t_q - i0), rows = p.g * bq;
      auto q_blk = front(b.q, {count, p.g, bq, p.d});
      q_blk.copy_(q.narrow(0, n0, count).narrow(2, i0, bq));
      auto g_blk = front(g_buf, {count, p.g, bq, p.dv});
      g_blk.copy_(grad_out.narrow(0, n0, count).narrow(2, i0, bq));
      auto q_rows = q_blk.view({count, rows, p.d}), g_rows = g_blk.view({count, rows, p.dv});
      auto lse_blk = lse.narrow(0, n0, count).narrow(2, i0, bq).reshape({count, rows, 1});
      auto delta_blk = delta.narrow(0, n0, count).narrow(2, i0, bq).reshape({count, rows, 1});
      auto dq_acc = front(b.acc, {count, rows, p.d}).zero_();
      const int64_t end_k = keys_end(p, i0, bq);
      for (int64_t j0 = keys_begin(p, i0); j0 < end_k; j0 += p.block) {
        const int64_t bk = std::min(p.block, end_k - j0);
        auto k_blk = k_n.narrow(1, j0, bk), v_blk = v_n.narrow(1, j0, bk);
        auto probs = front(b.s, {count, rows, bk});
        at::bmm_out(probs, q_rows, k_blk.transpose(1, 2));
        const Tensor cap_slope = cap_tile(p, probs, true);
        mask_tile(p, n0, masks, probs, i0, bq, j0, bk);
        // A hidden key gets probability and score gradient 0 even in a row whose log-sum-exp
        // and delta are NaN (a NaN score it sees): exp(-inf - NaN) and 0 * NaN would spread
        // that NaN to the gradients of keys the row never saw, as Math's masked_fill does not.
        const auto hidden = probs.isneginf();
        probs.sub_(lse_blk).exp_().masked_fill_(hidden, 0.0);
        dv_n.narrow(1, j0, bk).baddbmm_(probs.transpose(1, 2), g_rows);
        auto ds = front(ds_buf, {count, rows, bk});
        at::bmm_out(ds, g_rows, v_blk.transpose(1, 2));
        ds.sub_(delta_blk).mul_(probs).masked_fill_(hidden, 0.0);  // delta is NaN there too
        if (cap_slope.defined()) ds.mul_(cap_slope);  // through softcap * tanh(s / softcap)
        dq_acc.baddbmm_(ds, k_blk);
        dk_n.narrow(1, j0, bk).baddbmm_(ds.transpose(1, 2), q_rows);
      }
      dq.narrow(0, n0, count).narrow(2, i0, bq).copy_(dq_acc.view({count, p.g, bq, p.d}));
    }
  }
  return {dq, dk, dv};
}

Tensor flat_queries(const Problem& p, const Tensor& q) {
  return q.mul(p.scale).reshape({p.n, p.g, p.t_q, p.d}).contiguous();
}

Tensor flat_keys(const Problem& p, const Tensor& t) {
  return t.reshape({p.n, p.t_k, t.size(-1)}).contiguous();
}

}  // namespace

std::pair<Tensor, Tensor> tiles_forward_with_lse(const Problem& p, const Tensor& q, const Tensor& k,
                                                 const Tensor& v) {
  TORCH_INTERNAL_ASSERT(!p.block_mask && !p.relative_bias.defined(),
                        "the tiles read a block mask and a relative bias only as dense masks");
  auto [out, lse] = forward_blocks(p, flat_queries(p, q), flat_keys(p, k), flat_keys(p, v));
  auto shape = q.sizes().vec();
  shape.back() = p.dv;
  return {out.view(shape), lse};
}

std::pair<Tensor, Tensor> forward_with_lse(const Problem& p, const Tensor& q, const Tensor& k,
                                           const Tensor& v) {
  if (fused_cpu_applies(q)) return cpu_forward(p, q, k, v);
  return tiles_forward_with_lse(p, q, k, v);
}

std::tuple<Tensor, Tensor, Tensor> tiles_backward_with_lse(const Problem& p, const Tensor& q,
                                                           const Tensor& k, const Tensor& v,
                                                           const Tensor& out, const Tensor& lse,
                                                           const Tensor& grad_out) {
  TORCH_INTERNAL_ASSERT(!p.block_mask && !p.relative_bias.defined(),
                        "the tiles read a block mask and a relative bias only as dense masks");
  const auto flat_out = [&](const Tensor& t) {
    return t.reshape({p.n, p.g, p.t_q, p.dv}).contiguous();
  };
  auto [dq, dk, dv] = backward_blocks(p, flat_queries(p, q), flat_keys(p, k), flat_keys(p, v),
                                      flat_out(out), lse, flat_out(grad_out));
  return {dq.mul_(p.scale).view(q.sizes()), dk.view(k.sizes()), dv.view(v.sizes())};
}

std::tuple<Tensor, Tensor, Tensor> backward_with_lse(const Problem& p, const Tensor& q,
                                                     const Tensor& k, const Tensor& v,
                                                     const Tensor& out, const Tensor& lse,
                                                     const Tensor& grad_out) {
  if (fused_cpu_applies(q)) return cpu_backward(p, q, k, v, out, lse, grad_out);
  return tiles_backward_with_lse(p, q, k, v, out, lse, grad_out);
}

namespace {

// The query head of each flattened query matrix (N * G,): the heads are the last leading dim.
Tensor head_of_matrices(const Problem& p, const at::Device& device) {
  return torch::arange(p.n * p.g, torch::TensorOptions().dtype(torch::kLong).device(device))
      .remainder_(p.heads);
}

// The sink logit of each query matrix, (N, G, 1), in the log-sum-exp's dtype.
Tensor sink_per_matrix(const Problem& p, const Tensor& sinks, const Tensor& lse) {
  return sinks.to(lse.scalar_type())
      .index_select(0, head_of_matrices(p, lse.device()))
      .view({p.n, p.g, 1});
}

// Attention sinks: each query's normalizer gains exp(sink) of its head. The log-sum-exp becomes
// logaddexp(lse, sink) (a query that sees no key, lse = +inf by convention, gets the sink's) and
// the output shrinks by exp(lse - new lse), in place.
Tensor add_sinks(const Problem& p, Tensor& out, const Tensor& lse, const Tensor& sinks) {
  const auto sink = sink_per_matrix(p, sinks, lse);
  const auto seen = lse.masked_fill(lse == std::numeric_limits<double>::infinity(), -kInf);
  const auto with_sink = torch::logaddexp(seen, sink);
  auto shape = out.sizes().vec();
  shape.back() = 1;
  out.mul_((seen - with_sink).exp_().view(shape));
  return with_sink;
}

// The gradient of the sinks: d out_i / d sink_h = -p_sink,i * out_i, so each query adds
// -exp(sink - lse_i) * delta_i (delta_i = grad_out_i . out_i) to its head's sink.
Tensor sink_gradient(const Problem& p, const Tensor& out, const Tensor& lse, const Tensor& grad_out,
                     const Tensor& sinks) {
  const auto dtype = lse.scalar_type();
  const auto delta = (grad_out.to(dtype) * out.to(dtype)).sum(-1).reshape({p.n, p.g, p.t_q});
  const auto sink = sink_per_matrix(p, sinks, lse);
  const auto per_matrix = ((sink - lse).exp() * delta).sum(-1).neg().reshape({p.n * p.g});
  return torch::zeros({p.heads}, lse.options())
      .index_add_(0, head_of_matrices(p, lse.device()), per_matrix)
      .to(sinks.scalar_type());
}

// A block mask carried from forward to backward in the context's saved data (an IValue capsule):
// shared, never copied.
struct SavedBlockMask : torch::CustomClassHolder {
  explicit SavedBlockMask(BlockMask m) : mask(std::move(m)) {}
  BlockMask mask;
};

// A score modification carried the same way, with the public function's name for its messages.
struct SavedScoreModification : torch::CustomClassHolder {
  SavedScoreModification(ScoreMod m, std::string name)
      : mod(std::move(m)), caller(std::move(name)) {}
  ScoreMod mod;
  std::string caller;
};

// Saves the unscaled queries and the keys and values as given; the flattened, contiguous
// (N, G, T, d) copies that the generic tiles need are made in backward only.
class ChunkedAttention : public torch::autograd::Function<ChunkedAttention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& sinks, const Tensor& relative_bias,
                        const Problem& problem) {
    // Without sinks, `sinks` is an empty placeholder (LibTorch's autograd takes no undefined
    // inputs).
    const bool with_sinks = problem.sinks.defined();
    auto [out, lse] = forward_with_lse(problem, q, k, v);
    if (with_sinks) lse = add_sinks(problem, out, lse, sinks);
    ctx->save_for_backward({q, k, v, out, lse, sinks, relative_bias});
    ctx->saved_data["relative_buckets"] = problem.relative_buckets;
    ctx->saved_data["relative_first"] = problem.relative_first;
    ctx->saved_data["with_sinks"] = with_sinks;
    ctx->saved_data["caller"] = std::string(problem.caller);
    // The problem travels to backward as plain values: the mask is never an autograd input here
    // (a mask that needs a gradient is refused before the kernel runs).
    ctx->saved_data["mask"] = problem.mask;
    ctx->saved_data["sizes"] = std::vector<int64_t>{problem.n,
                                                    problem.g,
                                                    problem.t_q,
                                                    problem.t_k,
                                                    problem.d,
                                                    problem.dv,
                                                    problem.block,
                                                    problem.query_offset,
                                                    problem.causal ? 1 : 0,
                                                    problem.window_left,
                                                    problem.window_right,
                                                    problem.heads};
    ctx->saved_data["softcap"] = problem.softcap;
    ctx->saved_data["alibi"] = problem.alibi;
    ctx->saved_data["lead"] = problem.lead;
    ctx->saved_data["scale"] = problem.scale;
    ctx->saved_data["top_left"] = problem.alignment == functional::CausalAlignment::TopLeft;
    if (problem.block_mask) {
      ctx->saved_data["block_mask"] =
          c10::IValue::make_capsule(c10::make_intrusive<SavedBlockMask>(*problem.block_mask));
    }
    if (problem.score_mod) {
      ctx->saved_data["score_mod"] = c10::IValue::make_capsule(
          c10::make_intrusive<SavedScoreModification>(*problem.score_mod, problem.caller));
    }
    if (problem.packed()) {
      ctx->saved_data["query_offsets"] = problem.sequences->query_offsets;
      ctx->saved_data["key_offsets"] = problem.sequences->key_offsets;
    }
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (fused_cpu_applies(saved[0])) {
      detail::refuse_double_backward(ctx->saved_data["caller"].toStringRef().c_str());
    }
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    Problem p;
    p.n = sizes[0];
    p.g = sizes[1];
    p.t_q = sizes[2];
    p.t_k = sizes[3];
    p.d = sizes[4];
    p.dv = sizes[5];
    p.block = sizes[6];
    p.query_offset = sizes[7];
    p.causal = sizes[8] != 0;
    p.window_left = sizes[9];
    p.window_right = sizes[10];
    p.heads = sizes[11];
    p.softcap = ctx->saved_data["softcap"].toDouble();
    p.alibi = ctx->saved_data["alibi"].toDoubleVector();
    p.lead = ctx->saved_data["lead"].toIntVector();
    p.mask = ctx->saved_data["mask"].toTensor();
    p.scale = ctx->saved_data["scale"].toDouble();
    if (ctx->saved_data["top_left"].toBool()) p.alignment = functional::CausalAlignment::TopLeft;
    // The bucket of each relative position (empty without a relative bias).
    p.relative_buckets = ctx->saved_data["relative_buckets"].toIntVector();
    if (!p.relative_buckets.empty()) {
      p.relative_bias = saved[6];
      p.relative_first = ctx->saved_data["relative_first"].toInt();
    }
    if (ctx->saved_data.find("block_mask") != ctx->saved_data.end()) {
      p.block_mask = c10::static_intrusive_pointer_cast<SavedBlockMask>(
                         ctx->saved_data["block_mask"].toCapsule())
                         ->mask;
    }
    c10::intrusive_ptr<SavedScoreModification> modification;
    if (ctx->saved_data.find("score_mod") != ctx->saved_data.end()) {
      modification = c10::static_intrusive_pointer_cast<SavedScoreModification>(
          ctx->saved_data["score_mod"].toCapsule());
      p.score_mod = modification->mod;
      p.caller = modification->caller.c_str();
    }
    if (ctx->saved_data.find("query_offsets") != ctx->saved_data.end()) {
      p.sequences =
          std::make_shared<const Sequences>(ctx->saved_data["query_offsets"].toIntVector(),
                                            ctx->saved_data["key_offsets"].toIntVector());
    }
    // A relative bias is only here on the fused CPU kernels (every other route takes its dense
    // bias as a mask): its gradient comes by relative position, summed into its buckets' rows.
    Tensor d_relative, by_position;
    Tensor dq, dk, dv;
    if (p.relative_bias.defined()) {
      std::tie(dq, dk, dv) =
          cpu_backward(p, saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], &by_position);
      const auto buckets = torch::tensor(p.relative_buckets, torch::kLong).to(by_position.device());
      d_relative = torch::zeros(p.relative_bias.sizes(), by_position.options())
                       .index_add_(0, buckets, by_position.t())
                       .to(p.relative_bias.scalar_type());
    } else {
      std::tie(dq, dk, dv) =
          backward_with_lse(p, saved[0], saved[1], saved[2], saved[3], saved[4], grads[0]);
    }
    const auto& sinks = saved[5];
    const Tensor d_sinks = ctx->saved_data["with_sinks"].toBool() && ctx->needs_input_grad(3)
                               ? sink_gradient(p, saved[3], saved[4], grads[0], sinks)
                               : Tensor();
    return {dq, dk, dv, d_sinks, d_relative, Tensor()};
  }
};

// The problem as the kernels take it, and the inputs batched: the mask expanded (a view) to the
// scores' shape, unbatched (T, d) inputs as one head of one batch.
Problem tile_problem(const Problem& problem) {
  Problem p = problem;
  p.mask = problem.expanded_mask();
  return p;
}

Tensor batched(const Tensor& t) {
  return t.dim() == 2 ? t.unsqueeze(0) : t;
}

}  // namespace

std::pair<Tensor, Tensor> fused_forward_with_lse(const Problem& problem, const Tensor& query,
                                                 const Tensor& key, const Tensor& value) {
  TORCH_INTERNAL_ASSERT(fused_cpu_applies(query) && !problem.degenerate() &&
                        !problem.relative_bias.defined());
  const Problem p = tile_problem(problem);
  auto [out, lse] = cpu_forward(p, batched(query), batched(key), batched(value));
  if (p.sinks.defined()) lse = add_sinks(p, out, lse, p.sinks);
  return {query.dim() == 2 ? out.squeeze(0) : out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_backward_with_lse(
    const Problem& problem, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& out, const Tensor& lse, const Tensor& grad_out) {
  TORCH_INTERNAL_ASSERT(fused_cpu_applies(query) && !problem.degenerate() &&
                        !problem.relative_bias.defined());
  const Problem p = tile_problem(problem);
  auto [dq, dk, dv] = cpu_backward(p, batched(query), batched(key), batched(value), batched(out),
                                   lse, batched(grad_out));
  const Tensor d_sinks = p.sinks.defined()
                             ? sink_gradient(p, batched(out), lse, batched(grad_out), p.sinks)
                             : Tensor();
  if (query.dim() == 2) return {dq.squeeze(0), dk.squeeze(0), dv.squeeze(0), d_sinks};
  return {dq, dk, dv, d_sinks};
}

functional::AttentionOutput chunked(const Problem& problem, const Tensor& query, const Tensor& key,
                                    const Tensor& value) {
  // Packed sequences: the fused CPU kernels take every sequence in one parallel pass, forward and
  // backward; the device-generic tiles take one sequence at a time.
  if (problem.packed() && !fused_cpu_applies(query)) {
    return each_sequence(problem, query, key, value, chunked);
  }
  // The tiles index the mask per query matrix: it is expanded (a view) to the scores' shape.
  const Problem p = tile_problem(problem);
  const bool unbatched = query.dim() == 2;
  // Inference on the fused CPU forward: no autograd record and no log-sum-exp (at T = 32768 and 8
  // heads that is 1 MiB that nothing would read). Sinks shift the output by it, so they keep it.
  const bool records = torch::GradMode::is_enabled() &&
                       (query.requires_grad() || key.requires_grad() || value.requires_grad() ||
                        (p.sinks.defined() && p.sinks.requires_grad()) ||
                        (p.relative_bias.defined() && p.relative_bias.requires_grad()));
  if (!records && !p.sinks.defined() && fused_cpu_applies(query)) {
    auto out = cpu_forward(p, batched(query), batched(key), batched(value), /*with_lse=*/false);
    return {unbatched ? out.first.squeeze(0) : out.first, {}};
  }
  const auto sinks = p.sinks.defined() ? p.sinks : torch::empty({0}, query.options());
  const auto relative =
      p.relative_bias.defined() ? p.relative_bias : torch::empty({0}, query.options());
  auto out =
      ChunkedAttention::apply(batched(query), batched(key), batched(value), sinks, relative, p);
  return {unbatched ? out.squeeze(0) : out, {}};
}

}  // namespace kernels
}  // namespace attention
