#pragma once

// The row loops of the exponential passes (kernels/cpu/softmax.h), written once over an instruction
// set's row primitives. `Lanes` provides, for float rows:
//   float row_maximum(const float* row, int64_t seen): the largest of row[0, seen), NaN left
//     out; -inf when there is none;
//   float exponentials(float* row, int64_t seen, float shift): row[0, seen) = exp(row - shift),
//     returning their sum (NaN if one is NaN);
//   void scale_row(float* a, int64_t count, float by): a[0, count) *= by;
//   void probabilities_row(const float* score, float* prob, int64_t seen, float lse):
//     prob[0, seen) = exp(score - lse), 0 where a score is -inf (whatever lse is).
// Each instruction set's file instantiates these loops inside functions compiled for it, where
// the always-inlined loop takes that target.

#include "kernels/cpu/exp.h"
#include "platform/compiler.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace attention {
namespace kernels {
namespace cpu {

template <class Lanes>
ATTENTION_ALWAYS_INLINE void softmax_step_rows(float* s, int64_t rows, int64_t cols, int64_t ld,
                                               bool causal, int64_t valid, float* max, float* sum,
                                               float* acc, int64_t dv, int64_t acc_ld) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
    const float row_max = Lanes::row_maximum(row, seen);
    const float new_max = row_max > max[r] ? row_max : max[r];
    // A +inf score (whose exp relative to itself is inf/inf) leaves the row's softmax undefined:
    // NaN, as the whole-matrix softmax gives. NaN scores make the sum NaN through their exp.
    if (row_max == kInf) sum[r] = std::numeric_limits<float>::quiet_NaN();
    if (new_max == -kInf) {  // every key masked so far: nothing to add, but NaN stays NaN
      if (std::any_of(row, row + seen, [](float x) { return x != x; })) {
        sum[r] = std::numeric_limits<float>::quiet_NaN();
      }
      std::fill(row, row + cols, 0.0f);
      continue;
    }
    const float added = Lanes::exponentials(row, seen, new_max);
    std::fill(row + seen, row + cols, 0.0f);
    const float correction = exp_nonpositive(max[r] - new_max);
    sum[r] = sum[r] * correction + added;
    max[r] = new_max;
    if (correction != 1.0f) Lanes::scale_row(acc + r * acc_ld, dv, correction);
  }
}

template <class Lanes>
ATTENTION_ALWAYS_INLINE void probabilities_rows(float* s, float* prob, int64_t rows, int64_t cols,
                                                bool causal, int64_t valid, const float* lse) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* score = s + r * cols;
    float* pr = prob + r * cols;
    const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
    Lanes::probabilities_row(score, pr, seen, lse[r]);
    std::fill(score + seen, score + cols, -kInf);
    std::fill(pr + seen, pr + cols, 0.0f);
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
