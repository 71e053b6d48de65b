// The exponential passes on AVX2 with FMA (kernels/cpu/softmax.h): 8 lanes, a row's last, partial
// vector through vmaskmovps, and 2^n built in the exponent field.

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/softmax_rows.h"
#include "platform/cpu_features.h"

#include <limits>

#if ATTENTION_HAS_SIMD_SOFTMAX
#include <immintrin.h>
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_SIMD_SOFTMAX

namespace {

#define ATTENTION_AVX2 __attribute__((target("avx2,fma")))

constexpr float kInf = std::numeric_limits<float>::infinity();

// exp(x) in 8 lanes for x <= 0, as exp_nonpositive16 of kernels/cpu/softmax_avx512.cpp computes it
// (the same reduction and polynomial, so the same results): 0 where x is below -87 or where `keep`
// is clear, NaN where x is NaN. 2^n goes into the exponent field: n >= -126 wherever x >= -87, so
// 2^n is a normal number; the other lanes' garbage is cleared by the mask, and a NaN lane's n
// converts to INT_MIN, whose field is that of 1, so NaN * 1 stays NaN.
ATTENTION_AVX2 inline __m256 exp_nonpositive8(__m256 x, __m256 keep) {
  // Unordered "not less than": NaN lanes are kept.
  const __m256 kept = _mm256_and_ps(keep, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 q = _mm256_set1_ps(0.0013847306836396456f);
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.00837505143135786f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.04166798293590546f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.16666419804096222f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.4999999403953552f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
  const __m256 e = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
  const __m256i field =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(kept, _mm256_mul_ps(e, _mm256_castsi256_ps(field)));
}

ATTENTION_AVX2 inline __m256 all_lanes() {
  return _mm256_castsi256_ps(_mm256_set1_epi32(-1));
}

// The lanes of a row's last, partial vector: the first `count` (0 < count < 8), all bits set.
ATTENTION_AVX2 inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

ATTENTION_AVX2 inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

ATTENTION_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Avx2Lanes {
  // vmaxps gives its second operand when either is NaN, and the accumulators are never NaN, so
  // NaN scores are left out. Four accumulators, so that the pass is not one chain of maxima.
  ATTENTION_AVX2 static float row_maximum(const float* row, int64_t seen) {
    const __m256 none = _mm256_set1_ps(-kInf);
    __m256 m0 = none, m1 = none, m2 = none, m3 = none;
    int64_t j = 0;
    for (; j + 32 <= seen; j += 32) {
      m0 = _mm256_max_ps(_mm256_loadu_ps(row + j), m0);
      m1 = _mm256_max_ps(_mm256_loadu_ps(row + j + 8), m1);
      m2 = _mm256_max_ps(_mm256_loadu_ps(row + j + 16), m2);
      m3 = _mm256_max_ps(_mm256_loadu_ps(row + j + 24), m3);
    }
    for (; j + 8 <= seen; j += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(row + j), m0);
    if (j < seen) {
      const __m256i lanes = first_lanes(seen - j);
      const __m256 x =
          _mm256_blendv_ps(none, _mm256_maskload_ps(row + j, lanes), _mm256_castsi256_ps(lanes));
      m1 = _mm256_max_ps(x, m1);
    }
    return horizontal_max(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  }

  ATTENTION_AVX2 static float exponentials(float* row, int64_t seen, float shift) {
    const __m256 by = _mm256_set1_ps(shift);
    const __m256 all = all_lanes();
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= seen; j += 16) {
      const __m256 e0 = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(row + j), by), all);
      const __m256 e1 = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), by), all);
      _mm256_storeu_ps(row + j, e0);
      _mm256_storeu_ps(row + j + 8, e1);
      a0 = _mm256_add_ps(a0, e0);
      a1 = _mm256_add_ps(a1, e1);
    }
    for (; j + 8 <= seen; j += 8) {
      const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(row + j), by), all);
      _mm256_storeu_ps(row + j, e);
      a0 = _mm256_add_ps(a0, e);
    }
    if (j < seen) {
      const __m256i lanes = first_lanes(seen - j);
      const __m256 x = _mm256_sub_ps(_mm256_maskload_ps(row + j, lanes), by);
      const __m256 e = exp_nonpositive8(x, _mm256_castsi256_ps(lanes));  // lanes past: 0
      _mm256_maskstore_ps(row + j, lanes, e);
      a1 = _mm256_add_ps(a1, e);
    }
    return horizontal_sum(_mm256_add_ps(a0, a1));
  }

  ATTENTION_AVX2 static void scale_row(float* a, int64_t count, float by) {
    const __m256 b = _mm256_set1_ps(by);
    int64_t c = 0;
    for (; c + 8 <= count; c += 8) {
      _mm256_storeu_ps(a + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), b));
    }
    if (c < count) {
      const __m256i lanes = first_lanes(count - c);
      _mm256_maskstore_ps(a + c, lanes, _mm256_mul_ps(_mm256_maskload_ps(a + c, lanes), b));
    }
  }

  ATTENTION_AVX2 static void probabilities_row(const float* score, float* prob, int64_t seen,
                                               float lse) {
    const __m256 hidden = _mm256_set1_ps(-kInf);
    const __m256 row_lse = _mm256_set1_ps(lse);
    int64_t j = 0;
    // A hidden key gets 0 even where the row's log-sum-exp is NaN.
    for (; j + 8 <= seen; j += 8) {
      const __m256 x = _mm256_loadu_ps(score + j);
      const __m256 visible = _mm256_cmp_ps(x, hidden, _CMP_NEQ_UQ);
      _mm256_storeu_ps(prob + j, exp_nonpositive8(_mm256_sub_ps(x, row_lse), visible));
    }
    if (j < seen) {
      const __m256i lanes = first_lanes(seen - j);
      const __m256 x = _mm256_maskload_ps(score + j, lanes);
      const __m256 visible =
          _mm256_and_ps(_mm256_castsi256_ps(lanes), _mm256_cmp_ps(x, hidden, _CMP_NEQ_UQ));
      _mm256_maskstore_ps(prob + j, lanes, exp_nonpositive8(_mm256_sub_ps(x, row_lse), visible));
    }
  }
};

ATTENTION_AVX2 void softmax_step_avx2(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                                      int64_t valid, float* max, float* sum, float* acc, int64_t dv,
                                      int64_t acc_ld) {
  softmax_step_rows<Avx2Lanes>(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

ATTENTION_AVX2 void probabilities_avx2(float* s, float* prob, int64_t rows, int64_t cols,
                                       bool causal, int64_t valid, const float* lse) {
  probabilities_rows<Avx2Lanes>(s, prob, rows, cols, causal, valid, lse);
}

#undef ATTENTION_AVX2

constexpr SoftmaxPasses kAvx2Passes{"avx2", softmax_step_avx2, probabilities_avx2};

}  // namespace

const SoftmaxPasses* avx2_softmax_passes() {
  return processor_has_avx2_fma() ? &kAvx2Passes : nullptr;
}

#else

const SoftmaxPasses* avx2_softmax_passes() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
