#include "kernels/cpu/tile.h"

#include "memory/empty_large.h"

#include <algorithm>

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
  return empty_in_layout_of(t, t.sizes(), dtype).copy_(t);
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

ATTENTION_MULTIVERSION void add_rows_f32(float* s, int64_t ld, const float* at, int64_t rows,
                                         int64_t cols) {
  add_rows(s, ld, at, rows, cols);
}

ATTENTION_MULTIVERSION void accumulate_rows_f32(float* g, int64_t cols, float* at, int64_t rows,
                                                float scale) {
  accumulate_rows(g, cols, at, rows, scale);
}

}  // namespace

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
