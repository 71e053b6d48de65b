// functional::gated_delta_rule: its checks, the recurrence in LibTorch ops (Backend::Math, every
// device) and the autograd function around the fused CPU kernel (kernels/cpu/delta_rule.h).

#include <attention/gated_delta_rule.h>

#include "checks.h"
#include "functional/enum_checks.h"
#include "functional/last_path.h"
#include "kernels/cpu/delta_rule.h"

#include <torch/torch.h>

#include <vector>

namespace attention {
namespace functional {

namespace {

constexpr const char* kGatedDeltaRuleName = "attention::functional::gated_delta_rule";

using detail::shape_str;

// Every check, before anything is read. Returns beta as (B, H, T, d_v).
torch::Tensor check_arguments(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& log_decay,
                              const torch::Tensor& beta, const GatedDeltaRuleOptions& options) {
  const char* caller = kGatedDeltaRuleName;
  const auto& state = options.initial_state();
  TORCH_CHECK_VALUE(
      q.defined() && k.defined() && v.defined() && log_decay.defined() && beta.defined(), caller,
      ": expected defined query, key, value, log_decay and beta tensors");
  TORCH_CHECK_VALUE(q.dim() == 4, caller, ": expected query of shape (B, H, T, d_k), got ",
                    shape_str(q.sizes()));
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dk = q.size(3);
  TORCH_CHECK_VALUE(k.sizes() == q.sizes(), caller, ": expected key of query's shape ",
                    shape_str(q.sizes()), ", got ", shape_str(k.sizes()));
  TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == b && v.size(1) == h && v.size(2) == t, caller,
                    ": expected value of shape (", b, ", ", h, ", ", t, ", d_v), got ",
                    shape_str(v.sizes()));
  const int64_t dv = v.size(3);
  TORCH_CHECK_VALUE(log_decay.sizes() == q.sizes().slice(0, 3), caller,
                    ": expected log_decay of shape ", shape_str(q.sizes().slice(0, 3)), ", got ",
                    shape_str(log_decay.sizes()));
  const bool per_feature = beta.sizes() == v.sizes();
  TORCH_CHECK_VALUE(per_feature || beta.sizes() == q.sizes().slice(0, 3), caller,
                    ": expected beta of shape ", shape_str(v.sizes()), " or ",
                    shape_str(q.sizes().slice(0, 3)), ", got ", shape_str(beta.sizes()));
  TORCH_CHECK_VALUE(!state.defined() || state.sizes() == c10::IntArrayRef({b, h, dk, dv}), caller,
                    ": expected initial_state of shape (", b, ", ", h, ", ", dk, ", ", dv,
                    "), got ", shape_str(state.sizes()));
  const auto dtype = q.scalar_type();
  for (const auto* tensor : {&k, &v, &log_decay, &beta, &state}) {
    TORCH_CHECK_TYPE(!tensor->defined() || tensor->scalar_type() == dtype, caller,
                     ": expected query, key, value, log_decay, beta and initial_state of one "
                     "dtype, got ",
                     dtype, " and ", tensor->scalar_type());
    TORCH_CHECK(!tensor->defined() || tensor->device() == q.device(), caller,
                ": expected every tensor on one device, got ", q.device(), " and ",
                tensor->device());
  }
  TORCH_CHECK_TYPE(c10::isFloatingType(dtype), caller, ": expected a floating-point dtype, got ",
                   dtype);
  TORCH_CHECK_TYPE(!(q.device().is_cpu() && dtype == at::kHalf), caller,
                   ": expected Float, Double or BFloat16 on the CPU, got Half");
  detail::check_backend(options.backend(), caller);
  TORCH_CHECK_VALUE(options.backend() != Backend::Native, caller,
                    ": Backend::Native has no gated delta rule; use Auto, Chunked or Math");
  TORCH_CHECK_VALUE(options.backend() != Backend::Chunked || q.device().is_cpu(), caller,
                    ": Backend::Chunked runs on the CPU, got tensors on ", q.device(),
                    "; use Auto or Math");
  return per_feature ? beta : beta.unsqueeze(-1).expand(v.sizes());
}

// The book's loop, token after token, in the inputs' dtype.
GatedDeltaRuleOutput recurrence(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, const torch::Tensor& log_decay,
                                const torch::Tensor& beta, torch::Tensor state) {
  const int64_t t = q.size(2);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(t);
  for (int64_t i = 0; i < t; ++i) {
    const auto k_t = k.select(2, i).unsqueeze(-1);
    state = state * log_decay.select(2, i).exp().unsqueeze(-1).unsqueeze(-1);
    const auto recalled = (state * k_t).sum(-2);
    const auto delta = (v.select(2, i) - recalled) * beta.select(2, i);
    state = state + k_t * delta.unsqueeze(-2);
    outputs.push_back((state * q.select(2, i).unsqueeze(-1)).sum(-2));
  }
  auto output = t > 0 ? torch::stack(outputs, 2) : v.new_empty(v.sizes());
  return {output, state};
}

// (B, H, T, d) -> (B H, T, d), contiguous.
torch::Tensor rows(const torch::Tensor& x) {
  return x.reshape({x.size(0) * x.size(1), x.size(2), x.size(3)});
}

// The fused kernel with its backward; inputs in (B H, T, d) rows, float or double.
struct FusedDeltaRule : public torch::autograd::Function<FusedDeltaRule> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v,
                                                const torch::Tensor& log_decay,
                                                const torch::Tensor& beta,
                                                const torch::Tensor& state) {
    auto f = kernels::cpu::delta_rule_forward(q, k, v, log_decay, beta, state, true);
    ctx->save_for_backward({q, k, v, log_decay, beta, f.checkpoints});
    ctx->saved_data["interval"] = f.interval;
    return {f.output, f.state};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::refuse_double_backward(kGatedDeltaRuleName);
    const auto saved = ctx->get_saved_variables();
    kernels::cpu::DeltaRuleForward f;
    f.checkpoints = saved[5];
    f.interval = ctx->saved_data["interval"].toInt();
    const auto& q = saved[0];
    const auto grad_output = grads[0].defined() ? grads[0] : torch::zeros_like(saved[2]);
    auto g = kernels::cpu::delta_rule_backward(grad_output, grads[1], q, saved[1], saved[2],
                                               saved[3], saved[4], f);
    return {g.q, g.k, g.v, g.log_decay, g.beta, g.initial_state};
  }
};

GatedDeltaRuleOutput fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& log_decay, const torch::Tensor& beta,
                           const torch::Tensor& state) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dk = q.size(3), dv = v.size(3);
  const auto r = [&](const torch::Tensor& x) { return rows(x).contiguous(); };
  const auto decay = log_decay.reshape({b * h, t}).contiguous();
  const auto state_rows = state.reshape({b * h, dk, dv});
  torch::Tensor output, final_state;
  if (detail::records_grad(q, k, v, log_decay, beta, state)) {
    auto out = FusedDeltaRule::apply(r(q), r(k), r(v), decay, r(beta), state_rows);
    output = out[0];
    final_state = out[1];
  } else {
    auto f = kernels::cpu::delta_rule_forward(r(q), r(k), r(v), decay, r(beta),
                                              state_rows.contiguous(), false);
    output = f.output;
    final_state = f.state;
  }
  return {output.view({b, h, t, dv}), final_state.view({b, h, dk, dv})};
}

}  // namespace

GatedDeltaRuleOutput gated_delta_rule(const torch::Tensor& query, const torch::Tensor& key,
                                      const torch::Tensor& value, const torch::Tensor& log_decay,
                                      const torch::Tensor& beta,
                                      const GatedDeltaRuleOptions& options) {
  const auto beta_full = check_arguments(query, key, value, log_decay, beta, options);
  const int64_t b = query.size(0), h = query.size(1), dk = query.size(3), dv = value.size(3);
  const auto state = options.initial_state().defined()
                         ? options.initial_state()
                         : torch::zeros({b, h, dk, dv}, value.options());
  const bool on_kernel = query.device().is_cpu() && options.backend() != Backend::Math;
  record_last_path(on_kernel ? Path::ChunkedFused : Path::Math);
  if (!on_kernel) return recurrence(query, key, value, log_decay, beta_full, state);
  if (query.scalar_type() == at::kFloat || query.scalar_type() == at::kDouble) {
    return fused(query, key, value, log_decay, beta_full, state);
  }
  // BFloat16: computed in float, rounded once.
  const auto f = [](const torch::Tensor& x) { return x.to(at::kFloat); };
  auto out = fused(f(query), f(key), f(value), f(log_decay), f(beta_full), f(state));
  return {out.output.to(query.scalar_type()), out.state.to(query.scalar_type())};
}

}  // namespace functional
}  // namespace attention
