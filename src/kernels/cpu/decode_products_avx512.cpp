// The paged forward's products on AVX-512F (kernels/cpu/decode_products.h): 16 keys per group,
// 16 lanes per register, up to 128 features of a row's output held in 8 registers; 8-bit rows
// four keys and up to four query rows at a time, each code widened once for the rows.

#include "kernels/cpu/decode_products.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>
#include <type_traits>

#if ATTENTION_HAS_X86_DECODE_PRODUCTS
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

#if ATTENTION_HAS_X86_DECODE_PRODUCTS

namespace {

#define ATTENTION_AVX512 __attribute__((target("avx512f")))

ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 load16(const uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 load16(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}

// 128-bit lanes [a0 + a1, a2 + a3, b0 + b1, b2 + b3].
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 fold_lanes(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane k of the result is the sum of v[k]'s 16 lanes. Each step halves the registers: adjacent
// pairs interleaved and added (within 128-bit lanes, by 32 then 64 bits), then the 128-bit lanes
// folded; 45 instructions for 16 sums, where summing each register alone takes about 8 apiece.
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 sum_each(const __m512* v) {
  __m512 pairs[8];
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 quads[4];  // 128-bit lane l of quads[i]: partial sums of v[4i .. 4i + 3]
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  return fold_lanes(fold_lanes(quads[0], quads[1]), fold_lanes(quads[2], quads[3]));
}

// Asks for the rows of the next group while this one is multiplied: rows lie a page apart, in no
// order a hardware prefetcher follows.
template <typename In>
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE void prefetch_rows(const In* const* rows, int64_t count,
                                                            int64_t width) {
  constexpr int64_t kLine = 64 / sizeof(In);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < width; c += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[i] + c), _MM_HINT_T0);
    }
  }
}

template <typename In>
ATTENTION_AVX512 void scores_avx512(const float* q, int64_t rows, int64_t d, const In* const* keys,
                                    const float* key_scales, int64_t cols, float* s, int64_t ld) {
  for (int64_t j0 = 0; j0 < cols; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, cols - j0);
    // A short last group repeats its first key in the missing places; their sums are not stored.
    const In* k[16];
    for (int64_t i = 0; i < 16; ++i) k[i] = keys[j0 + (i < n ? i : 0)];
    const __mmask16 stored = static_cast<__mmask16>((1u << n) - 1u);
    prefetch_rows(keys + j0 + n, std::min<int64_t>(16, cols - j0 - n), d);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = q + r * d;
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t c = 0; c < d; c += 16) {
        const __m512 x = _mm512_loadu_ps(row + c);
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(x, load16(k[i] + c), acc[i]);
      }
      __m512 sums = sum_each(acc);
      if (key_scales != nullptr) {
        sums = _mm512_mul_ps(sums, _mm512_maskz_loadu_ps(stored, key_scales + j0));
      }
      _mm512_mask_storeu_ps(s + r * ld + j0, stored, sums);
    }
  }
}

// One row's output features [0, 16 * Chunks) over every key, in registers.
template <int Chunks, typename In>
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE void weigh_values(const float* p, const In* const* values,
                                                           const float* scales, int64_t cols,
                                                           int64_t c0, float* acc) {
  __m512 a[Chunks];
  for (int i = 0; i < Chunks; ++i) a[i] = _mm512_loadu_ps(acc + 16 * i);
  for (int64_t j = 0; j < cols; ++j) {
    if (p[j] == 0.0f) continue;
    const __m512 w = _mm512_set1_ps(scales != nullptr ? p[j] * scales[j] : p[j]);
    const In* v = values[j] + c0;
    for (int i = 0; i < Chunks; ++i) a[i] = _mm512_fmadd_ps(w, load16(v + 16 * i), a[i]);
  }
  for (int i = 0; i < Chunks; ++i) _mm512_storeu_ps(acc + 16 * i, a[i]);
}

// Rows' outputs over keys [0, cols): each row's features a register block at a time.
template <typename In>
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE void weigh_rows(const float* p, int64_t ld, int64_t rows,
                                                         const In* const* values,
                                                         const float* value_scales, int64_t cols,
                                                         float* acc, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* weights = p + r * ld;
    float* out = acc + r * dv;
    for (int64_t c0 = 0; c0 < dv; c0 += 128) {
      switch (std::min<int64_t>(8, (dv - c0) / 16)) {
        case 8:
          weigh_values<8>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 7:
          weigh_values<7>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 6:
          weigh_values<6>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 5:
          weigh_values<5>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 4:
          weigh_values<4>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 3:
          weigh_values<3>(weights, values, value_scales, cols, c0, out + c0);
          break;
        case 2:
          weigh_values<2>(weights, values, value_scales, cols, c0, out + c0);
          break;
        default:
          weigh_values<1>(weights, values, value_scales, cols, c0, out + c0);
          break;
      }
    }
  }
}

template <typename In>
ATTENTION_AVX512 void values_avx512(const float* p, int64_t ld, int64_t rows,
                                    const In* const* values, const float* value_scales,
                                    int64_t cols, float* acc, int64_t dv) {
  weigh_rows(p, ld, rows, values, value_scales, cols, acc, dv);
}

// 8-bit keys and values: each code widened in registers once per block of up to four rows, and
// used there by all of them. Widening a group of keys into a float buffer that every row then
// read (the earlier form) took about twice the instructions, and the decoding step with an 8-bit
// cache is bound by them where its codes are in the processor's caches.

// Calls f(std::integral_constant<int, n>()) with n = min(4, count), count >= 1: a block of up to
// four rows or vectors as a template argument, so its registers are known when it compiles.
template <typename F>
void up_to_four(int64_t count, const F& f) {
  switch (std::min<int64_t>(4, count)) {
    case 4:
      f(std::integral_constant<int, 4>());
      break;
    case 3:
      f(std::integral_constant<int, 3>());
      break;
    case 2:
      f(std::integral_constant<int, 2>());
      break;
    default:
      f(std::integral_constant<int, 1>());
      break;
  }
}

// Rows [0, Rows) against keys [0, cols), four keys at a time; acc[r * 4 + i] holds row r's
// partial sums against key i, so one tree of shuffles (sum_each) gives the 16 scores.
template <int Rows>
ATTENTION_AVX512 void scores_i8_block(const float* q, int64_t d, const int8_t* const* keys,
                                      const float* key_scales, int64_t cols, float* s, int64_t ld) {
  for (int64_t j0 = 0; j0 < cols; j0 += 4) {
    const int64_t n = std::min<int64_t>(4, cols - j0);
    // A short last group repeats its first key in the missing places; their sums are not stored.
    const int8_t* k[4];
    float scale[4];
    for (int64_t i = 0; i < 4; ++i) {
      k[i] = keys[j0 + (i < n ? i : 0)];
      scale[i] = key_scales[j0 + (i < n ? i : 0)];
    }
    prefetch_rows(keys + j0 + n, std::min<int64_t>(4, cols - j0 - n), d);
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      for (int i = 0; i < 4; ++i) {
        const __m512 x = load16(k[i] + c);
        for (int r = 0; r < Rows; ++r) {
          acc[r * 4 + i] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * d + c), x, acc[r * 4 + i]);
        }
      }
    }
    alignas(64) float sums[16];  // lane r * 4 + i: row r against key i, times the key's scale
    _mm512_store_ps(sums,
                    _mm512_mul_ps(sum_each(acc), _mm512_broadcast_f32x4(_mm_loadu_ps(scale))));
    for (int r = 0; r < Rows; ++r) {
      for (int64_t i = 0; i < n; ++i) s[r * ld + j0 + i] = sums[r * 4 + i];
    }
  }
}

ATTENTION_AVX512 void scores_i8_avx512(const float* q, int64_t rows, int64_t d,
                                       const int8_t* const* keys, const float* key_scales,
                                       int64_t cols, float* s, int64_t ld) {
  if (rows == 1) {  // sixteen keys at a time in registers
    scores_avx512<int8_t>(q, rows, d, keys, key_scales, cols, s, ld);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    up_to_four(rows - r0, [&](auto block) {
      scores_i8_block<block()>(q + r0 * d, d, keys, key_scales, cols, s + r0 * ld, ld);
    });
  }
}

// Rows [0, Rows)' outputs, features [c0, c0 + 16 * Chunks), over keys [0, cols): weights[r *
// kWeightKeys + j] is row r's weight of key j times the key's scale.
constexpr int64_t kWeightKeys = 64;

template <int Rows, int Chunks>
ATTENTION_AVX512 void values_i8_block(const float* weights, int64_t cols,
                                      const int8_t* const* values, int64_t c0, float* acc,
                                      int64_t dv) {
  __m512 a[Rows * Chunks];
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < Chunks; ++i)
      a[r * Chunks + i] = _mm512_loadu_ps(acc + r * dv + c0 + 16 * i);
  }
  for (int64_t j = 0; j < cols; ++j) {
    const int8_t* v = values[j] + c0;
    __m512 x[Chunks];
    for (int i = 0; i < Chunks; ++i) x[i] = load16(v + 16 * i);
    for (int r = 0; r < Rows; ++r) {
      const __m512 w = _mm512_set1_ps(weights[r * kWeightKeys + j]);
      for (int i = 0; i < Chunks; ++i)
        a[r * Chunks + i] = _mm512_fmadd_ps(w, x[i], a[r * Chunks + i]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < Chunks; ++i)
      _mm512_storeu_ps(acc + r * dv + c0 + 16 * i, a[r * Chunks + i]);
  }
}

template <int Rows>
ATTENTION_AVX512 void values_i8_rows(const float* weights, int64_t cols,
                                     const int8_t* const* values, float* acc, int64_t dv) {
  for (int64_t c0 = 0; c0 < dv; c0 += 64) {
    up_to_four((dv - c0) / 16, [&](auto chunks) {
      values_i8_block<Rows, chunks()>(weights, cols, values, c0, acc, dv);
    });
  }
}

ATTENTION_AVX512 void values_i8_avx512(const float* p, int64_t ld, int64_t rows,
                                       const int8_t* const* values, const float* value_scales,
                                       int64_t cols, float* acc, int64_t dv) {
  alignas(64) float weights[4 * kWeightKeys];
  for (int64_t j0 = 0; j0 < cols; j0 += kWeightKeys) {
    const int64_t m = std::min(kWeightKeys, cols - j0);
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t block = std::min<int64_t>(4, rows - r0);
      // A weight of 0 stays 0, whatever the key's scale (a NaN scale stays out of a row that
      // gives its value no weight: the codes themselves are finite).
      for (int64_t r = 0; r < block; ++r) {
        for (int64_t j = 0; j < m; j += 16) {
          const __mmask16 lanes =
              m - j >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (m - j)) - 1u);
          const __m512 weight = _mm512_maskz_loadu_ps(lanes, p + (r0 + r) * ld + j0 + j);
          const __m512 scale = _mm512_maskz_loadu_ps(lanes, value_scales + j0 + j);
          const __mmask16 given =
              _mm512_cmp_ps_mask(weight, _mm512_setzero_ps(), _CMP_NEQ_UQ) & lanes;
          _mm512_store_ps(weights + r * kWeightKeys + j, _mm512_maskz_mul_ps(given, weight, scale));
        }
      }
      up_to_four(block, [&](auto block_rows) {
        values_i8_rows<block_rows()>(weights, m, values + j0, acc + r0 * dv, dv);
      });
    }
  }
}

#undef ATTENTION_AVX512

// Float and bfloat16 rows carry no scales.
template <typename In>
void plain_scores(const float* q, int64_t rows, int64_t d, const In* const* keys, int64_t cols,
                  float* s, int64_t ld) {
  scores_avx512<In>(q, rows, d, keys, nullptr, cols, s, ld);
}
template <typename In>
void plain_values(const float* p, int64_t ld, int64_t rows, const In* const* values, int64_t cols,
                  float* acc, int64_t dv) {
  values_avx512<In>(p, ld, rows, values, nullptr, cols, acc, dv);
}

constexpr DecodeProducts kAvx512Products{"avx512",
                                         16,
                                         plain_scores<float>,
                                         plain_scores<uint16_t>,
                                         plain_values<float>,
                                         plain_values<uint16_t>,
                                         scores_i8_avx512,
                                         values_i8_avx512};

}  // namespace

const DecodeProducts* avx512_decode_products() {
  return processor_has_avx512f() ? &kAvx512Products : nullptr;
}

#else

const DecodeProducts* avx512_decode_products() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
