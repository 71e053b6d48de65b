#include <attention/gated_delta_net.h>

#include "modules/shared.h"

#include <torch/torch.h>

#include <cmath>

namespace attention {

namespace {

constexpr const char* kGatedDeltaNetName = "attention::GatedDeltaNet";

// x / sqrt(sum(x²) + 1e-6) along the last dimension, as the book's l2norm.
torch::Tensor l2_normalize(const torch::Tensor& x) {
  return x * torch::rsqrt(x.pow(2).sum(-1, /*keepdim=*/true) + 1e-6);
}

}  // namespace

GatedDeltaNetImpl::GatedDeltaNetImpl(const GatedDeltaNetOptions& options_) : options(options_) {
  reset();
}

void GatedDeltaNetImpl::reset() {
  const auto& o = options;
  detail::check_head_sizes(o.d_in(), o.d_out(), o.num_heads(), o.dropout(), kGatedDeltaNetName);
  detail::check_not_native(o.backend(), "gated delta rule", kGatedDeltaNetName);
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const auto linear = [](int64_t from, int64_t to, bool bias) {
    return Linear(LinearOptions(from, to).bias(bias));
  };
  // The book's order, so that a seed gives its weights.
  W_query = register_module("W_query", linear(o.d_in(), o.d_out(), o.qkv_bias()));
  W_key = register_module("W_key", linear(o.d_in(), o.d_out(), o.qkv_bias()));
  W_value = register_module("W_value", linear(o.d_in(), o.d_out(), o.qkv_bias()));
  W_gate = register_module("W_gate", linear(o.d_in(), o.d_out(), false));
  W_beta = register_module("W_beta", linear(o.d_in(), o.d_out(), false));
  W_alpha = register_module("W_alpha", linear(o.d_in(), o.num_heads(), false));
  dt_bias = register_parameter("dt_bias", torch::ones({o.num_heads()}));
  // The book's decay rates since its commit 7d92267 (November 2025): A = U(0, 16), stored as
  // its logarithm (Mamba-2's and Qwen3-Next's initialization), drawn here in the book's order.
  A_log = register_parameter("A_log", torch::empty({o.num_heads()}).uniform_(0, 16).log());
  norm = register_module("norm", RMSNorm(RMSNormOptions(head_dim()).eps(1e-6)));
  out_proj = register_module("out_proj", Linear(LinearOptions(o.d_out(), o.d_out())));
}

void GatedDeltaNetImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kGatedDeltaNetName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", qkv_bias=" << std::boolalpha << o.qkv_bias()
         << ", dropout=" << o.dropout() << ")";
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& x, GatedDeltaNetState* state) {
  detail::check_module_input(x, options.d_in(), W_query->weight, kGatedDeltaNetName, "x");
  const auto batch = x.dim() == 2 ? x.unsqueeze(0) : x;
  const int64_t b = batch.size(0), t = batch.size(1), h = options.num_heads(), hd = head_dim();
  const auto& carried = state != nullptr ? state->state_ : torch::Tensor();
  TORCH_CHECK_VALUE(!carried.defined() || carried.size(0) == b, kGatedDeltaNetName,
                    ": expected x of the state's batch size ",
                    carried.defined() ? carried.size(0) : 0, ", got ", b);
  const auto heads = [&](const torch::Tensor& p) { return p.view({b, t, h, hd}).transpose(1, 2); };
  // 1) Queries and keys on the unit sphere (queries scaled as attention's), values.
  const auto queries = l2_normalize(heads(W_query(batch))) / std::sqrt(static_cast<double>(hd));
  const auto keys = l2_normalize(heads(W_key(batch)));
  const auto values = heads(W_value(batch));
  // 2) The gates: update (per value feature), decay (per head), output.
  const auto beta = heads(torch::sigmoid(W_beta(batch)));
  const auto log_decay =
      (-A_log.exp() * torch::nn::functional::softplus(W_alpha(batch) + dt_bias)).transpose(1, 2);
  const auto gate = W_gate(batch).view({b, t, h, hd});
  // 3) The gated delta rule, from the carried state when there is one.
  auto rule = functional::gated_delta_rule(
      queries, keys, values, log_decay, beta,
      functional::GatedDeltaRuleOptions().initial_state(carried).backend(options.backend()));
  // 4) Each head normalized and gated, the heads joined, the output projection.
  auto context = norm(rule.output.transpose(1, 2)) * torch::silu(gate);
  context =
      torch::dropout(context.reshape({b, t, options.d_out()}), options.dropout(), is_training());
  const auto out = out_proj(context);
  if (state != nullptr) {
    state->state_ = rule.state;
    state->length_ += t;
  }
  return x.dim() == 2 ? out.squeeze(0) : out;
}

}  // namespace attention
