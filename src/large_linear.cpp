// The modules' projections with their large tensors in memory that is cheap to fault in: in
// inference a reused workspace or huge pages; in training huge pages for the output and, in
// backward, the input's gradient. Autograd keeps a training step's projections until the
// backward, so they cannot come from a reused workspace; what they can avoid is being faulted in
// 4 KiB at a time on every step, which on these machines costs as much as a tenth of the step.

#include "detail.h"

#include <torch/autograd.h>
#include <torch/torch.h>

namespace attention {
namespace detail {
namespace {

using torch::Tensor;

// rows: x as (rows, in) without a copy (x is contiguous here).
Tensor rows_of(const Tensor& x) {
  return x.view({-1, x.size(-1)});
}

// out = x W^T + b, written into `out` (x's shape with weight.size(0) last); bias may be undefined.
void linear_into(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  auto out_rows = out.view({-1, weight.size(0)});
  if (bias.defined()) {
    at::addmm_out(out_rows, bias, rows_of(x), weight.t());
  } else {
    at::mm_out(out_rows, rows_of(x), weight.t());
  }
}

// x's sizes with the last one `features`.
std::vector<int64_t> output_sizes(const Tensor& x, int64_t features) {
  auto sizes = x.sizes().vec();
  sizes.back() = features;
  return sizes;
}

class LargeLinear : public torch::autograd::Function<LargeLinear> {
 public:
  // Without a bias, `bias` is an empty placeholder (LibTorch's autograd takes no undefined
  // inputs).
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                        const Tensor& weight, const Tensor& bias) {
    const bool with_bias = bias.numel() > 0;
    Tensor out = empty_large(output_sizes(x, weight.size(0)), x.options());
    linear_into(out, x, weight, with_bias ? bias : Tensor());
    ctx->save_for_backward({x, weight});
    ctx->saved_data["with_bias"] = with_bias;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1];
    const bool with_bias = ctx->saved_data["with_bias"].toBool();
    const Tensor g = grads[0].reshape({-1, weight.size(0)});
    Tensor dx, dw, db;
    if (torch::GradMode::is_enabled()) {  // create_graph: differentiable ops
      if (ctx->needs_input_grad(0)) dx = g.mm(weight).view(x.sizes());
      if (ctx->needs_input_grad(1)) dw = g.t().mm(rows_of(x));
    } else {
      if (ctx->needs_input_grad(0)) {
        dx = empty_large(x.sizes(), x.options());
        auto dx_rows = rows_of(dx);
        at::mm_out(dx_rows, g, weight);
      }
      if (ctx->needs_input_grad(1)) dw = g.t().mm(rows_of(x));
    }
    if (with_bias && ctx->needs_input_grad(2)) db = g.sum(0);
    return {dx, dw, db};
  }
};

}  // namespace

Tensor project(const torch::nn::Linear& linear, const Tensor& x, Workspace* workspace, int slot) {
  const auto& weight = linear->weight;
  const auto& bias = linear->bias;
  if (!x.is_contiguous()) return torch::nn::functional::linear(x, weight, bias);
  if (records_grad(x, weight, bias)) {
    return x.device().is_cpu() ? linear_large(x, weight, bias)
                               : torch::nn::functional::linear(x, weight, bias);
  }
  const auto sizes = output_sizes(x, weight.size(0));
  Tensor out =
      workspace ? workspace->take(slot, sizes, x.options()) : empty_large(sizes, x.options());
  linear_into(out, x, weight, bias);
  return out;
}

Tensor linear_large(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return LargeLinear::apply(x, weight, bias.defined() ? bias : torch::empty({0}, weight.options()));
}

}  // namespace detail
}  // namespace attention
