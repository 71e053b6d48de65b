// The paged forward's products on AVX2 with FMA (kernels/cpu/decode_products.h): 8 keys per
// group, 8 lanes per register, up to 64 features of a row's output held in 8 registers (of 16).

#include "kernels/cpu/decode_products.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>

#if ATTENTION_HAS_X86_DECODE_PRODUCTS
#include <immintrin.h>
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_X86_DECODE_PRODUCTS

namespace {

#define ATTENTION_AVX2 __attribute__((target("avx2,fma")))

ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}

ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE __m256 load8(const uint16_t* p) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE __m256 load8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// Lane k of the result is the sum of v[k]'s 8 lanes: adjacent pairs interleaved and added (within
// 128-bit lanes, by 32 then 64 bits), then the two 128-bit lanes folded.
ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE __m256 sum_each(const __m256* v) {
  __m256 pairs[4];
  for (int i = 0; i < 4; ++i) {
    pairs[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m256 quads[2];  // 128-bit lane l of quads[i]: partial sums of v[4i .. 4i + 3]
  for (int i = 0; i < 2; ++i) {
    const __m256d a = _mm256_castps_pd(pairs[2 * i]), b = _mm256_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                       _mm256_permute2f128_ps(quads[0], quads[1], 0x31));
}

// Asks for the rows of the next group while this one is multiplied: rows lie a page apart, in no
// order a hardware prefetcher follows.
template <typename In>
ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE void prefetch_rows(const In* const* rows, int64_t count,
                                                          int64_t width) {
  constexpr int64_t kLine = 64 / sizeof(In);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < width; c += kLine) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[i] + c), _MM_HINT_T0);
    }
  }
}

template <typename In>
ATTENTION_AVX2 void scores_avx2(const float* q, int64_t rows, int64_t d, const In* const* keys,
                                const float* key_scales, int64_t cols, float* s, int64_t ld) {
  for (int64_t j0 = 0; j0 < cols; j0 += 8) {
    const int64_t n = std::min<int64_t>(8, cols - j0);
    // A short last group repeats its first key in the missing places; their sums are not stored.
    const In* k[8];
    for (int64_t i = 0; i < 8; ++i) k[i] = keys[j0 + (i < n ? i : 0)];
    prefetch_rows(keys + j0 + n, std::min<int64_t>(8, cols - j0 - n), d);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = q + r * d;
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 x = _mm256_loadu_ps(row + c);
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(x, load8(k[i] + c), acc[i]);
      }
      const __m256 sums = sum_each(acc);
      float* to = s + r * ld + j0;
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, sums);
      if (key_scales != nullptr) {
        for (int64_t i = 0; i < n; ++i) lanes[i] *= key_scales[j0 + i];
      }
      std::copy(lanes, lanes + n, to);
    }
  }
}

// One row's output features [0, 8 * Chunks) over every key, in registers.
template <int Chunks, typename In>
ATTENTION_AVX2 ATTENTION_ALWAYS_INLINE void weigh_values(const float* p, const In* const* values,
                                                         const float* scales, int64_t cols,
                                                         int64_t c0, float* acc) {
  __m256 a[Chunks];
  for (int i = 0; i < Chunks; ++i) a[i] = _mm256_loadu_ps(acc + 8 * i);
  for (int64_t j = 0; j < cols; ++j) {
    if (p[j] == 0.0f) continue;
    const __m256 w = _mm256_set1_ps(scales != nullptr ? p[j] * scales[j] : p[j]);
    const In* v = values[j] + c0;
    for (int i = 0; i < Chunks; ++i) a[i] = _mm256_fmadd_ps(w, load8(v + 8 * i), a[i]);
  }
  for (int i = 0; i < Chunks; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
}

template <typename In>
ATTENTION_AVX2 void values_avx2(const float* p, int64_t ld, int64_t rows, const In* const* values,
                                const float* value_scales, int64_t cols, float* acc, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* weights = p + r * ld;
    float* out = acc + r * dv;
    for (int64_t c0 = 0; c0 < dv; c0 += 64) {
      switch (std::min<int64_t>(8, (dv - c0) / 8)) {
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

#undef ATTENTION_AVX2

// Float and bfloat16 rows carry no scales.
template <typename In>
void plain_scores(const float* q, int64_t rows, int64_t d, const In* const* keys, int64_t cols,
                  float* s, int64_t ld) {
  scores_avx2<In>(q, rows, d, keys, nullptr, cols, s, ld);
}
template <typename In>
void plain_values(const float* p, int64_t ld, int64_t rows, const In* const* values, int64_t cols,
                  float* acc, int64_t dv) {
  values_avx2<In>(p, ld, rows, values, nullptr, cols, acc, dv);
}

constexpr DecodeProducts kAvx2Products{"avx2",
                                       8,
                                       plain_scores<float>,
                                       plain_scores<uint16_t>,
                                       plain_values<float>,
                                       plain_values<uint16_t>,
                                       scores_avx2<int8_t>,
                                       values_avx2<int8_t>};

}  // namespace

const DecodeProducts* avx2_decode_products() {
  return processor_has_avx2_fma() ? &kAvx2Products : nullptr;
}

#else

const DecodeProducts* avx2_decode_products() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
