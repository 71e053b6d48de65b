// Head-parallel multi-head attention. The heads are independent until the output projection,
// which sums over them: so each rank computes its heads and its share of that sum, and one
// all-reduce adds the shares. In backward the input's gradient is the sum of the heads'
// gradients: one all-reduce again. The two all-reduces are Megatron-LM's f and g operators.

#include <attention/distributed/head_parallel.h>

#include "distributed/group_state.h"

#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace attention {
namespace distributed {
namespace {

using torch::Tensor;
constexpr const char* kName = "attention::distributed::HeadParallelMultiHeadAttention";

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(Group g) : group(std::move(g)) {}
  Group group;
};

const Group& group_of(torch::autograd::AutogradContext* ctx) {
  return static_cast<GroupHolder*>(ctx->saved_data["group"].toCapsule().get())->group;
}

// The sum over the ranks of a tensor whose shape every rank has (the forward checked it).
Tensor summed(const Tensor& t, const Group& group, const char* what) {
  auto sum = t.contiguous().clone();
  reduce_same(*group.state(), sum,
              fmt::format("{} of shape {}, summed over the ranks", what, t.sizes()), kName);
  return sum;
}

// The input as every rank's heads see it: forward is the identity, backward sums the heads'
// gradients over the ranks.
class EnterHeads : public torch::autograd::Function<EnterHeads> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                        const Group& group) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {summed(grads[0], group_of(ctx), "the gradient of the heads' input"), Tensor()};
  }
};

// The sum of every rank's share of the output projection; backward hands each rank the whole
// gradient.
class LeaveHeads : public torch::autograd::Function<LeaveHeads> {
 public:
  static Tensor forward(torch::autograd::AutogradContext*, const Tensor& partial,
                        const Group& group) {
    return summed(partial, group, "the heads' share of the output");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], Tensor()};
  }
};

// The soft-cap's bits, for comparing options across ranks exactly (0 when unset).
int64_t softcap_bits(const c10::optional<double>& softcap) {
  int64_t bits = 0;
  if (softcap) std::memcpy(&bits, &*softcap, sizeof bits);
  return bits;
}

// Rows [r * n, (r + 1) * n) of `t` (dim 0) or columns (dim 1): rank r's heads.
Tensor share(const Tensor& t, int64_t dim, const Group& group) {
  const int64_t n = t.size(dim) / group.size();
  return t.narrow(dim, group.rank() * n, n);
}

}  // namespace

HeadParallelMultiHeadAttentionImpl::HeadParallelMultiHeadAttentionImpl(
    const MultiHeadAttentionOptions& options_, Group group_)
    : options(options_), group(std::move(group_)) {
  const auto& o = options;
  group.check_same(
      {o.d_in(), o.d_out(), o.num_heads(), o.num_kv_heads(), o.d_in_kv(), o.context_length(),
       o.qkv_bias(), o.out_bias(), o.output_projection(), o.causal(),
       static_cast<int64_t>(o.causal_alignment()), o.sliding_window().value_or(0),
       softcap_bits(o.softcap()), o.alibi(), o.sinks(), o.rope().has_value(),
       softcap_bits(o.scale())},
      "module options (d_in, d_out, num_heads, num_kv_heads, d_in_kv, context_length, qkv_bias, "
      "out_bias, output_projection, causal, causal_alignment, sliding_window, softcap, alibi, "
      "sinks, rope, scale)",
      kName);
  reset();
}

void HeadParallelMultiHeadAttentionImpl::reset() {
  const auto& o = options;
  const int64_t w = group.size();
  TORCH_CHECK_VALUE(o.num_heads() > 0 && o.num_kv_heads() > 0 && o.num_heads() % w == 0 &&
                        o.num_kv_heads() % w == 0,
                    kName, ": expected the ", w,
                    " ranks to divide num_heads and num_kv_heads, got num_heads ", o.num_heads(),
                    " and num_kv_heads ", o.num_kv_heads());
  TORCH_CHECK_VALUE(!o.alibi() && !o.sinks(), kName,
                    ": ALiBi and attention sinks are not split across ranks (each rank's heads "
                    "would need their share of the slopes or sinks); use neither here");
  TORCH_CHECK_VALUE(!o.relative_bias() && !o.gate(), kName,
                    ": a relative position bias and an output gate are not split across ranks "
                    "(each rank's heads would need their share of the table or of W_gate); use "
                    "neither here");
  TORCH_CHECK_VALUE(!o.qk_norm() && !o.value_norm() && o.head_dim() == 0 && !o.gate_in_query(),
                    kName,
                    ": QK-norm, a value norm, head_dim and gate_in_query are not split across "
                    "ranks (a norm over the projection spans every rank's heads); use none of "
                    "them here");
  TORCH_CHECK_VALUE(o.output_projection(), kName,
                    ": expected a module with an output projection (output_projection(true)); "
                    "without one the heads' outputs are concatenated, not summed");
  TORCH_CHECK_VALUE(o.d_out() > 0 && o.d_out() % o.num_heads() == 0, kName,
                    ": expected num_heads to divide d_out, got d_out ", o.d_out(),
                    " and num_heads ", o.num_heads());
  const int64_t head_dim = o.d_out() / o.num_heads();
  auto local = MultiHeadAttentionOptions(o.d_in(), head_dim * o.num_heads() / w, o.num_heads() / w)
                   .num_kv_heads(o.num_kv_heads() / w)
                   .d_in_kv(o.d_in_kv())
                   .context_length(o.context_length())
                   .dropout(o.dropout())
                   .qkv_bias(o.qkv_bias())
                   .causal(o.causal())
                   .causal_alignment(o.causal_alignment())
                   .sliding_window(o.sliding_window())
                   .softcap(o.softcap())
                   .rope(o.rope())
                   .scale(o.scale())
                   .output_projection(false);
  heads = MultiHeadAttention(local);
  // The heads' projections are this module's own parameters, under the full module's names.
  W_query = register_module("W_query", heads->W_query);
  W_key = register_module("W_key", heads->W_key);
  W_value = register_module("W_value", heads->W_value);
  out_proj = register_module(
      "out_proj",
      torch::nn::Linear(torch::nn::LinearOptions(local.d_out(), o.d_out()).bias(o.out_bias())));
  if (o.out_bias()) {
    torch::NoGradGuard no_grad;
    out_proj->bias.zero_();
  }
}

void HeadParallelMultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  const int64_t per_rank = o.num_heads() / group.size();
  stream << kName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", num_kv_heads=" << o.num_kv_heads()
         << ", rank=" << group.rank() << " of " << group.size() << ", heads=["
         << group.rank() * per_rank << ", " << (group.rank() + 1) * per_rank << "))";
}

functional::AttentionOutput HeadParallelMultiHeadAttentionImpl::forward(
    const Tensor& x, const MultiHeadAttentionForwardOptions& forward_options) {
  // Each rank works on its heads; before the sum every rank learns whether all did, and with
  // outputs of one shape, so that a refusal on one rank stops every rank at once.
  std::exception_ptr error;
  Tensor partial;
  try {
    TORCH_CHECK_VALUE(!forward_options.need_weights(), kName,
                      ": need_weights is not available here (each rank has only its heads' "
                      "weights); gather() the module to inspect them");
    TORCH_CHECK(!x.defined() || x.device().is_cpu(), kName,
                ": expected the input on the CPU (the group's Gloo backend moves CPU tensors), "
                "got one on ",
                x.device().str());
    auto local_options = forward_options;
    if (forward_options.context().defined()) {
      local_options.context(EnterHeads::apply(forward_options.context(), group));
    }
    // The heads module validates x (and everything else) before anything is computed.
    const Tensor x_in = x.defined() ? EnterHeads::apply(x, group) : x;
    const Tensor context = heads->forward(x_in, local_options).output;
    partial = torch::nn::functional::linear(context, out_proj->weight);
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<int64_t> shape{-1};
  if (!error) {
    shape = {static_cast<int64_t>(partial.scalar_type())};
    shape.insert(shape.end(), partial.sizes().begin(), partial.sizes().end());
  }
  group.check_same(shape, "output dtype and shape (from the input's)", kName, error);
  Tensor y = LeaveHeads::apply(partial, group);
  if (options.out_bias()) y = y + out_proj->bias;
  return {y, {}};
}

MultiHeadAttention HeadParallelMultiHeadAttentionImpl::gather() const {
  MultiHeadAttention full(options);
  full->to(W_query->weight.scalar_type());
  torch::NoGradGuard no_grad;
  // Every rank's shares have the shapes of the options, which the constructor checked.
  const auto gathered = [&](const Tensor& t, int64_t dim) {
    return torch::cat(gather_same(*group.state(), t.detach(),
                                  fmt::format("a weight of shape {}", t.sizes()), kName),
                      dim);
  };
  for (const auto& [mine, theirs] :
       {std::pair{W_query, full->W_query}, {W_key, full->W_key}, {W_value, full->W_value}}) {
    theirs->weight.copy_(gathered(mine->weight, 0));
    if (mine->bias.defined()) theirs->bias.copy_(gathered(mine->bias, 0));
  }
  full->out_proj->weight.copy_(gathered(out_proj->weight, 1));
  if (options.out_bias()) full->out_proj->bias.copy_(out_proj->bias);
  return full;
}

HeadParallelMultiHeadAttention shard_heads(const MultiHeadAttentionImpl& full, const Group& group) {
  HeadParallelMultiHeadAttention part(full.options, group);
  part->to(full.W_query->weight.scalar_type());
  torch::NoGradGuard no_grad;
  for (const auto& [mine, theirs] : {std::pair{part->W_query, full.W_query},
                                     {part->W_key, full.W_key},
                                     {part->W_value, full.W_value}}) {
    mine->weight.copy_(share(theirs->weight, 0, group));
    if (mine->bias.defined()) mine->bias.copy_(share(theirs->bias, 0, group));
  }
  part->out_proj->weight.copy_(share(full.out_proj->weight, 1, group));
  if (full.options.out_bias()) part->out_proj->bias.copy_(full.out_proj->bias);
  return part;
}

HeadParallelMultiHeadAttention load_sharded(const std::string& path,
                                            const MultiHeadAttentionOptions& options,
                                            const Group& group, const LoadOptions& load_options) {
  // A rank that cannot load the file stops every rank with its message.
  std::exception_ptr error;
  MultiHeadAttention full{nullptr};
  try {
    full = MultiHeadAttention(options);
    load_weights(*full, path, load_options);
  } catch (...) {
    error = std::current_exception();
  }
  group.check_same({}, "weight file", "attention::distributed::load_sharded", error);
  return shard_heads(*full, group);
}

}  // namespace distributed
}  // namespace attention
