// The article-sized direct path: at a 6 x 3 input the work is a few hundred multiply-adds and
// the time is LibTorch's per-op dispatch (about 1 us per op, 7 ops). For tiny CPU inputs that
// need no gradient, the projections, scores, softmax and weighted sum run here in plain loops,
// with one allocation for the output.

#include "kernels/kernels.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attention {
namespace kernels {
namespace {

constexpr int64_t kMaxTokens = 64;
constexpr int64_t kMaxWidth = 64;

template <typename T>
void project(const T* x, const T* w, T* out, int64_t rows, int64_t d_in, int64_t d_out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d_out; ++c) {
      T sum = 0;
      for (int64_t i = 0; i < d_in; ++i) sum += x[r * d_in + i] * w[i * d_out + c];
      out[r * d_out + c] = sum;
    }
  }
}

template <typename T>
void run(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
         const torch::Tensor& w_k, const torch::Tensor& w_v, bool causal, torch::Tensor& out) {
  const int64_t batches = x_q.dim() == 3 ? x_q.size(0) : 1;
  const int64_t t_q = x_q.size(-2), t_k = x_kv.size(-2);
  const int64_t d_in = x_q.size(-1), d_in_kv = x_kv.size(-1);
  const int64_t d_kq = w_q.size(1), d_v = w_v.size(1);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d_kq)));
  std::vector<T> q(t_q * d_kq), k(t_k * d_kq), v(t_k * d_v), p(t_k);
  for (int64_t b = 0; b < batches; ++b) {
    const T* xq = x_q.data_ptr<T>() + b * t_q * d_in;
    const T* xkv = x_kv.data_ptr<T>() + b * t_k * d_in_kv;
    T* o = out.data_ptr<T>() + b * t_q * d_v;
    project(xq, w_q.data_ptr<T>(), q.data(), t_q, d_in, d_kq);
    project(xkv, w_k.data_ptr<T>(), k.data(), t_k, d_in_kv, d_kq);
    project(xkv, w_v.data_ptr<T>(), v.data(), t_k, d_in_kv, d_v);
    for (int64_t i = 0; i < t_q; ++i) {
      // Queries are the last t_q positions, as in the functional layer.
      const int64_t visible = causal ? std::clamp<int64_t>(i + 1 + t_k - t_q, 0, t_k) : t_k;
      T max = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        T s = 0;
        for (int64_t c = 0; c < d_kq; ++c) s += q[i * d_kq + c] * k[j * d_kq + c];
        p[j] = s * scale;
        max = std::max(max, p[j]);
      }
      T total = 0;
      for (int64_t j = 0; j < visible; ++j) total += (p[j] = std::exp(p[j] - max));
      for (int64_t c = 0; c < d_v; ++c) o[i * d_v + c] = 0;
      for (int64_t j = 0; j < visible; ++j) {
        const T weight = p[j] / total;
        for (int64_t c = 0; c < d_v; ++c) o[i * d_v + c] += weight * v[j * d_v + c];
      }
    }
  }
}

}  // namespace

bool tiny_applies(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
                  const torch::Tensor& w_k, const torch::Tensor& w_v) {
  const auto dtype = x_q.scalar_type();
  if (!x_q.device().is_cpu() || (dtype != at::kFloat && dtype != at::kDouble)) return false;
  if (torch::GradMode::is_enabled() &&
      (x_q.requires_grad() || x_kv.requires_grad() || w_q.requires_grad() || w_k.requires_grad() ||
       w_v.requires_grad())) {
    return false;
  }
  for (const auto* t : {&x_q, &x_kv, &w_q, &w_k, &w_v}) {
    if (!t->is_contiguous() || t->size(-1) > kMaxWidth || t->size(-2) > kMaxTokens) return false;
  }
  return true;
}

torch::Tensor tiny(const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& w_q,
                   const torch::Tensor& w_k, const torch::Tensor& w_v, bool causal) {
  auto shape = x_q.sizes().vec();
  shape.back() = w_v.size(1);
  auto out = torch::empty(shape, x_q.options());
  if (x_q.scalar_type() == at::kFloat) {
    run<float>(x_q, x_kv, w_q, w_k, w_v, causal, out);
  } else {
    run<double>(x_q, x_kv, w_q, w_k, w_v, causal, out);
  }
  return out;
}

}  // namespace kernels
}  // namespace attention
