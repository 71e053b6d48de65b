// The paged forward's products on 128-bit vectors (kernels/cpu/decode_products.h), one source
// through Google Highway: NEON on aarch64 (which SVE processors run as well), SSE4 on x86-64
// processors without AVX2. Eight keys per group, four lanes per register; each key's partial sums
// in a register of its own, the group's eight sums gathered into two registers by interleaving
// adds; up to 32 features of a row's output held in eight registers while its keys go by.
// bfloat16 and 8-bit rows are widened on load, an 8-bit row's scale applied once per score and
// once per weight.

// Only the 128-bit targets: the wider x86 routes have intrinsic sets of their own
// (decode_products_avx512.cpp, decode_products_avx2.cpp), and the scalable SVE vectors cannot be
// kept in the arrays of registers these loops hold.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS \
  (((1LL << 10) - 1) | HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/decode_products_128.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/decode_products.h"

#include <algorithm>
#include <cstring>

// The other targets Highway compiles this file for (the baseline's) have no use for it.
#if HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SSE4
HWY_BEFORE_NAMESPACE();
namespace attention {
namespace kernels {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::FixedTag<float, 4>;
using V = hn::Vec<D>;

constexpr int kGroup = 8;  // keys whose scores one pass over a query row computes

HWY_INLINE V load4(D d, const float* p) {
  return hn::LoadU(d, p);
}

// A bfloat16 is a float's upper half.
HWY_INLINE V load4(D d, const uint16_t* p) {
  const hn::Rebind<uint16_t, D> d16;
  const hn::RebindToUnsigned<D> d32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, p))));
}

HWY_INLINE V load4(D d, const int8_t* p) {
  const hn::Rebind<int8_t, D> d8;
  const hn::RebindToSigned<D> d32;
  return hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, p)));
}

// Lane i of the result is the sum of v[i]'s four lanes: interleaved pairs added, then halves.
HWY_INLINE V sum_each4(D d, const V* v) {
  const hn::Repartition<uint64_t, D> d64;
  const V ab = hn::Add(hn::InterleaveLower(d, v[0], v[1]), hn::InterleaveUpper(d, v[0], v[1]));
  const V cd = hn::Add(hn::InterleaveLower(d, v[2], v[3]), hn::InterleaveUpper(d, v[2], v[3]));
  // ab = [a0 + a2, b0 + b2, a1 + a3, b1 + b3], cd likewise.
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, cd64)),
                 hn::BitCast(d, hn::InterleaveUpper(d64, ab64, cd64)));
}

// Asks for the rows of the next group while this one is multiplied: rows lie a page apart, in no
// order a hardware prefetcher follows.
template <typename In>
HWY_INLINE void prefetch_rows(const In* const* rows, int64_t count, int64_t width) {
  constexpr int64_t kLine = 64 / sizeof(In);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t c = 0; c < width; c += kLine) hwy::Prefetch(rows[i] + c);
  }
}

template <typename In>
void scores(const float* q, int64_t rows, int64_t d, const In* const* keys, const float* key_scales,
            int64_t cols, float* s, int64_t ld) {
  const D df;
  for (int64_t j0 = 0; j0 < cols; j0 += kGroup) {
    const int64_t n = std::min<int64_t>(kGroup, cols - j0);
    // A short last group repeats its first key in the missing places; their sums are not stored.
    const In* k[kGroup];
    HWY_ALIGN float scale[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) {
      k[i] = keys[j0 + (i < n ? i : 0)];
      scale[i] = key_scales != nullptr ? key_scales[j0 + (i < n ? i : 0)] : 1.0f;
    }
    prefetch_rows(keys + j0 + n, std::min<int64_t>(kGroup, cols - j0 - n), d);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = q + r * d;
      V acc[kGroup];
      for (int i = 0; i < kGroup; ++i) acc[i] = hn::Zero(df);
      for (int64_t c = 0; c < d; c += 4) {
        const V x = hn::LoadU(df, row + c);
        for (int i = 0; i < kGroup; ++i) acc[i] = hn::MulAdd(x, load4(df, k[i] + c), acc[i]);
      }
      HWY_ALIGN float sums[kGroup];
      hn::Store(sum_each4(df, acc), df, sums);
      hn::Store(sum_each4(df, acc + 4), df, sums + 4);
      if (key_scales != nullptr) {
        hn::Store(hn::Mul(hn::Load(df, sums), hn::Load(df, scale)), df, sums);
        hn::Store(hn::Mul(hn::Load(df, sums + 4), hn::Load(df, scale + 4)), df, sums + 4);
      }
      std::memcpy(s + r * ld + j0, sums, static_cast<size_t>(n) * sizeof(float));
    }
  }
}

// One row's output features [0, 4 * Chunks) over every key it gives a weight, in registers.
template <int Chunks, typename In>
HWY_INLINE void weigh_values(const float* p, const In* const* values, const float* scales,
                             int64_t cols, int64_t c0, float* acc) {
  const D df;
  V a[Chunks];
  for (int i = 0; i < Chunks; ++i) a[i] = hn::LoadU(df, acc + 4 * i);
  for (int64_t j = 0; j < cols; ++j) {
    // A value a row gives no weight is never read for it, whatever it (or its scale) holds.
    if (p[j] == 0.0f) continue;
    const V w = hn::Set(df, scales != nullptr ? p[j] * scales[j] : p[j]);
    const In* v = values[j] + c0;
    for (int i = 0; i < Chunks; ++i) a[i] = hn::MulAdd(w, load4(df, v + 4 * i), a[i]);
  }
  for (int i = 0; i < Chunks; ++i) hn::StoreU(a[i], df, acc + 4 * i);
}

template <typename In>
void values(const float* p, int64_t ld, int64_t rows, const In* const* values,
            const float* value_scales, int64_t cols, float* acc, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* weights = p + r * ld;
    float* out = acc + r * dv;
    // Eight registers of features at a time, then four, two, one for the rest.
    int64_t c0 = 0;
    for (; c0 + 32 <= dv; c0 += 32)
      weigh_values<8>(weights, values, value_scales, cols, c0, out + c0);
    if (c0 + 16 <= dv) {
      weigh_values<4>(weights, values, value_scales, cols, c0, out + c0);
      c0 += 16;
    }
    if (c0 + 8 <= dv) {
      weigh_values<2>(weights, values, value_scales, cols, c0, out + c0);
      c0 += 8;
    }
    if (c0 < dv) weigh_values<1>(weights, values, value_scales, cols, c0, out + c0);
  }
}

// Float and bfloat16 rows carry no scales.
template <typename In>
void plain_scores(const float* q, int64_t rows, int64_t d, const In* const* keys, int64_t cols,
                  float* s, int64_t ld) {
  scores<In>(q, rows, d, keys, nullptr, cols, s, ld);
}
template <typename In>
void plain_values(const float* p, int64_t ld, int64_t rows, const In* const* v, int64_t cols,
                  float* acc, int64_t dv) {
  values<In>(p, ld, rows, v, nullptr, cols, acc, dv);
}

void scores_i8(const float* q, int64_t rows, int64_t d, const int8_t* const* keys,
               const float* key_scales, int64_t cols, float* s, int64_t ld) {
  scores<int8_t>(q, rows, d, keys, key_scales, cols, s, ld);
}

void values_i8(const float* p, int64_t ld, int64_t rows, const int8_t* const* v,
               const float* value_scales, int64_t cols, float* acc, int64_t dv) {
  values<int8_t>(p, ld, rows, v, value_scales, cols, acc, dv);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace attention
HWY_AFTER_NAMESPACE();
#endif

#if HWY_ONCE

namespace attention {
namespace kernels {
namespace cpu {

const DecodeProducts* vector128_decode_products() {
  // A route compiled for TARGET (in Highway's namespace of it), where this processor runs it.
#define ATTENTION_PRODUCTS_ROUTE(TARGET, NAMESPACE, NAME)                       \
  if ((hwy::SupportedTargets() & (TARGET)) != 0) {                              \
    static constexpr DecodeProducts products{NAME,                              \
                                             4,                                 \
                                             NAMESPACE::plain_scores<float>,    \
                                             NAMESPACE::plain_scores<uint16_t>, \
                                             NAMESPACE::plain_values<float>,    \
                                             NAMESPACE::plain_values<uint16_t>, \
                                             NAMESPACE::scores_i8,              \
                                             NAMESPACE::values_i8};             \
    return &products;                                                           \
  }
#if HWY_TARGETS & HWY_NEON
  ATTENTION_PRODUCTS_ROUTE(HWY_NEON, N_NEON, "neon")
#endif
#if HWY_TARGETS & HWY_SSE4
  ATTENTION_PRODUCTS_ROUTE(HWY_SSE4, N_SSE4, "sse4")
#endif
#undef ATTENTION_PRODUCTS_ROUTE
  return nullptr;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention

#endif  // HWY_ONCE
