// The paged forward's products on AVX-512F (kernels/cpu/decode_products.h): 16 keys per group,
// 16 lanes per register, up to 128 features of a row's output held in 8 registers.

#include "kernels/cpu/decode_products.h"
#include "kernels/cpu/softmax.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>

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

ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE __m512 load16(const uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
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
                                    int64_t cols, float* s, int64_t ld) {
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
      _mm512_mask_storeu_ps(s + r * ld + j0, stored, sum_each(acc));
    }
  }
}

// One row's output features [0, 16 * Chunks) over every key, in registers.
template <int Chunks, typename In>
ATTENTION_AVX512 ATTENTION_ALWAYS_INLINE void weigh_values(const float* p, const In* const* values,
                                                           int64_t cols, int64_t c0, float* acc) {
  __m512 a[Chunks];
  for (int i = 0; i < Chunks; ++i) a[i] = _mm512_loadu_ps(acc + 16 * i);
  for (int64_t j = 0; j < cols; ++j) {
    if (p[j] == 0.0f) continue;
    const __m512 w = _mm512_set1_ps(p[j]);
    const In* v = values[j] + c0;
    for (int i = 0; i < Chunks; ++i) a[i] = _mm512_fmadd_ps(w, load16(v + 16 * i), a[i]);
  }
  for (int i = 0; i < Chunks; ++i) _mm512_storeu_ps(acc + 16 * i, a[i]);
}

template <typename In>
ATTENTION_AVX512 void values_avx512(const float* p, int64_t ld, int64_t rows,
                                    const In* const* values, int64_t cols, float* acc, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* weights = p + r * ld;
    float* out = acc + r * dv;
    for (int64_t c0 = 0; c0 < dv; c0 += 128) {
      switch (std::min<int64_t>(8, (dv - c0) / 16)) {
        case 8:
          weigh_values<8>(weights, values, cols, c0, out + c0);
          break;
        case 7:
          weigh_values<7>(weights, values, cols, c0, out + c0);
          break;
        case 6:
          weigh_values<6>(weights, values, cols, c0, out + c0);
          break;
        case 5:
          weigh_values<5>(weights, values, cols, c0, out + c0);
          break;
        case 4:
          weigh_values<4>(weights, values, cols, c0, out + c0);
          break;
        case 3:
          weigh_values<3>(weights, values, cols, c0, out + c0);
          break;
        case 2:
          weigh_values<2>(weights, values, cols, c0, out + c0);
          break;
        default:
          weigh_values<1>(weights, values, cols, c0, out + c0);
          break;
      }
    }
  }
}

#undef ATTENTION_AVX512

constexpr DecodeProducts kAvx512Products{"avx512",
                                         16,
                                         scores_avx512<float>,
                                         scores_avx512<uint16_t>,
                                         values_avx512<float>,
                                         values_avx512<uint16_t>};

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
