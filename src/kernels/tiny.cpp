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
void run(const Problem& p, const torch::Tensor& x_q, const torch::Tensor& x_kv,
         const torch::Tensor& w_q, const torch::Tensor& w_k, const torch::Tensor& w_v,
         torch::Tensor& out) {
  const int64_t batches = x_q.dim() == 3 ? x_q.size(0) : 1;
  const int64_t t_q = p.t_q, t_k = p.t_k, d_kq = p.d, d_v = p.dv;
  const int64_t d_in = x_q.size(-1), d_in_kv = x_kv.size(-1);
  const T scale = static_cast<T>(p.scale);
  constexpr T kInf = std::numeric_limits<T>::infinity();
  std::vector<T> q(t_q * d_kq), k(t_k * d_kq), v(t_k * d_v), s(t_k);
  for (int64_t b = 0; b < batches; ++b) {
    const T* xq = x_q.data_ptr<T>() + b * t_q * d_in;
    const T* xkv = x_kv.data_ptr<T>() + b * t_k * d_in_kv;
    T* o = out.data_ptr<T>() + b * t_q * d_v;
    project(xq, w_q.data_ptr<T>(), q.data(), t_q, d_in, d_kq);
    project(xkv, w_k.data_ptr<T>(), k.data(), t_k, d_in_kv, d_kq);
    project(xkv, w_v.data_ptr<T>(), v.data(), t_k, d_in_kv, d_v);
    for (int64_t i = 0; i < t_q; ++i) {
      const int64_t visible = visible_end(p, i);
      T max = -kInf;
      bool nan = false;
      for (int64_t j = 0; j < visible; ++j) {
        T dot = 0;
        for (int64_t c = 0; c < d_kq; ++c) dot += q[i * d_kq + c] * k[j * d_kq + c];
        s[j] = dot * scale;
        nan = nan || std::isnan(s[j]);
        max = std::max(max, s[j]);
      }
      std::fill(o + i * d_v, o + (i + 1) * d_v, T(0));
      // The same contract as every backend: NaN (or a +inf score) makes the row NaN; a row
      // whose scores are all -inf (or that sees no key) is zero.
      if (nan || max == kInf) {
        std::fill(o + i * d_v, o + (i + 1) * d_v, std::numeric_limits<T>::quiet_NaN());
        continue;
      }
      if (max == -kInf) continue;
      T total = 0;
      for (int64_t j = 0; j < visible; ++j) total += (s[j] = std::exp(s[j] - max));
      for (int64_t j = 0; j < visible; ++j) {
        const T weight = s[j] / total;
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
  for (const auto* t : {&x_q, &x_kv, &w_q, &w_k, &w_v}) {
    if (!t->is_contiguous() || t->size(-1) > kMaxWidth || t->size(-2) > kMaxTokens) return false;
  }
  return true;
}

torch::Tensor tiny(const Problem& p, const torch::Tensor& x_q, const torch::Tensor& x_kv,
                   const torch::Tensor& w_q, const torch::Tensor& w_k, const torch::Tensor& w_v) {
  auto shape = x_q.sizes().vec();
  shape.back() = p.dv;
  auto out = torch::empty(shape, x_q.options());
  if (x_q.scalar_type() == at::kFloat) {
    run<float>(p, x_q, x_kv, w_q, w_k, w_v, out);
  } else {
    run<double>(p, x_q, x_kv, w_q, w_k, w_v, out);
  }
  return out;
}

}  // namespace kernels
}  // namespace attention
