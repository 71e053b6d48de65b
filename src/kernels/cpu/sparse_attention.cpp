// The fused top-k attention of kernels/cpu/sparse_attention.h. The forward runs over (batch,
// head) rows; the backward over (batch, key/value head) rows, so that the gradients of a head's
// keys and values, which many queries add to, belong to one thread.

#include "kernels/cpu/sparse_attention.h"

#include "kernels/cpu/exp.h"
#include "platform/compiler.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

struct Sizes {
  int64_t b, h, hkv, t, s, d, dv, k;
};

Sizes sizes_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
               const torch::Tensor& indices) {
  return {q.size(0), q.size(1), k.size(1), q.size(2),
          k.size(2), q.size(3), v.size(3), indices.size(2)};
}

template <typename T>
ATTENTION_ALWAYS_INLINE T dot(const T* a, const T* b, int64_t n) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

template <typename T>
ATTENTION_ALWAYS_INLINE void axpy(T alpha, const T* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

// Selected keys lie anywhere in the head's keys, where no hardware prefetcher looks: the row
// `kAhead` selections on is asked for while this one is computed (each row is a few cache lines).
constexpr int64_t kAhead = 4;

template <typename T>
ATTENTION_ALWAYS_INLINE void prefetch_row(const T* row, int64_t n) {
  for (int64_t c = 0; c < n; c += 64 / static_cast<int64_t>(sizeof(T))) {
    __builtin_prefetch(row + c);
  }
}

// The pointers of one call.
template <typename T>
struct Operands {
  const T *q, *k, *v;
  const int64_t* indices;
};

// One query row: scores of its selected keys into `s` (their positions into `at`), softmax,
// weighted values into `out`. Returns the row's log-sum-exp.
template <typename T>
ATTENTION_ALWAYS_INLINE T forward_row(const Sizes& z, const T* q, const T* keys, const T* values,
                                      const int64_t* idx, T scale, T* s, int64_t* at, T* out) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  int64_t n = 0;
  T max = -kInf;
  bool nan = false;
  for (int64_t j = 0; j < z.k; ++j) {
    if (j + kAhead < z.k && idx[j + kAhead] >= 0) prefetch_row(keys + idx[j + kAhead] * z.d, z.d);
    if (idx[j] < 0) continue;
    at[n] = idx[j];
    s[n] = scale * dot(q, keys + idx[j] * z.d, z.d);
    nan |= s[n] != s[n];
    max = std::max(max, s[n]);
    ++n;
  }
  // A NaN score, or a +inf one, leaves the softmax undefined: NaN, as the whole-row softmax.
  const T fill = nan || max == kInf ? std::numeric_limits<T>::quiet_NaN() : T(0);
  std::fill(out, out + z.dv, fill);
  if (n == 0) return -kInf;
  if (fill != T(0)) return fill;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_nonpositive(s[j] - max);
    sum += s[j];
  }
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row(values + at[j + kAhead] * z.dv, z.dv);
    axpy(s[j] / sum, values + at[j] * z.dv, out, z.dv);
  }
  return max + std::log(sum);
}

template <typename T>
ATTENTION_ALWAYS_INLINE void forward_head(const Sizes& z, int64_t bh, const Operands<T>& in,
                                          T scale, T* out, T* lse, T* s, int64_t* at) {
  const int64_t b = bh / z.h, h = bh % z.h, kv = h / (z.h / z.hkv);
  const T* keys = in.k + (b * z.hkv + kv) * z.s * z.d;
  const T* values = in.v + (b * z.hkv + kv) * z.s * z.dv;
  for (int64_t t = 0; t < z.t; ++t) {
    const T l =
        forward_row(z, in.q + (bh * z.t + t) * z.d, keys, values, in.indices + (b * z.t + t) * z.k,
                    scale, s, at, out + (bh * z.t + t) * z.dv);
    if (lse != nullptr) lse[bh * z.t + t] = l;
  }
}

ATTENTION_MULTIVERSION void forward_head_f32(const Sizes& z, int64_t bh, const Operands<float>& in,
                                             float scale, float* out, float* lse, float* s,
                                             int64_t* at) {
  forward_head(z, bh, in, scale, out, lse, s, at);
}
ATTENTION_MULTIVERSION void forward_head_f64(const Sizes& z, int64_t bh, const Operands<double>& in,
                                             double scale, double* out, double* lse, double* s,
                                             int64_t* at) {
  forward_head(z, bh, in, scale, out, lse, s, at);
}
void forward_head_any(const Sizes& z, int64_t bh, const Operands<float>& in, float scale,
                      float* out, float* lse, float* s, int64_t* at) {
  forward_head_f32(z, bh, in, scale, out, lse, s, at);
}
void forward_head_any(const Sizes& z, int64_t bh, const Operands<double>& in, double scale,
                      double* out, double* lse, double* s, int64_t* at) {
  forward_head_f64(z, bh, in, scale, out, lse, s, at);
}

// The gradients a (batch, key/value head) row writes.
template <typename T>
struct Gradients {
  const T *grad_out, *out, *lse;
  T *q, *k, *v;
};

// The query heads of one key/value head, every token: dq of their rows, and their additions to
// the head's dk and dv. `p` and `at` hold a row's probabilities and key positions.
template <typename T>
ATTENTION_ALWAYS_INLINE void backward_kv_head(const Sizes& z, int64_t bkv, const Operands<T>& in,
                                              T scale, const Gradients<T>& g, T* p, int64_t* at) {
  const int64_t b = bkv / z.hkv, kv = bkv % z.hkv, group = z.h / z.hkv;
  const T* keys = in.k + bkv * z.s * z.d;
  const T* values = in.v + bkv * z.s * z.dv;
  T* dk = g.k + bkv * z.s * z.d;
  T* dv = g.v + bkv * z.s * z.dv;
  for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
    const int64_t bh = b * z.h + h;
    for (int64_t t = 0; t < z.t; ++t) {
      const int64_t row = bh * z.t + t;
      const T* q = in.q + row * z.d;
      const T* gy = g.grad_out + row * z.dv;
      T* dq = g.q + row * z.d;
      std::fill(dq, dq + z.d, T(0));
      const T l = g.lse[row];
      if (l == -std::numeric_limits<T>::infinity()) continue;  // no key: no gradient
      const T delta = dot(gy, g.out + row * z.dv, z.dv);
      const int64_t* idx = in.indices + (b * z.t + t) * z.k;
      int64_t n = 0;
      for (int64_t j = 0; j < z.k; ++j) {
        if (idx[j] < 0) continue;
        at[n] = idx[j];
        p[n] = scale * dot(q, keys + idx[j] * z.d, z.d) - l;
        ++n;
      }
      // A row whose forward was NaN passes NaN on, to q and to every key and value it read.
      const bool nan = l != l;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) p[j] = nan ? l : exp_nonpositive(p[j]);
      for (int64_t j = 0; j < n; ++j) {
        const T* key = keys + at[j] * z.d;
        const T ds = p[j] * (dot(gy, values + at[j] * z.dv, z.dv) - delta) * scale;
        axpy(ds, key, dq, z.d);
        axpy(ds, q, dk + at[j] * z.d, z.d);
        axpy(p[j], gy, dv + at[j] * z.dv, z.dv);
      }
    }
  }
}

ATTENTION_MULTIVERSION void backward_kv_head_f32(const Sizes& z, int64_t bkv,
                                                 const Operands<float>& in, float scale,
                                                 const Gradients<float>& g, float* p, int64_t* at) {
  backward_kv_head(z, bkv, in, scale, g, p, at);
}
ATTENTION_MULTIVERSION void backward_kv_head_f64(const Sizes& z, int64_t bkv,
                                                 const Operands<double>& in, double scale,
                                                 const Gradients<double>& g, double* p,
                                                 int64_t* at) {
  backward_kv_head(z, bkv, in, scale, g, p, at);
}
void backward_kv_head_any(const Sizes& z, int64_t bkv, const Operands<float>& in, float scale,
                          const Gradients<float>& g, float* p, int64_t* at) {
  backward_kv_head_f32(z, bkv, in, scale, g, p, at);
}
void backward_kv_head_any(const Sizes& z, int64_t bkv, const Operands<double>& in, double scale,
                          const Gradients<double>& g, double* p, int64_t* at) {
  backward_kv_head_f64(z, bkv, in, scale, g, p, at);
}

}  // namespace

torch::Tensor sparse_attention_forward(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, const torch::Tensor& indices,
                                       double scale, const torch::Tensor& lse) {
  const Sizes z = sizes_of(q, k, v, indices);
  auto out = torch::empty({z.b, z.h, z.t, z.dv}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sparse_attention_forward", [&] {
    const Operands<scalar_t> in{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                v.data_ptr<scalar_t>(), indices.data_ptr<int64_t>()};
    scalar_t* lse_data = lse.defined() ? lse.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, z.b * z.h, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> s(z.k);
      std::vector<int64_t> at(z.k);
      for (int64_t bh = begin; bh < end; ++bh) {
        forward_head_any(z, bh, in, static_cast<scalar_t>(scale), out.data_ptr<scalar_t>(),
                         lse_data, s.data(), at.data());
      }
    });
  });
  return out;
}

SparseAttentionGradients sparse_attention_backward(const torch::Tensor& grad_output,
                                                   const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v,
                                                   const torch::Tensor& indices,
                                                   const torch::Tensor& output,
                                                   const torch::Tensor& lse, double scale) {
  const Sizes z = sizes_of(q, k, v, indices);
  SparseAttentionGradients g{torch::empty_like(q), torch::zeros_like(k), torch::zeros_like(v)};
  const auto gy = grad_output.contiguous();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sparse_attention_backward", [&] {
    const Operands<scalar_t> in{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                v.data_ptr<scalar_t>(), indices.data_ptr<int64_t>()};
    const Gradients<scalar_t> out{gy.data_ptr<scalar_t>(),  output.data_ptr<scalar_t>(),
                                  lse.data_ptr<scalar_t>(), g.q.data_ptr<scalar_t>(),
                                  g.k.data_ptr<scalar_t>(), g.v.data_ptr<scalar_t>()};
    at::parallel_for(0, z.b * z.hkv, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> p(z.k);
      std::vector<int64_t> at(z.k);
      for (int64_t bkv = begin; bkv < end; ++bkv) {
        backward_kv_head_any(z, bkv, in, static_cast<scalar_t>(scale), out, p.data(), at.data());
      }
    });
  });
  return g;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
