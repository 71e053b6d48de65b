#pragma once

// The differential tests of the Chunked kernels: the fused CPU kernels or the device-generic
// tiles called directly, against the Math backend through autograd.

#include <attention/functional.h>

#include "helpers.h"
#include "kernels/chunked.h"
#include "kernels/problem.h"

#include <torch/torch.h>

#include <algorithm>

namespace test {

/// An attention call's output and the gradients of its query, key and value.
struct AttentionGrads {
  torch::Tensor out, q, k, v;
};

/// Output and gradients for `upstream` through the Math backend (autograd).
inline AttentionGrads math_grads(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 attention::functional::ScaledDotProductAttentionOptions options,
                                 const torch::Tensor& upstream) {
  namespace F = attention::functional;
  auto q1 = q.detach().clone().requires_grad_(), k1 = k.detach().clone().requires_grad_(),
       v1 = v.detach().clone().requires_grad_();
  auto out = F::scaled_dot_product_attention(q1, k1, v1, options.backend(F::Backend::Math)).output;
  out.backward(upstream);
  return {out.detach(), q1.grad(), k1.grad(), v1.grad()};
}

/// The same from one of the Chunked kernels, forward and backward: the fused CPU kernels, or
/// the device-generic tiles.
inline AttentionGrads chunked_grads(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    const attention::functional::ScaledDotProductAttentionOptions& options,
    const torch::Tensor& upstream, bool fused) {
  namespace K = attention::kernels;
  auto p = K::make_problem(q, k, v, options, "test");
  p.mask = p.expanded_mask();
  auto [out, lse] = fused ? K::cpu_forward(p, q, k, v) : K::tiles_forward_with_lse(p, q, k, v);
  auto [dq, dk, dv] = fused ? K::cpu_backward(p, q, k, v, out, lse, upstream)
                            : K::tiles_backward_with_lse(p, q, k, v, out, lse, upstream);
  return {out, dq, dk, dv};
}

/// The largest difference between two results, over the output and the three gradients.
inline double worst(const AttentionGrads& a, const AttentionGrads& b) {
  return std::max({max_abs_diff(a.out, b.out), max_abs_diff(a.q, b.q), max_abs_diff(a.k, b.k),
                   max_abs_diff(a.v, b.v)});
}

}  // namespace test
