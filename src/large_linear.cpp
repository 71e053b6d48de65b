// The modules' projections with their large tensors in memory that is cheap to fault in: in
// inference a reused workspace or huge pages; in training huge pages for the output and, in
// backward, the input's gradient. Autograd keeps a training step's projections until the
// backward, so they cannot come from a reused workspace; what they can avoid is being faulted in
// 4 KiB at a time on every step, which on these machines costs as much as a tenth of the step.
// The products themselves go to the generated kernels where they take them
// (kernels/cpu_large_gemm.h), and to LibTorch's BLAS everywhere else.

#include "detail.h"
#include "kernels/cpu_large_gemm.h"

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

// c = op(a) b (op(a) = a^T when trans_a) on the generated kernels; false, c untouched, where they
// do not take it (another device or type, a non-contiguous operand, sides not multiples of 16).
bool generated_mm(bool trans_a, const Tensor& a, const Tensor& b, Tensor& c) {
  const auto type = c.scalar_type();
  if (!c.device().is_cpu() || (type != at::kFloat && type != at::kDouble)) return false;
  const auto usable = [&](const Tensor& t) {
    return t.scalar_type() == type && t.device().is_cpu() && t.is_contiguous();
  };
  if (!usable(a) || !usable(b) || !usable(c)) return false;
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  return AT_DISPATCH_FLOATING_TYPES(type, "attention::generated_mm", [&] {
    return kernels::cpu::large_gemm<scalar_t>(
        trans_a, c.size(0), c.size(1), k, a.data_ptr<scalar_t>(), a.size(1), b.data_ptr<scalar_t>(),
        b.size(1), c.data_ptr<scalar_t>(), c.size(1));
  });
}

// out = x W^T + b, written into `out` (x's shape with weight.size(0) last); bias may be undefined.
void linear_into(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  auto out_rows = out.view({-1, weight.size(0)});
  // The generated kernels take B untransposed: W^T once per call (d_in x d_out, small beside x),
  // made only for the types they take.
  const bool generated_type = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  if (generated_type && generated_mm(false, rows_of(x), weight.t().contiguous(), out_rows)) {
    if (bias.defined()) out_rows.add_(bias);
    return;
  }
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
    Tensor g = grads[0].reshape({-1, weight.size(0)});
    Tensor dx, dw, db;
    if (torch::GradMode::is_enabled()) {  // create_graph: differentiable ops
      if (ctx->needs_input_grad(0)) dx = g.mm(weight).view(x.sizes());
      if (ctx->needs_input_grad(1)) dw = g.t().mm(rows_of(x));
    } else {
      // The upstream of a sum is one value expanded: made contiguous (one pass) for the products.
      if (!g.is_contiguous()) g = g.contiguous();
      if (ctx->needs_input_grad(0)) {
        dx = empty_large(x.sizes(), x.options());
        auto dx_rows = rows_of(dx);
        if (!generated_mm(false, g, weight, dx_rows)) at::mm_out(dx_rows, g, weight);
      }
      if (ctx->needs_input_grad(1)) {
        dw = torch::empty_like(weight, at::MemoryFormat::Contiguous);
        if (!generated_mm(true, g, rows_of(x), dw)) at::mm_out(dw, g.t(), rows_of(x));
      }
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
