// The exponential passes on AVX-512F (kernels/cpu/softmax.h): 16 lanes, masked loads and stores for
// a row's last, partial vector, and 2^n applied by vscalefps.

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/softmax_rows.h"
#include "platform/cpu_features.h"

#include <limits>

#if ATTENTION_HAS_SIMD_SOFTMAX
#include <immintrin.h>
#endif

// GCC's intrinsics leave the lanes they do not write as _mm512_undefined_ps(), a variable
// initialized with itself, which GCC 12 then reports as maybe uninitialized wherever they inline.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_SIMD_SOFTMAX

namespace {

#define ATTENTION_AVX512 __attribute__((target("avx512f")))

constexpr float kInf = std::numeric_limits<float>::infinity();

// exp(x) in 16 lanes for x <= 0 (small positive x, from rounding, are fine): 0 where x is below
// -87 (results near 2^-126 and below, as exp_nonpositive gives) or where `keep` is clear, NaN
// where x is NaN. x = n ln 2 + r with n = round(x / ln 2) and ln 2 in two parts (Cody and
// Waite's, as in Cephes: n ln2_hi is exact for every n here), then e^r on [-ln 2 / 2, ln 2 / 2]
// as 1 + r q(r), q of degree 5 fitted for the least largest relative error (2.2e-9), and 2^n
// applied by vscalefps. Within 1.04 ulp of exp over [-87, 0]; exp(0) is exactly 1.
ATTENTION_AVX512 inline __m512 exp_nonpositive16(__m512 x, __mmask16 keep = 0xFFFF) {
  // Unordered "not less than": NaN lanes are kept, and stay NaN through every step.
  const __mmask16 kept = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 q = _mm512_set1_ps(0.0013847306836396456f);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.00837505143135786f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.04166798293590546f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.16666419804096222f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.4999999403953552f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kept, e, n);
}

// The lanes of a row's last, partial vector: the first `count` (0 < count < 16).
inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

struct Avx512Lanes {
  // vmaxps gives its second operand when either is NaN, and the accumulators are never NaN, so
  // NaN scores are left out. Four accumulators, so that the pass is not one chain of maxima.
  ATTENTION_AVX512 static float row_maximum(const float* row, int64_t seen) {
    const __m512 none = _mm512_set1_ps(-kInf);
    __m512 m0 = none, m1 = none, m2 = none, m3 = none;
    int64_t j = 0;
    for (; j + 64 <= seen; j += 64) {
      m0 = _mm512_max_ps(_mm512_loadu_ps(row + j), m0);
      m1 = _mm512_max_ps(_mm512_loadu_ps(row + j + 16), m1);
      m2 = _mm512_max_ps(_mm512_loadu_ps(row + j + 32), m2);
      m3 = _mm512_max_ps(_mm512_loadu_ps(row + j + 48), m3);
    }
    for (; j + 16 <= seen; j += 16) m0 = _mm512_max_ps(_mm512_loadu_ps(row + j), m0);
    if (j < seen) {
      m1 = _mm512_max_ps(_mm512_mask_loadu_ps(none, first_lanes(seen - j), row + j), m1);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  }

  ATTENTION_AVX512 static float exponentials(float* row, int64_t seen, float shift) {
    const __m512 by = _mm512_set1_ps(shift);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= seen; j += 32) {
      const __m512 e0 = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(row + j), by));
      const __m512 e1 = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16), by));
      _mm512_storeu_ps(row + j, e0);
      _mm512_storeu_ps(row + j + 16, e1);
      a0 = _mm512_add_ps(a0, e0);
      a1 = _mm512_add_ps(a1, e1);
    }
    for (; j + 16 <= seen; j += 16) {
      const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(row + j), by));
      _mm512_storeu_ps(row + j, e);
      a0 = _mm512_add_ps(a0, e);
    }
    if (j < seen) {
      const __mmask16 lanes = first_lanes(seen - j);
      const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + j), by);
      const __m512 e = exp_nonpositive16(x, lanes);  // lanes past the row give 0
      _mm512_mask_storeu_ps(row + j, lanes, e);
      a1 = _mm512_add_ps(a1, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }

  ATTENTION_AVX512 static void scale_row(float* a, int64_t count, float by) {
    const __m512 b = _mm512_set1_ps(by);
    int64_t c = 0;
    for (; c + 16 <= count; c += 16) {
      _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), b));
    }
    if (c < count) {
      const __mmask16 lanes = first_lanes(count - c);
      _mm512_mask_storeu_ps(a + c, lanes, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, a + c), b));
    }
  }

  ATTENTION_AVX512 static void probabilities_row(const float* score, float* prob, int64_t seen,
                                                 float lse) {
    const __m512 hidden = _mm512_set1_ps(-kInf);
    const __m512 row_lse = _mm512_set1_ps(lse);
    for (int64_t j = 0; j < seen; j += 16) {
      const __mmask16 lanes = seen - j >= 16 ? __mmask16(0xFFFF) : first_lanes(seen - j);
      const __m512 x = _mm512_maskz_loadu_ps(lanes, score + j);
      // A hidden key gets 0 even where the row's log-sum-exp is NaN.
      const __mmask16 visible = _mm512_mask_cmp_ps_mask(lanes, x, hidden, _CMP_NEQ_UQ);
      _mm512_mask_storeu_ps(prob + j, lanes, exp_nonpositive16(_mm512_sub_ps(x, row_lse), visible));
    }
  }
};

ATTENTION_AVX512 void softmax_step_avx512(float* s, int64_t rows, int64_t cols, int64_t ld,
                                          bool causal, int64_t valid, float* max, float* sum,
                                          float* acc, int64_t dv, int64_t acc_ld) {
  softmax_step_rows<Avx512Lanes>(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

ATTENTION_AVX512 void probabilities_avx512(float* s, float* prob, int64_t rows, int64_t cols,
                                           bool causal, int64_t valid, const float* lse) {
  probabilities_rows<Avx512Lanes>(s, prob, rows, cols, causal, valid, lse);
}

#undef ATTENTION_AVX512

constexpr SoftmaxPasses kAvx512Passes{"avx512", softmax_step_avx512, probabilities_avx512};

}  // namespace

const SoftmaxPasses* avx512_softmax_passes() {
  return processor_has_avx512f() ? &kAvx512Passes : nullptr;
}

#else

const SoftmaxPasses* avx512_softmax_passes() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
