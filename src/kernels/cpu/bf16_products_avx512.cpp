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

// The floats at `in` (the lanes of `mask`) rounded to bfloat16 as LibTorch rounds, in the low half
// of each 32-bit lane: to nearest even by adding 0x7FFF plus the kept part's lowest bit, NaN to
// 0x7FC0. (vcvtneps2bf16 would flush subnormal floats to zero and keep NaN payloads, so results
// would no longer be LibTorch's bits.)
ATTENTION_AVX512_BF16 ATTENTION_ALWAYS_INLINE __m512i rounded_words(const float* in,
                                                                    __mmask16 mask) {
  const __m512 values = _mm512_maskz_loadu_ps(mask, in);
  const __m512i bits = _mm512_castps_si512(values);
  const __m512i lowest = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lowest, _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(values, values, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
}

ATTENTION_AVX512_BF16 void round(const float* in, int64_t ld_in, int64_t rows, int64_t cols,
                                 uint16_t* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = in + r * ld_in;
    uint16_t* to = out + r * ld_out;
    for (int64_t c = 0; c < cols; c += 16) {
      const auto mask = first_lanes(std::min<int64_t>(16, cols - c));
      _mm512_mask_cvtepi32_storeu_epi16(to + c, mask, rounded_words(from + c, mask));
    }
  }
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

ATTENTION_AVX512_BF16 void round_both(const float* in, int64_t ld_in, int64_t rows, int64_t cols,
                                      uint16_t* out, int64_t ld_out, uint32_t* pairs,
                                      int64_t ld_pairs) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* low = in + 2 * p * ld_in;
    const bool alone = 2 * p + 1 == rows;
    uint16_t* to = out + 2 * p * ld_out;
    for (int64_t c = 0; c < cols; c += 16) {
      const auto mask = first_lanes(std::min<int64_t>(16, cols - c));
      __m512i words = rounded_words(low + c, mask);
      _mm512_mask_cvtepi32_storeu_epi16(to + c, mask, words);
      if (!alone) {
        const __m512i high = rounded_words(low + ld_in + c, mask);
        _mm512_mask_cvtepi32_storeu_epi16(to + ld_out + c, mask, high);
        words = _mm512_or_si512(words, _mm512_slli_epi32(high, 16));
      }
      _mm512_mask_storeu_epi32(pairs + p * ld_pairs + c, mask, words);
    }
  }
}

// Squares of 16 x 16 words (32-bit: pairs of bfloat16 values) from the rows of `in` to the rows of
// `out`, in registers: pairs of rows interleaved by words, then by double words, then the 128-bit
// quarters gathered in two shuffles. Lane k of u[4g + c] after the second step holds word 4k + c of
// rows 4g to 4g + 3; the shuffles put each word's four quarters in row order. ld_in and ld_out
// count 16-bit values.
ATTENTION_AVX512_BF16 ATTENTION_ALWAYS_INLINE void transpose_square(const uint16_t* in,
                                                                    int64_t ld_in, uint16_t* out,
                                                                    int64_t ld_out) {
  __m512i r[16], t[16], u[16];
  ATTENTION_UNROLL
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * ld_in);
  ATTENTION_UNROLL
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  ATTENTION_UNROLL
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  ATTENTION_UNROLL
  for (int c = 0; c < 4; ++c) {
    // Quarters 0 and 2 of the two operands (0x88), or 1 and 3 (0xDD).
    const __m512i even_low = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
    const __m512i odd_low = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i even_high = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i odd_high = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    _mm512_storeu_si512(out + c * ld_out, _mm512_shuffle_i32x4(even_low, even_high, 0x88));
    _mm512_storeu_si512(out + (8 + c) * ld_out, _mm512_shuffle_i32x4(even_low, even_high, 0xDD));
    _mm512_storeu_si512(out + (4 + c) * ld_out, _mm512_shuffle_i32x4(odd_low, odd_high, 0x88));
    _mm512_storeu_si512(out + (12 + c) * ld_out, _mm512_shuffle_i32x4(odd_low, odd_high, 0xDD));
  }
}

// out (words x rows words) = the transpose of `in` (rows x words words); ld_in and ld_out count
// 16-bit values. Squares where 16 rows and 16 words remain, single words at the edges.
ATTENTION_AVX512_BF16 void transpose_words(const uint16_t* in, int64_t ld_in, int64_t rows,
                                           int64_t words, uint16_t* out, int64_t ld_out) {
  const auto one = [&](int64_t r, int64_t w) {
    std::memcpy(out + w * ld_out + 2 * r, in + r * ld_in + 2 * w, sizeof(uint32_t));
  };
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    int64_t w0 = 0;
    for (; w0 + 16 <= words; w0 += 16) {
      transpose_square(in + r0 * ld_in + 2 * w0, ld_in, out + w0 * ld_out + 2 * r0, ld_out);
    }
    for (int64_t w = w0; w < words; ++w) {
      for (int64_t r = r0; r < r0 + 16; ++r) one(r, w);
    }
  }
  for (int64_t w = 0; w < words; ++w) {
    for (int64_t r = r0; r < rows; ++r) one(r, w);
  }
}

// A pair of neighbouring values of a row is one word: the column pairs are the words transposed.
ATTENTION_AVX512_BF16 void pack_column_pairs_avx512(const uint16_t* in, int64_t ld_in, int64_t rows,
                                                    int64_t cols, uint32_t* out, int64_t ld_out) {
  const int64_t whole = cols / 2;
  transpose_words(in, ld_in, rows, whole, reinterpret_cast<uint16_t*>(out), 2 * ld_out);
  if (cols % 2 != 0) {
    for (int64_t r = 0; r < rows; ++r) out[whole * ld_out + r] = in[r * ld_in + cols - 1];
  }
}

// The transpose of 16-bit values as the transpose of words: rows 2p and 2p + 1 interleaved into
// words (column c's pair), 32 rows at a time through a buffer the first-level cache holds, whose
// words transposed are the output rows' pairs. Where an output row does not start a word (ld_out
// odd) the plain loops do it; an odd last row goes alone.
ATTENTION_AVX512_BF16 void transpose_avx512(const uint16_t* in, int64_t ld_in, int64_t rows,
                                            int64_t cols, uint16_t* out, int64_t ld_out) {
  if (ld_out % 2 != 0) return transpose_16(in, ld_in, rows, cols, out, ld_out);
  constexpr int64_t kRows = 32, kCols = 256;
  alignas(64) uint32_t pairs[kRows / 2 * kCols];
  const int64_t even = rows - rows % 2;
  for (int64_t r0 = 0; r0 < even; r0 += kRows) {
    const int64_t pair_rows = std::min(kRows, even - r0) / 2;
    for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
      const int64_t count = std::min(kCols, cols - c0);
      for (int64_t p = 0; p < pair_rows; ++p) {
        const uint16_t* low = in + (r0 + 2 * p) * ld_in + c0;
        for (int64_t c = 0; c < count; c += 16) {
          const auto mask = first_lanes(std::min<int64_t>(16, count - c));
          const __m512i lows = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, low + c));
          const __m512i highs =
              _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, low + ld_in + c));
          _mm512_mask_storeu_epi32(pairs + p * kCols + c, mask,
                                   _mm512_or_si512(lows, _mm512_slli_epi32(highs, 16)));
        }
      }
      transpose_words(reinterpret_cast<const uint16_t*>(pairs), 2 * kCols, pair_rows, count,
                      out + c0 * ld_out + r0, ld_out);
    }
  }
  if (even < rows) {
    for (int64_t c = 0; c < cols; ++c) out[c * ld_out + even] = in[even * ld_in + c];
  }
}

constexpr Bf16Products kAvx512Bf16Products{"avx512_bf16",   product,    round,
                                           round_row_pairs, round_both, pack_column_pairs_avx512,
                                           transpose_avx512};

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
