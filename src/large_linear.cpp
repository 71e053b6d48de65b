// linear(x) in training with its large tensors (the output, and in backward the input's
// gradient) on huge pages. Autograd keeps a training step's projections until the backward, so
// they cannot come from a reused workspace; what they can avoid is being faulted in 4 KiB at a
// time on every step, which on these machines costs as much as a tenth of the step.

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

class LargeLinear : public torch::autograd::Function<LargeLinear> {
 public:
  // Without a bias, `bias` is an empty placeholder (LibTorch's autograd takes no undefined
  // inputs).
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                        const Tensor& weight, const Tensor& bias) {
    const bool with_bias = bias.numel() > 0;
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    Tensor out = empty_large(sizes, x.options());
    auto out_rows = out.view({-1, weight.size(0)});
    if (with_bias) {
      at::addmm_out(out_rows, bias, rows_of(x), weight.t());
    } else {
      at::mm_out(out_rows, rows_of(x), weight.t());
    }
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
        auto dx_rows = dx.view({-1, x.size(-1)});
        at::mm_out(dx_rows, g, weight);
      }
      if (ctx->needs_input_grad(1)) dw = g.t().mm(rows_of(x));
    }
    if (with_bias && ctx->needs_input_grad(2)) db = g.sum(0);
    return {dx, dw, db};
  }
};

}  // namespace

Tensor linear_large(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return LargeLinear::apply(x, weight, bias.defined() ? bias : torch::empty({0}, weight.options()));
}

}  // namespace detail
}  // namespace attention
