// The online-softmax step (kernels/cpu/softmax_step.h): the compiler-vectorized loops, built for
// several instruction sets, behind the intrinsic passes of kernels/cpu/softmax.h.

#include "kernels/cpu/softmax_step.h"

#include "kernels/cpu/exp.h"
#include "kernels/cpu/softmax.h"
#include "platform/compiler.h"

#include <algorithm>
#include <limits>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

// The step itself: rows x cols scaled scores in `s` (row stride ld), of
// which row r sees its first valid + r columns when causal (all of them otherwise). Turns the
// scores into probabilities relative to each row's running maximum `max`, adds them to the
// running sum `sum` (NaN once a score was NaN), and rescales the row's accumulated values `acc`
// (rows x dv, row stride acc_ld) to the new maximum.
template <typename T>
ATTENTION_ALWAYS_INLINE void step(T* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                                  int64_t valid, T* max, T* sum, T* acc, int64_t dv,
                                  int64_t acc_ld) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * ld;
    const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
    T row_max = -kInf;
    int nan = 0;
#pragma omp simd reduction(max : row_max) reduction(| : nan)
    for (int64_t j = 0; j < seen; ++j) {
      row_max = row[j] > row_max ? row[j] : row_max;
      nan |= row[j] != row[j];
    }
    const T new_max = row_max > max[r] ? row_max : max[r];
    // A NaN score, or a +inf one (whose exp relative to itself is inf/inf), leaves the row's
    // softmax undefined: NaN, as the whole-matrix softmax gives.
    if (nan || row_max == kInf) sum[r] = std::numeric_limits<T>::quiet_NaN();
    if (new_max == -kInf) {  // every key masked so far: nothing to add
      std::fill(row, row + cols, T(0));
      continue;
    }
    T added = 0;
#pragma omp simd reduction(+ : added)
    for (int64_t j = 0; j < seen; ++j) {
      const T e = exp_nonpositive(row[j] - new_max);
      row[j] = e;
      added += e;
    }
    std::fill(row + seen, row + cols, T(0));
    const T correction = exp_nonpositive(max[r] - new_max);
    sum[r] = sum[r] * correction + added;
    max[r] = new_max;
    if (correction != T(1)) {
      T* a = acc + r * acc_ld;
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) a[c] *= correction;
    }
  }
}

ATTENTION_MULTIVERSION void softmax_step_f32(float* s, int64_t rows, int64_t cols, int64_t ld,
                                             bool causal, int64_t valid, float* max, float* sum,
                                             float* acc, int64_t dv, int64_t acc_ld) {
  step(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

}  // namespace

void online_softmax_step(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                         int64_t valid, float* max, float* sum, float* acc, int64_t dv,
                         int64_t acc_ld) {
  if (const SoftmaxPasses* passes = softmax_passes()) {
    passes->softmax_step(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
    return;
  }
  softmax_step_f32(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

void online_softmax_step(double* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                         int64_t valid, double* max, double* sum, double* acc, int64_t dv,
                         int64_t acc_ld) {
  step(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
