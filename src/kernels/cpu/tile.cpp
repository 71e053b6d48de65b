#include "kernels/cpu/tile.h"

#include "kernels/cpu/bf16_convert.h"
#include "memory/empty_large.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace attention {
namespace kernels {
namespace cpu {

Problem with_float_mask(const Problem& p) {
  Problem widened = p;
  if (p.mask.defined() && p.mask.is_floating_point()) widened.mask = p.mask.to(at::kFloat);
  return widened;
}

torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes) {
  return empty_in_layout_of(like, sizes, like.scalar_type());
}

torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes,
                                 at::ScalarType dtype) {
  std::vector<int64_t> order(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end() - 1,
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> permuted(like.dim()), inverse(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) {
    permuted[i] = sizes[order[i]];
    inverse[order[i]] = i;
  }
  return detail::empty_large(permuted, like.options().dtype(dtype)).permute(inverse);
}

torch::Tensor converted(const torch::Tensor& t, at::ScalarType dtype) {
  if (t.scalar_type() == dtype) return t;
  torch::Tensor out = empty_in_layout_of(t, t.sizes(), dtype);
  copy_converted(out, t);
  return out;
}

// Rows a thread converts at a time, where copy_converted() goes row by row.
constexpr int64_t kConvertedRowsGrain = 64;

void copy_converted(torch::Tensor& out, const torch::Tensor& t) {
  // The library's own conversions are bfloat16 to float and back, on the CPU.
  const auto from = t.scalar_type(), dtype = out.scalar_type();
  const bool bf16_pair = (from == at::kBFloat16 && dtype == at::kFloat) ||
                         (from == at::kFloat && dtype == at::kBFloat16);
  if (!bf16_pair || !t.device().is_cpu() || !out.device().is_cpu()) {
    out.copy_(t);
    return;
  }
  // Both lying densely in the same order: one run of memory.
  if (t.is_non_overlapping_and_dense() && out.strides() == t.strides()) {
    if (from == at::kBFloat16) {
      widen_bf16(reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()),
                 out.data_ptr<float>(), t.numel());
    } else {
      round_to_bf16(t.data_ptr<float>(), reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()),
                    t.numel());
    }
    return;
  }
  // Matrices whose rows are contiguous but lie apart (a column block of a wider matrix): row by
  // row, rows split across the threads. (Rows of out that overlap are left to copy_, which
  // refuses them.)
  if (t.dim() == 2 && out.dim() == 2 && t.stride(1) == 1 && out.stride(1) == 1 &&
      out.stride(0) >= out.size(1)) {
    const int64_t rows = t.size(0), n = t.size(1), ld_in = t.stride(0), ld_out = out.stride(0);
    if (from == at::kBFloat16) {
      const auto* in = reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
      float* to = out.data_ptr<float>();
      at::parallel_for(0, rows, kConvertedRowsGrain, [&](int64_t begin, int64_t end) {
        widen_bf16_rows(in + begin * ld_in, ld_in, end - begin, n, to + begin * ld_out, ld_out);
      });
    } else {
      const float* in = t.data_ptr<float>();
      auto* to = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
      at::parallel_for(0, rows, kConvertedRowsGrain, [&](int64_t begin, int64_t end) {
        round_to_bf16_rows(in + begin * ld_in, ld_in, end - begin, n, to + begin * ld_out, ld_out);
      });
    }
    return;
  }
  out.copy_(t);
}

namespace {

template <typename T>
ATTENTION_ALWAYS_INLINE void add_rows(T* s, int64_t ld, const T* at, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * ld;
    const T* bias = at - r;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
  }
}

template <typename T>
ATTENTION_ALWAYS_INLINE void accumulate_rows(T* g, int64_t cols, T* at, int64_t rows, T scale) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = g + r * cols;
    T* grad = at - r;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      grad[j] += row[j];
      row[j] *= scale;
    }
  }
}

// tanh in float with arithmetic and selects only, so that the loop over a row vectorizes: an odd
// polynomial below |x| = 0.625 (Cephes' tanhf coefficients; there 1 - e would cancel), and
// (1 - e) / (1 + e) with e = exp(-2|x|) above, each of |x|, and the sign put back. NaN stays NaN;
// +-inf give +-1.
ATTENTION_ALWAYS_INLINE float fast_tanh(float x) {
  const float a = std::fabs(x), z = x * x;
  const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                        1.33314422036e-1f) *
                           z -
                       3.33332819422e-1f) *
                          z * a +
                      a;
  const float e = exp_nonpositive(-2.0f * a);
  const float t = std::copysign(a < 0.625f ? small : (1.0f - e) / (1.0f + e), x);
  return x != x ? x : t;
}

// Soft-capping of a tile: rows of s (row stride ld) become cap * tanh(s / cap), the slopes
// 1 - tanh^2 written to `slope` (row stride cols) when given.
ATTENTION_MULTIVERSION void soft_cap_f32(float* s, int64_t ld, int64_t rows, int64_t cols,
                                         float cap, float* slope) {
  const float inverse = 1.0f / cap;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    if (slope) {
      float* out = slope + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const float t = fast_tanh(row[j] * inverse);
        row[j] = cap * t;
        out[j] = 1.0f - t * t;
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) row[j] = cap * fast_tanh(row[j] * inverse);
    }
  }
}

ATTENTION_MULTIVERSION void add_rows_f32(float* s, int64_t ld, const float* at, int64_t rows,
                                         int64_t cols) {
  add_rows(s, ld, at, rows, cols);
}

ATTENTION_MULTIVERSION void accumulate_rows_f32(float* g, int64_t cols, float* at, int64_t rows,
                                                float scale) {
  accumulate_rows(g, cols, at, rows, scale);
}

}  // namespace

void soft_cap(float* s, int64_t ld, int64_t rows, int64_t cols, float cap, float* slope) {
  soft_cap_f32(s, ld, rows, cols, cap, slope);
}

void soft_cap(double* s, int64_t ld, int64_t rows, int64_t cols, double cap, double* slope) {
  const double inverse = 1.0 / cap;
  for (int64_t r = 0; r < rows; ++r) {
    double* row = s + r * ld;
    for (int64_t j = 0; j < cols; ++j) {
      const double t = std::tanh(row[j] * inverse);
      row[j] = cap * t;
      if (slope) slope[r * cols + j] = 1.0 - t * t;
    }
  }
}

void add_relative_bias(float* s, int64_t ld, const float* at, int64_t rows, int64_t cols) {
  add_rows_f32(s, ld, at, rows, cols);
}

void add_relative_bias(double* s, int64_t ld, const double* at, int64_t rows, int64_t cols) {
  add_rows(s, ld, at, rows, cols);
}

void accumulate_relative_bias(float* g, int64_t cols, float* at, int64_t rows, float scale) {
  accumulate_rows_f32(g, cols, at, rows, scale);
}

void accumulate_relative_bias(double* g, int64_t cols, double* at, int64_t rows, double scale) {
  accumulate_rows(g, cols, at, rows, scale);
}

std::vector<int64_t> matrix_offsets(const torch::Tensor& t) {
  const int64_t lead = t.dim() - 2;
  int64_t count = 1;
  for (int64_t i = 0; i < lead; ++i) count *= t.size(i);
  std::vector<int64_t> offsets(count);
  for (int64_t m = 0; m < count; ++m) {
    int64_t rest = m, offset = 0;
    for (int64_t i = lead - 1; i >= 0; --i) {
      offset += (rest % t.size(i)) * t.stride(i);
      rest /= t.size(i);
    }
    offsets[m] = offset;
  }
  return offsets;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
