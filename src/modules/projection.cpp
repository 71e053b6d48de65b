// The modules' projections with their large tensors in memory that is cheap to fault in: in
// inference a reused workspace or huge pages; in training huge pages for the output and, in
// backward, the input's gradient. Autograd keeps a training step's projections until the
// backward, so they cannot come from a reused workspace; what they can avoid is being faulted in
// 4 KiB at a time on every step, which on these machines costs as much as a tenth of the step.
// The products themselves go to the generated kernels where those beat this machine's BLAS and
// take the shapes (gemm/large_gemm.h), and to LibTorch's BLAS everywhere else. bfloat16 on a
// processor without bfloat16 products (where the library's own kernels widen it:
// kernels/cpu/bf16_products.h) is widened into float's products too: LibTorch's bfloat16
// products emulate them there, at half float's rate or less. The conversions are the library's
// own (kernels/cpu/bf16_convert.h: LibTorch's copy_ converts at a third of the memory's rate),
// into memory the large-buffer cache keeps. A self-attention's three widened projections are one
// product by their weights stacked, forward and backward: the product packs x (and, backward,
// reads the upstreams) once, where three products would each pass over it.

#include "modules/projection.h"
#include "checks.h"
#include "gemm/large_gemm.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/tile.h"
#include "memory/empty_large.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <array>

namespace attention {
namespace detail {
namespace {

using torch::Tensor;

// rows: x as (rows, in) without a copy (x is contiguous here).
Tensor rows_of(const Tensor& x) {
  return x.view({-1, x.size(-1)});
}

// The fewest rows of x for which a product takes a route that copies its weight (W^T for the
// generated kernels, W in float for widened bfloat16): a decoding step's few rows take BLAS on W
// itself. At d = 2048 a copy of W^T per projection (16 MB, fresh pages each call) took 4x the
// rest of a 16-head step at T = 4096.
constexpr int64_t kCopiedWeightMinRows = 128;

// Whether a projection of `rows` rows of bfloat16 `x` is widened into float's products and its
// result rounded once: on the CPU where the library widens bfloat16 for its own kernels (no
// bfloat16 products, or ATTENTION_CPU_BF16=widened).
bool widens_bf16(const Tensor& x, int64_t rows) {
  return x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && rows >= kCopiedWeightMinRows &&
         kernels::cpu::bf16_products() == nullptr;
}

Tensor widened(const Tensor& t) {
  return t.defined() ? kernels::cpu::widened(t) : t;
}

// A float result of the widened route rounded to bfloat16 once.
Tensor rounded(const Tensor& t) {
  return kernels::cpu::converted(t, at::kBFloat16);
}

// c = op(a) b (op(a) = a^T when trans_a), or c += op(a) b when `accumulate`, on the generated
// kernels; false, c untouched, where they do not take it (BLAS preferred on this machine, another
// device or type, a non-contiguous operand, sides not multiples of 16).
bool generated_mm(bool trans_a, const Tensor& a, const Tensor& b, Tensor& c,
                  bool accumulate = false) {
  if (!kernels::cpu::large_gemm_preferred()) return false;
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
        b.size(1), c.data_ptr<scalar_t>(), c.size(1), accumulate);
  });
}

// out = x W^T + b, written into `out` (x's shape with weight.size(0) last); bias may be undefined.
void linear_into(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  auto out_rows = out.view({-1, weight.size(0)});
  if (widens_bf16(x, x.numel() / x.size(-1))) {
    Tensor wide = empty_large(out.sizes(), out.options().dtype(at::kFloat));
    linear_into(wide, widened(x), widened(weight), widened(bias));
    kernels::cpu::copy_converted(out, wide);
    return;
  }
  // The generated kernels take B untransposed: W^T once per call, made only where they are the
  // route, for the types they take, and for enough rows of x that the copy is small beside the
  // product.
  const bool generated_type = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  if (generated_type && x.numel() >= kCopiedWeightMinRows * x.size(-1) &&
      kernels::cpu::large_gemm_preferred() &&
      generated_mm(false, rows_of(x), weight.t().contiguous(), out_rows)) {
    if (bias.defined()) out_rows.add_(bias);
    return;
  }
  if (bias.defined()) {
    at::addmm_out(out_rows, bias, rows_of(x), weight.t());
  } else {
    at::mm_out(out_rows, rows_of(x), weight.t());
  }
}

// The weights of several projections of one x widened into one float matrix, one above the
// other (sum of their outputs x inputs), and their biases into one vector (zeros for a
// projection without one; undefined when none has one).
struct Stacked {
  Tensor weight, bias;
  std::array<int64_t, 3> first;    // the first row of each projection's weights
  std::array<int64_t, 3> outputs;  // each projection's rows (its outputs)
};

Stacked stacked_widened(const std::array<Tensor, 3>& weights, const std::array<Tensor, 3>& biases) {
  Stacked s;
  int64_t rows = 0;
  for (size_t i = 0; i < 3; ++i) {
    s.first[i] = rows;
    s.outputs[i] = weights[i].size(0);
    rows += s.outputs[i];
  }
  const auto options = weights[0].options().dtype(at::kFloat);
  s.weight = torch::empty({rows, weights[0].size(1)}, options);
  const bool any_bias = biases[0].defined() || biases[1].defined() || biases[2].defined();
  if (any_bias) s.bias = torch::zeros({rows}, options);
  for (size_t i = 0; i < 3; ++i) {
    Tensor w = s.weight.narrow(0, s.first[i], s.outputs[i]);
    kernels::cpu::copy_converted(w, weights[i]);
    if (biases[i].defined()) {
      Tensor b = s.bias.narrow(0, s.first[i], s.outputs[i]);
      kernels::cpu::copy_converted(b, biases[i]);
    }
  }
  return s;
}

// The three projections of one x into out[i] = x W_i^T + b_i. Where bfloat16 is widened, x is
// widened once and the three are one product by the stacked weights: the product packs x once,
// not once per projection, and its float result is rounded into the three outputs in one pass.
void linear3_into(std::array<Tensor, 3>& out, const Tensor& x, const std::array<Tensor, 3>& weights,
                  const std::array<Tensor, 3>& biases) {
  const int64_t rows = x.numel() / x.size(-1);
  if (!widens_bf16(x, rows)) {
    for (size_t i = 0; i < 3; ++i) linear_into(out[i], x, weights[i], biases[i]);
    return;
  }
  const Stacked stacked = stacked_widened(weights, biases);
  const int64_t width = stacked.weight.size(0);
  Tensor wide = empty_large({rows, width}, x.options().dtype(at::kFloat));
  linear_into(wide, rows_of(widened(x)), stacked.weight, stacked.bias);
  for (size_t i = 0; i < 3; ++i) {
    Tensor rows_i = out[i].view({rows, stacked.outputs[i]});
    kernels::cpu::copy_converted(rows_i, wide.narrow(1, stacked.first[i], stacked.outputs[i]));
  }
}

// x's sizes with the last one `features`.
std::vector<int64_t> output_sizes(const Tensor& x, int64_t features) {
  auto sizes = x.sizes().vec();
  sizes.back() = features;
  return sizes;
}

// The gradients of y = x W^T + b for the upstream `grad`, those asked for: x's summed into `dx`
// (made on first use, so several projections of one x write one gradient), W's into `dw`, b's
// into `db`.
void linear_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, bool need_x,
                     bool need_weight, bool need_bias, Tensor& dx, Tensor& dw, Tensor& db) {
  Tensor g = grad.reshape({-1, weight.size(0)});
  if (torch::GradMode::is_enabled()) {  // create_graph: differentiable ops
    if (need_x) {
      const Tensor d = g.mm(weight).view(x.sizes());
      dx = dx.defined() ? dx + d : d;
    }
    if (need_weight) dw = g.t().mm(rows_of(x));
    if (need_bias) db = g.sum(0);
    return;
  }
  if (widens_bf16(g, g.size(0))) {
    // In float, each gradient rounded once (x's added to what the other projections gave it).
    Tensor dx_wide, dw_wide, db_wide;
    linear_backward(widened(g), widened(x), widened(weight), need_x, need_weight, need_bias,
                    dx_wide, dw_wide, db_wide);
    if (need_x) dx = dx.defined() ? dx.add_(dx_wide) : rounded(dx_wide);
    if (need_weight) dw = rounded(dw_wide);
    if (need_bias) db = rounded(db_wide);
    return;
  }
  // The upstream of a sum is one value expanded: made contiguous (one pass) for the products.
  if (!g.is_contiguous()) g = empty_large(g.sizes(), g.options()).copy_(g);
  if (need_x) {
    const bool accumulate = dx.defined();
    if (!accumulate) dx = empty_large(x.sizes(), x.options());
    auto dx_rows = rows_of(dx);
    if (!generated_mm(false, g, weight, dx_rows, accumulate)) {
      if (accumulate) {
        at::addmm_out(dx_rows, dx_rows, g, weight);
      } else {
        at::mm_out(dx_rows, g, weight);
      }
    }
  }
  if (need_weight) {
    dw = torch::empty_like(weight, at::MemoryFormat::Contiguous);
    if (!generated_mm(true, g, rows_of(x), dw)) at::mm_out(dw, g.t(), rows_of(x));
  }
  if (need_bias) db = g.sum(0);
}

// Without a bias, `bias` is an empty placeholder (LibTorch's autograd takes no undefined inputs);
// it records no gradient, so none is asked of it.
Tensor bias_or_none(const Tensor& bias) {
  return bias.numel() > 0 ? bias : Tensor();
}

Tensor placeholder_for(const Tensor& bias, const Tensor& weight) {
  return bias.defined() ? bias : torch::empty({0}, weight.options());
}

class LargeLinear : public torch::autograd::Function<LargeLinear> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                        const Tensor& weight, const Tensor& bias) {
    Tensor out = empty_large(output_sizes(x, weight.size(0)), x.options());
    linear_into(out, x, weight, bias_or_none(bias));
    ctx->save_for_backward({x, weight});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    Tensor dx, dw, db;
    linear_backward(grads[0], saved[0], saved[1], ctx->needs_input_grad(0),
                    ctx->needs_input_grad(1), ctx->needs_input_grad(2), dx, dw, db);
    return {dx, dw, db};
  }
};

// The backward of three widened bfloat16 projections of one x as one product each way, by their
// weights stacked (stacked_widened()): the three upstreams widened side by side into one float
// matrix G, x's gradient G W (its three parts summed inside one product, rounded once), the
// weights' G^T x (x packed once) and the biases' G's column sums, each part rounded once.
torch::autograd::variable_list stacked_backward(torch::autograd::AutogradContext* ctx,
                                                const torch::autograd::variable_list& saved,
                                                const torch::autograd::variable_list& grads) {
  const Tensor& x = saved[0];
  const int64_t rows = x.numel() / x.size(-1);
  const Stacked stacked = stacked_widened({saved[1], saved[2], saved[3]}, {});
  const int64_t width = stacked.weight.size(0);
  Tensor g = empty_large({rows, width}, x.options().dtype(at::kFloat));
  for (size_t i = 0; i < 3; ++i) {
    Tensor part = g.narrow(1, stacked.first[i], stacked.outputs[i]);
    kernels::cpu::copy_converted(part, grads[i].reshape({rows, stacked.outputs[i]}));
  }
  bool need_weight = false, need_bias = false;
  for (size_t i = 0; i < 3; ++i) {
    need_weight = need_weight || ctx->needs_input_grad(1 + 2 * i);
    need_bias = need_bias || ctx->needs_input_grad(2 + 2 * i);
  }
  Tensor dx, dw, db;
  linear_backward(g, widened(x), stacked.weight, ctx->needs_input_grad(0), need_weight, need_bias,
                  dx, dw, db);
  torch::autograd::variable_list result(7);
  if (dx.defined()) result[0] = rounded(dx);
  for (size_t i = 0; i < 3; ++i) {
    const int64_t n = stacked.outputs[i];
    if (ctx->needs_input_grad(1 + 2 * i))
      result[1 + 2 * i] = rounded(dw.narrow(0, stacked.first[i], n));
    if (ctx->needs_input_grad(2 + 2 * i))
      result[2 + 2 * i] = rounded(db.narrow(0, stacked.first[i], n));
  }
  return result;
}

// Three projections of one x (a self-attention's queries, keys and values) as one node, whose
// backward sums the three products into one gradient of x. As three nodes they would hand
// autograd three gradients of x to add, and LibTorch 1.13's autograd adds each into fresh memory
// (two passes over B*T*d_in elements and two fresh buffers per step).
class LargeLinear3 : public torch::autograd::Function<LargeLinear3> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& x, const Tensor& w0, const Tensor& b0,
                                                const Tensor& w1, const Tensor& b1,
                                                const Tensor& w2, const Tensor& b2) {
    std::array<Tensor, 3> out;
    const std::array<Tensor, 3> weights{w0, w1, w2};
    for (size_t i = 0; i < 3; ++i) {
      out[i] = empty_large(output_sizes(x, weights[i].size(0)), x.options());
    }
    linear3_into(out, x, weights, {bias_or_none(b0), bias_or_none(b1), bias_or_none(b2)});
    ctx->save_for_backward({x, w0, w1, w2});
    ctx->set_materialize_grads(false);  // an output left out of the loss: no zeros multiplied
    return {out[0], out[1], out[2]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    // Where bfloat16 is widened (and the gradients are not differentiated): all three upstreams
    // as one product (stacked_backward()); with an output left out of the loss, x widened once
    // and its gradient summed over the projections that took part, in float, rounded once.
    const bool widen = !torch::GradMode::is_enabled() && widens_bf16(x, x.numel() / x.size(-1));
    if (widen && grads[0].defined() && grads[1].defined() && grads[2].defined()) {
      return stacked_backward(ctx, saved, grads);
    }
    torch::autograd::variable_list result(7);
    const Tensor x_used = widen ? widened(x) : x;
    Tensor dx;
    for (int i = 0; i < 3; ++i) {
      if (!grads[i].defined()) continue;  // an output that took no part in the loss
      Tensor dw, db;
      linear_backward(widen ? widened(grads[i]) : grads[i], x_used,
                      widen ? widened(saved[1 + i]) : saved[1 + i], ctx->needs_input_grad(0),
                      ctx->needs_input_grad(1 + 2 * i), ctx->needs_input_grad(2 + 2 * i), dx, dw,
                      db);
      result[1 + 2 * i] = widen && dw.defined() ? rounded(dw) : dw;
      result[2 + 2 * i] = widen && db.defined() ? rounded(db) : db;
    }
    result[0] = widen && dx.defined() ? rounded(dx) : dx;
    return result;
  }
};

// The output of an inference projection of x by `weight`: the workspace's slot, or a large
// temporary without one.
Tensor inference_output(const Tensor& x, const Tensor& weight, Workspace* workspace, int slot) {
  const auto sizes = output_sizes(x, weight.size(0));
  return workspace ? workspace->take(slot, sizes, x.options()) : empty_large(sizes, x.options());
}

// Whether projections of x by `params` train through the autograd functions above: a gradient
// recorded on a contiguous CPU x (elsewhere linear() records its own).
template <typename... Params>
bool trains_large(const Tensor& x, const Params&... params) {
  return x.is_contiguous() && x.device().is_cpu() && records_grad(x, params...);
}

}  // namespace

Tensor project(const torch::nn::Linear& linear, const Tensor& x, Workspace* workspace, int slot) {
  const auto& weight = linear->weight;
  const auto& bias = linear->bias;
  if (trains_large(x, weight, bias)) return linear_large(x, weight, bias);
  if (!x.is_contiguous() || records_grad(x, weight, bias)) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  Tensor out = inference_output(x, weight, workspace, slot);
  linear_into(out, x, weight, bias);
  return out;
}

Tensor linear_large(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return LargeLinear::apply(x, weight, placeholder_for(bias, weight));
}

std::array<Tensor, 3> project_qkv(const torch::nn::Linear& query, const torch::nn::Linear& key,
                                  const torch::nn::Linear& value, const Tensor& x,
                                  const Tensor& source, Workspace* workspace) {
  const auto& w0 = query->weight;
  const auto& w1 = key->weight;
  const auto& w2 = value->weight;
  if (source.is_same(x) && trains_large(x, w0, query->bias, w1, key->bias, w2, value->bias)) {
    const auto out =
        LargeLinear3::apply(x, w0, placeholder_for(query->bias, w0), w1,
                            placeholder_for(key->bias, w1), w2, placeholder_for(value->bias, w2));
    return {out[0], out[1], out[2]};
  }
  // Inference on one contiguous x: the three projections at once (widened once where bfloat16
  // widens).
  if (source.is_same(x) && x.is_contiguous() &&
      !records_grad(x, w0, query->bias, w1, key->bias, w2, value->bias)) {
    const std::array<Tensor, 3> weights{w0, w1, w2};
    std::array<Tensor, 3> out;
    for (int i = 0; i < 3; ++i) out[i] = inference_output(x, weights[i], workspace, i);
    linear3_into(out, x, weights, {query->bias, key->bias, value->bias});
    return out;
  }
  return {project(query, x, workspace, 0), project(key, source, workspace, 1),
          project(value, source, workspace, 2)};
}

}  // namespace detail
}  // namespace attention
