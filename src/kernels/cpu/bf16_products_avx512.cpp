// The bfloat16 products on AVX512_BF16 (kernels/cpu/bf16_products.h). C is computed in blocks of up
// to 4 rows by 64 columns, held in 16 registers while the contracted dimension goes by in pairs:
// each step loads a pair row of B's block (4 registers) and broadcasts one word (a pair) of each
// row of A, and vdpbf16ps adds both products of the pair into each lane. The last, partial vector
// of a row is loaded and stored under a mask; a k that is odd ends with a step whose pair has its
// high half cleared in both operands, so nothing beyond the k-th value is read or counted.

#include "kernels/cpu/bf16_panels.h"
#include "kernels/cpu/bf16_products.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_HAS_AVX512_BF16_CODE 1
#include <immintrin.h>
#else
#define ATTENTION_HAS_AVX512_BF16_CODE 0
#endif

// GCC's intrinsics leave the lanes they do not write as _mm512_undefined_ps(), a variable
// initialized with itself, which GCC 12 then reports as maybe uninitialized wherever they inline.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_AVX512_BF16_CODE

namespace {

// The blocks' registers are arrays indexed by loops of constant bounds: unrolled whole, they stay
// in registers.
#define ATTENTION_UNROLL _Pragma("GCC unroll 16")
#define ATTENTION_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The mask of a vector's first `count` lanes (1 to 16).
inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>(count == 16 ? 0xFFFF : (1u << count) - 1);
}

ATTENTION_AVX512_BF16 ATTENTION_ALWAYS_INLINE __m512i pair_of(const uint16_t* a) {
  uint32_t word;
  std::memcpy(&word, a, sizeof word);
  return _mm512_set1_epi32(static_cast<int>(word));
}

ATTENTION_AVX512_BF16 ATTENTION_ALWAYS_INLINE __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
}

// One block of C: `Rows` rows from c, `Vectors` vectors of 16 columns, the last under `tail`.
template <int Rows, int Vectors>
struct Block {
  ATTENTION_AVX512_BF16 static void run(int64_t k, float alpha, const uint16_t* a, int64_t lda,
                                        const uint32_t* b, int64_t ldb, bool accumulate, float* c,
                                        int64_t ldc, __mmask16 tail) {
    __m512 acc[Rows][Vectors];
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) {
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    const auto mask_of = [tail](int v) -> __mmask16 { return v == Vectors - 1 ? tail : 0xFFFF; };
    const int64_t pairs = k / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      __m512i pair_row[Vectors];
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) {
        pair_row[v] = _mm512_maskz_loadu_epi32(mask_of(v), b + p * ldb + 16 * v);
      }
      ATTENTION_UNROLL
      for (int r = 0; r < Rows; ++r) {
        const __m512i pair = pair_of(a + r * lda + 2 * p);
        ATTENTION_UNROLL
        for (int v = 0; v < Vectors; ++v) acc[r][v] = dot_pairs(acc[r][v], pair, pair_row[v]);
      }
    }
    if (k % 2 != 0) {  // the last value alone: both high halves cleared
      const __m512i low_half = _mm512_set1_epi32(0xFFFF);
      __m512i pair_row[Vectors];
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) {
        pair_row[v] = _mm512_and_si512(
            low_half, _mm512_maskz_loadu_epi32(mask_of(v), b + pairs * ldb + 16 * v));
      }
      ATTENTION_UNROLL
      for (int r = 0; r < Rows; ++r) {
        const __m512i last = _mm512_set1_epi32(a[r * lda + k - 1]);
        ATTENTION_UNROLL
        for (int v = 0; v < Vectors; ++v) acc[r][v] = dot_pairs(acc[r][v], last, pair_row[v]);
      }
    }
    const __m512 scale = _mm512_set1_ps(alpha);
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) {
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) {
        float* out = c + r * ldc + 16 * v;
        __m512 result = _mm512_mul_ps(acc[r][v], scale);
        if (accumulate) result = _mm512_add_ps(result, _mm512_maskz_loadu_ps(mask_of(v), out));
        _mm512_mask_storeu_ps(out, mask_of(v), result);
      }
    }
  }
};

void product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
             const uint32_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  bf16_product_in_panels<Block, 16>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc,
                                    first_lanes);
}

ATTENTION_AVX512_BF16 void round(const float* in, int64_t ld_in, int64_t rows, int64_t cols,
                                 uint16_t* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = in + r * ld_in;
    uint16_t* to = out + r * ld_out;
    for (int64_t c = 0; c < cols; c += 16) {
      const int64_t rest = std::min<int64_t>(16, cols - c);
      const auto mask = first_lanes(rest);
      const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, from + c));
      _mm256_mask_storeu_epi16(to + c, mask, reinterpret_cast<const __m256i&>(rounded));
    }
  }
}

ATTENTION_AVX512_BF16 ATTENTION_ALWAYS_INLINE __m512i rounded_words(const float* in,
                                                                    __mmask16 mask) {
  const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, in));
  return _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(rounded));
}

ATTENTION_AVX512_BF16 void round_row_pairs(const float* in, int64_t ld_in, int64_t rows,
                                           int64_t cols, uint32_t* out, int64_t ld_out) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* low = in + 2 * p * ld_in;
    const bool alone = 2 * p + 1 == rows;
    uint32_t* to = out + p * ld_out;
    for (int64_t c = 0; c < cols; c += 16) {
      const int64_t rest = std::min<int64_t>(16, cols - c);
      const auto mask = first_lanes(rest);
      __m512i words = rounded_words(low + c, mask);
      if (!alone) {
        words = _mm512_or_si512(words, _mm512_slli_epi32(rounded_words(low + ld_in + c, mask), 16));
      }
      _mm512_mask_storeu_epi32(to + c, mask, words);
    }
  }
}

constexpr Bf16Products kAvx512Bf16Products{"avx512_bf16", product, round, round_row_pairs};

}  // namespace

const Bf16Products* avx512_bf16_products() {
  return processor_has_avx512_bf16() ? &kAvx512Bf16Products : nullptr;
}

#else

const Bf16Products* avx512_bf16_products() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
