// Ring attention (sequence parallelism). Each rank keeps its queries and passes its keys and
// values to the next rank, W - 1 times, so every query meets every key block once. The block at
// hand goes through the Chunked kernel, which also returns each query's log-sum-exp; the partial
// results of the blocks are merged through it (the online softmax, one level up), so the result
// is the attention over the whole sequence. Sending the next block is started before the
// kernel runs on the current one, so the transfer overlaps the work.
//
// Causal attention over the balanced split has the sequence in 2W chunks, rank r holding chunks r
// and 2W-1-r, which gives every rank the same number of visible (query, key) chunk pairs; over
// the contiguous split, W chunks, rank r holding chunk r. Either way a query chunk i sees key
// chunks j < i in full, j = i through the causal mask and j > i not at all.
//
// Backward sends the keys and values around once more, with the gradients of their keys and
// values: each rank adds its queries' share to the block it holds and passes both on, and after W
// steps the gradients are back at the rank that owns the keys.

#include <attention/distributed/ring_attention.h>

#include "checks.h"
#include "distributed/group_state.h"
#include "kernels/blockwise.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <cstring>
#include <limits>

namespace attention {
namespace distributed {
namespace {

using torch::Tensor;
constexpr const char* kCaller = "attention::distributed::ring_attention";
constexpr double kInf = std::numeric_limits<double>::infinity();

// The validated sizes and options of one ring_attention call, the same on every rank.
struct Plan {
  std::shared_ptr<GroupState> group;
  int64_t batch = 0, heads = 0, kv_heads = 0, local = 0, d = 0, dv = 0;
  bool causal = false, balanced = false, masked = false;
  c10::optional<double> scale;
  int64_t block = 256;
  // Chunks per rank (2 when causal over the balanced split, else 1) and positions per chunk.
  int64_t chunks = 1, chunk = 0;

  // The position of local chunk c of rank `owner` among the 2W (or W) chunks of the sequence.
  int64_t chunk_index(int64_t owner, int64_t c) const {
    return chunks == 2 ? (c == 0 ? owner : 2 * group->size - 1 - owner) : owner;
  }
  // The rank whose keys and values a rank holds at ring step s.
  int64_t owner_at(int64_t step) const {
    return ((group->rank - step) % group->size + group->size) % group->size;
  }
};

// What autograd keeps of the plan between forward and backward.
struct PlanHolder : torch::CustomClassHolder {
  explicit PlanHolder(Plan p) : plan(std::move(p)) {}
  Plan plan;
};

// A rank's keys, values and key padding (as 0/1 in the keys' dtype) in one flat buffer: one
// transfer per step. Views into the buffer give the parts back.
struct KeyValueBlock {
  Tensor buffer, key, value, padding;

  KeyValueBlock(const Plan& p, const torch::TensorOptions& options) {
    const int64_t k_numel = p.batch * p.kv_heads * p.local * p.d;
    const int64_t v_numel = p.batch * p.kv_heads * p.local * p.dv;
    const int64_t m_numel = p.masked ? p.batch * p.local : 0;
    buffer = torch::empty({k_numel + v_numel + m_numel}, options);
    key = buffer.narrow(0, 0, k_numel).view({p.batch, p.kv_heads, p.local, p.d});
    value = buffer.narrow(0, k_numel, v_numel).view({p.batch, p.kv_heads, p.local, p.dv});
    if (p.masked) padding = buffer.narrow(0, k_numel + v_numel, m_numel).view({p.batch, p.local});
  }

  void fill(const Tensor& k, const Tensor& v, const Tensor& key_padding_mask) {
    key.copy_(k);
    value.copy_(v);
    if (padding.defined()) padding.copy_(key_padding_mask);
  }
};

// Sends `outgoing` to the next rank and receives `incoming` from the previous one. The wait for
// both has one deadline, counted from when it starts (the work in between may take longer).
struct Exchange {
  GroupState* group;
  std::vector<Transfer> transfers;

  Exchange(const Plan& p, const Tensor& outgoing, const Tensor& incoming, int tag,
           const std::string& what)
      : group(p.group.get()) {
    const int64_t w = group->size, r = group->rank;
    transfers.push_back(group->recv(incoming, (r + w - 1) % w, tag, what, kCaller));
    transfers.push_back(group->send(outgoing, (r + 1) % w, tag, what, kCaller));
  }
  void wait() const { group->wait(transfers, group->deadline(), kCaller); }
};

// The problem of local query chunk `qc` against key chunk `kc` of a block: the keys of chunk kc
// are hidden causally when the two chunks are the same part of the sequence.
kernels::Problem pair_problem(const Plan& p, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& padding, bool diagonal) {
  functional::ScaledDotProductAttentionOptions options;
  options.is_causal(diagonal).scale(p.scale).block_size(p.block).backend(
      functional::Backend::Chunked);
  if (padding.defined()) options.attn_mask(padding.to(torch::kBool).view({p.batch, 1, 1, -1}));
  auto problem = kernels::make_problem(q, k, v, options, kCaller);
  problem.mask = problem.expanded_mask();
  return problem;
}

Tensor chunk_of(const Tensor& t, const Plan& p, int64_t c) {
  return t.narrow(2, c * p.chunk, p.chunk);
}

// One (query chunk, key chunk) pair of a step: the chunks and their problem.
struct Pair {
  int64_t qc = 0, kc = 0;
  Tensor q, k, v;
  kernels::Problem problem;
};

// Calls visit(pair) for every pair of this rank's query chunks and the key chunks of `block`
// (owned by rank `owner`) in which some query sees some key.
template <typename Visit>
void for_each_pair(const Plan& p, const Tensor& q, const KeyValueBlock& block, int64_t owner,
                   Visit visit) {
  for (int64_t qc = 0; qc < p.chunks; ++qc) {
    for (int64_t kc = 0; kc < p.chunks; ++kc) {
      const int64_t qi = p.chunk_index(p.group->rank, qc), ki = p.chunk_index(owner, kc);
      if (p.causal && ki > qi) continue;
      Pair pair{
          qc, kc, chunk_of(q, p, qc), chunk_of(block.key, p, kc), chunk_of(block.value, p, kc), {}};
      const Tensor padding = p.masked ? block.padding.narrow(1, kc * p.chunk, p.chunk) : Tensor();
      pair.problem = pair_problem(p, pair.q, pair.k, pair.v, padding, p.causal && ki == qi);
      visit(pair);
    }
  }
}

// Adds one pair's output and log-sum-exp to the running ones of its queries. The kernel marks a
// query without keys by +inf; here -inf does (a weight of exp(-inf) = 0), and a query that has
// seen no key in any block keeps weight 0 instead of exp(-inf - -inf) = NaN.
void merge(Tensor acc, Tensor acc_lse, const Tensor& out, Tensor lse) {
  lse = lse.masked_fill(lse == kInf, -kInf);
  const auto total = torch::logaddexp(acc_lse, lse);
  const auto none = total == -kInf;
  const auto weight = [&](const Tensor& part) {
    return (part - total).exp().masked_fill_(none, 0.0).unsqueeze(-1);
  };
  acc.mul_(weight(acc_lse)).add_(out * weight(lse));
  acc_lse.copy_(total);
}

std::pair<Tensor, Tensor> ring_forward(const Plan& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& key_padding_mask) {
  Tensor out = torch::zeros({p.batch, p.heads, p.local, p.dv}, q.options());
  Tensor lse = torch::full({p.batch, p.heads, p.local}, -kInf, q.options());
  KeyValueBlock current(p, q.options()), next(p, q.options());
  current.fill(k, v, key_padding_mask);
  const int64_t w = p.group->size;
  for (int64_t step = 0; step < w; ++step) {
    c10::optional<Exchange> exchange;
    if (step + 1 < w) {
      exchange.emplace(
          p, current.buffer, next.buffer, tags::kRingForward + static_cast<int>(step),
          fmt::format("the key/value block of forward step {} of {}", step + 1, w - 1));
    }
    for_each_pair(p, q, current, p.owner_at(step), [&](const Pair& pair) {
      auto [o, l] = kernels::forward_with_lse(pair.problem, pair.q, pair.k, pair.v);
      merge(chunk_of(out, p, pair.qc), lse.narrow(2, pair.qc * p.chunk, p.chunk), o,
            l.view({p.batch, p.heads, p.chunk}));
    });
    if (exchange) {
      exchange->wait();
      std::swap(current, next);
    }
  }
  // Backward reads the kernel's convention again: +inf for a query that saw no key.
  lse.masked_fill_(lse == -kInf, kInf);
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> ring_backward(const Plan& p, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& key_padding_mask,
                                                 const Tensor& out, const Tensor& lse,
                                                 const Tensor& grad_out) {
  Tensor dq = torch::zeros_like(q);
  KeyValueBlock current(p, q.options()), next(p, q.options());
  current.fill(k, v, key_padding_mask);
  // The gradients of the keys and values of the block at hand, travelling with it.
  const int64_t k_numel = k.numel();
  Tensor grads = torch::zeros({k_numel + v.numel()}, q.options());
  Tensor grads_next = torch::empty_like(grads);
  const auto dk_of = [&](Tensor& g) { return g.narrow(0, 0, k_numel).view(k.sizes()); };
  const auto dv_of = [&](Tensor& g) { return g.narrow(0, k_numel, v.numel()).view(v.sizes()); };
  const auto grad_go = grad_out.contiguous();
  const int64_t w = p.group->size;
  for (int64_t step = 0; step < w; ++step) {
    c10::optional<Exchange> exchange;
    if (step + 1 < w) {
      exchange.emplace(
          p, current.buffer, next.buffer, tags::kRingBackward + static_cast<int>(step),
          fmt::format("the key/value block of backward step {} of {}", step + 1, w - 1));
    }
    auto dk = dk_of(grads), dv = dv_of(grads);
    for_each_pair(p, q, current, p.owner_at(step), [&](const Pair& pair) {
      const auto lse_c = lse.narrow(2, pair.qc * p.chunk, p.chunk)
                             .reshape({pair.problem.n, pair.problem.g, p.chunk})
                             .contiguous();
      auto [dq_c, dk_c, dv_c] = kernels::backward_with_lse(pair.problem, pair.q, pair.k, pair.v,
                                                           chunk_of(out, p, pair.qc), lse_c,
                                                           chunk_of(grad_go, p, pair.qc));
      chunk_of(dq, p, pair.qc).add_(dq_c);
      chunk_of(dk, p, pair.kc).add_(dk_c);
      chunk_of(dv, p, pair.kc).add_(dv_c);
    });
    // The gradients go on to the next rank, which holds this block at the next step; after the
    // last step they reach the block's owner.
    if (w > 1) {
      Exchange(p, grads, grads_next, tags::kRingGradient + static_cast<int>(step),
               fmt::format("the key/value gradients of backward step {} of {}", step + 1, w))
          .wait();
      std::swap(grads, grads_next);
    }
    if (exchange) {
      exchange->wait();
      std::swap(current, next);
    }
  }
  return {dq, dk_of(grads).clone(), dv_of(grads).clone()};
}

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& key_padding_mask, const Plan& plan) {
    auto [out, lse] = ring_forward(plan, q, k, v, key_padding_mask);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["padding"] = key_padding_mask;
    ctx->saved_data["plan"] = c10::IValue::make_capsule(c10::make_intrusive<PlanHolder>(plan));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto holder = ctx->saved_data["plan"].toCapsule();
    const auto& plan = static_cast<PlanHolder*>(holder.get())->plan;
    auto [dq, dk, dv] =
        ring_backward(plan, saved[0], saved[1], saved[2], ctx->saved_data["padding"].toTensor(),
                      saved[3], saved[4], grads[0]);
    return {dq, dk, dv, Tensor(), Tensor()};
  }
};

std::string describe(const Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return fmt::format("{} {} on {}", detail::shape_str(t.sizes()), c10::toString(t.scalar_type()),
                     t.device().str());
}

// Checks the inputs of this rank.
Plan local_plan(const Tensor& q, const Tensor& k, const Tensor& v, const Group& group,
                const RingAttentionOptions& options) {
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor&>{"query", q}, {"key", k}, {"value", v}}) {
    TORCH_CHECK_VALUE(t.defined() && t.dim() == 4, kCaller, ": expected ", name,
                      " of rank 4 (B, heads, T_local, features), got ", describe(t));
    TORCH_CHECK_TYPE(t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble, kCaller,
                     ": expected ", name, " of dtype float or double, got ", describe(t));
    TORCH_CHECK(t.device().is_cpu(), kCaller, ": expected ", name,
                " on the CPU (the group's Gloo backend moves CPU tensors), got ", describe(t));
  }
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                   kCaller, ": expected query, key and value of one dtype, got ", describe(q), ", ",
                   describe(k), ", ", describe(v));
  TORCH_CHECK_VALUE(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                        v.size(2) == q.size(2),
                    kCaller,
                    ": expected query, key and value with the same batch and local "
                    "length, got ",
                    describe(q), ", ", describe(k), ", ", describe(v));
  TORCH_CHECK_VALUE(k.size(3) == q.size(3), kCaller,
                    ": expected query and key with the same features, got ", describe(q), " and ",
                    describe(k));
  TORCH_CHECK_VALUE(v.size(1) == k.size(1) && k.size(1) > 0 && q.size(1) % k.size(1) == 0, kCaller,
                    ": expected key and value with the same number of heads, "
                    "dividing the query's, got ",
                    describe(q), ", ", describe(k), ", ", describe(v));
  Plan p;
  p.group = group.state();
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);
  p.local = q.size(2);
  p.d = q.size(3);
  p.dv = v.size(3);
  p.causal = options.is_causal();
  p.scale = options.scale();
  p.block = options.block_size();
  TORCH_CHECK_VALUE(p.block >= 1, kCaller, ": expected a positive block_size, got ", p.block);
  TORCH_CHECK_VALUE(!p.scale || std::isfinite(*p.scale), kCaller, ": expected a finite scale, got ",
                    p.scale ? *p.scale : 0.0);
  TORCH_CHECK_VALUE(
      !p.causal || options.balanced().has_value(), kCaller,
      ": a causal call needs to know how the shards were made: set "
      "RingAttentionOptions::balanced to shard_sequence's `balanced` (true or false)");
  p.balanced = p.causal && *options.balanced();
  TORCH_CHECK_VALUE(!p.balanced || p.local % 2 == 0, kCaller,
                    ": shards of the balanced split (an early and a late chunk per rank) have an "
                    "even local length; got ",
                    p.local);
  const auto& mask = options.key_padding_mask();
  p.masked = mask.defined();
  if (p.masked) {
    TORCH_CHECK_TYPE(mask.scalar_type() == torch::kBool, kCaller,
                     ": expected a bool key_padding_mask (true = padding), got ", describe(mask));
    TORCH_CHECK_VALUE(mask.dim() == 2 && mask.size(0) == p.batch && mask.size(1) == p.local,
                      kCaller, ": expected key_padding_mask of shape (", p.batch, ", ", p.local,
                      ") for this rank's keys, got ", describe(mask));
  }
  p.chunks = p.balanced ? 2 : 1;
  p.chunk = p.local / p.chunks;
  return p;
}

// Checks the inputs of this rank; then every rank learns whether all did, and whether all have
// the same problem, so that a refusal on one rank stops every rank at once (not after the
// group's timeout) and leaves the group in step.
Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, const Group& group,
               const RingAttentionOptions& options) {
  std::exception_ptr error;
  Plan p;
  try {
    p = local_plan(q, k, v, group, options);
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<int64_t> values{-1};
  if (!error) {
    int64_t scale_bits = 0;
    if (p.scale) std::memcpy(&scale_bits, &*p.scale, sizeof scale_bits);
    values = {p.batch,
              p.heads,
              p.kv_heads,
              p.local,
              p.d,
              p.dv,
              static_cast<int64_t>(q.scalar_type()),
              p.causal,
              p.balanced,
              p.masked,
              p.scale.has_value(),
              scale_bits,
              p.block};
  }
  group.check_same(
      values,
      "sizes and options (B, H, Hkv, T_local, d, dv, dtype, causal, balanced, padding, "
      "scale set, scale bits, block_size)",
      kCaller, error);
  return p;
}

}  // namespace

Tensor ring_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                      const Group& group, const RingAttentionOptions& options) {
  const Plan plan = make_plan(query, key, value, group, options);
  // The padding travels as 0/1 in the keys' dtype; an empty tensor stands for none (autograd
  // functions take no undefined tensors).
  const auto& mask = options.key_padding_mask();
  const Tensor padding =
      mask.defined() ? mask.to(query.scalar_type()) : torch::empty({0}, query.options());
  return RingAttention::apply(query, key, value, padding, plan);
}

}  // namespace distributed
}  // namespace attention
