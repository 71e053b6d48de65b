// The paged forward's products (kernels/cpu/decode_products.h), written once with Google Highway
// and compiled for AVX-512F with and without VNNI, AVX2 with FMA and SSE4 on x86-64 and for NEON
// on aarch64 (which SVE processors run as well: SVE's scalable vectors cannot be kept in the
// arrays of registers these loops hold). With N lanes a register: N keys per group (eight on
// 128-bit vectors), each key's partial sums in a register of its own and the group's sums gathered
// into one register by a tree of interleaving adds; up to 8 registers of a row's output held while
// its keys go by. bfloat16 and 8-bit rows take up to four query rows at a time, each value widened
// once for all of them; 8-bit ones by default take integer products against queries and weights
// coded in 16 bits instead (the second half of the file).

#ifndef HWY_DISABLED_TARGETS
// The x86 targets above AVX3_DL (bits 0 to 6) add instructions these loops do not use; processors
// with SSSE3 and without SSE4 (before 2008) are not worth a compile of their own.
#define HWY_DISABLED_TARGETS \
  (((1LL << 7) - 1) | HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
// AVX3_DL (Ice Lake's AVX-512 and later: VNNI among them) is a target of this file only: its
// integer products are the only ones to gain from it.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/decode_products.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/decode_products.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

// The targets above; the others Highway compiles this file for (the baseline's) have no use for
// it.
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2 || \
    HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_NEON
HWY_BEFORE_NAMESPACE();
#undef ATTENTION_DPWSSD
#if HWY_TARGET == HWY_AVX3_DL && defined(__GNUC__) && !defined(__clang__)
// Highway's AVX3_DL target names AVX-VNNI but not AVX512_VNNI, whose vpdpwssd the integer
// products take; its run-time check asks for both. (Clang builds, the sanitizers', take the
// vpmaddwd of the other x86 routes there.)
#pragma GCC target("avx512vnni")
#define ATTENTION_DPWSSD 1
#else
#define ATTENTION_DPWSSD 0
#endif
namespace attention {
namespace kernels {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(D()));
// Keys whose scores one pass over a query row computes: a register's worth, and at least eight
// (so that eight chains of products are in flight).
constexpr int64_t kGroup = std::max<int64_t>(kLanes, 8);
static_assert(kLanes == 4 || kLanes == 8 || kLanes == 16, "sum_each folds 1, 2 or 4 blocks");
// Vector registers: 16 on x86 without AVX-512, 32 with it and on NEON. A block of accumulators
// larger than the registers is kept on the stack, each product then a load and a store more.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
constexpr int kRegisters = 16;
#else
constexpr int kRegisters = 32;
#endif
// For the loops over such blocks: unrolled whole, with their bounds constant, the blocks stay in
// registers (an index known only at run time keeps an array on the stack).
#undef ATTENTION_UNROLL
#define ATTENTION_UNROLL _Pragma("GCC unroll 16")
#undef ATTENTION_UNROLL_TWICE
#define ATTENTION_UNROLL_TWICE _Pragma("GCC unroll 2")

HWY_INLINE V load(D d, const float* p) {
  return hn::LoadU(d, p);
}

// A bfloat16 is a float's upper half.
HWY_INLINE V load(D d, const uint16_t* p) {
  const hn::Rebind<uint16_t, D> d16;
  const hn::RebindToUnsigned<D> d32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, p))));
}

HWY_INLINE V load(D d, const int8_t* p) {
  const hn::Rebind<int8_t, D> d8;
  const hn::RebindToSigned<D> d32;
  return hn::ConvertTo(d, hn::PromoteTo(d32, hn::LoadU(d8, p)));
}

// Exchanges the 128-bit blocks 0 and 1, 2 and 3 of a 512-bit register.
HWY_INLINE V swap_adjacent_blocks(D d, V v) {
  alignas(64) static constexpr int32_t kSwap[16] = {4,  5,  6,  7,  0, 1, 2,  3,
                                                    12, 13, 14, 15, 8, 9, 10, 11};
  return hn::TableLookupLanes(v, hn::SetTableIndices(d, kSwap));
}

// Lane k of the result is the sum of v[k]'s lanes, for kLanes registers. Adjacent pairs
// interleaved and added within 128-bit blocks, by 32 then 64 bits: block l of quads[i] then holds
// partial sums of v[4i .. 4i + 3]; the blocks are folded last.
HWY_INLINE V sum_each(D d, const V* v) {
  const hn::Repartition<uint64_t, D> d64;
  V pairs[kLanes / 2];
  for (int64_t i = 0; i < kLanes / 2; ++i) {
    pairs[i] = hn::Add(hn::InterleaveLower(d, v[2 * i], v[2 * i + 1]),
                       hn::InterleaveUpper(d, v[2 * i], v[2 * i + 1]));
  }
  V quads[kLanes / 4];
  for (int64_t i = 0; i < kLanes / 4; ++i) {
    const auto a = hn::BitCast(d64, pairs[2 * i]), b = hn::BitCast(d64, pairs[2 * i + 1]);
    quads[i] = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, a, b)),
                       hn::BitCast(d, hn::InterleaveUpper(d64, a, b)));
  }
  if constexpr (kLanes == 4) {
    return quads[0];
  } else if constexpr (kLanes == 8) {
    return hn::Add(hn::ConcatLowerLower(d, quads[1], quads[0]),
                   hn::ConcatUpperUpper(d, quads[1], quads[0]));
  } else {
    // Halves added: t = [q0 (blocks 0 + 2), q0 (1 + 3), q2 (0 + 2), q2 (1 + 3)], u with q1, q3.
    const V t = hn::Add(hn::ConcatLowerLower(d, quads[2], quads[0]),
                        hn::ConcatUpperUpper(d, quads[2], quads[0]));
    const V u = hn::Add(hn::ConcatLowerLower(d, quads[3], quads[1]),
                        hn::ConcatUpperUpper(d, quads[3], quads[1]));
    // Then blocks: [t0, u1, t2, u3] + [t1, u0, t3, u2].
    return hn::Add(hn::OddEvenBlocks(u, t), swap_adjacent_blocks(d, hn::OddEvenBlocks(t, u)));
  }
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
    for (int64_t i = 0; i < kGroup; ++i) k[i] = keys[j0 + (i < n ? i : 0)];
    prefetch_rows(keys + j0 + n, std::min<int64_t>(kGroup, cols - j0 - n), d);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = q + r * d;
      V acc[kGroup];
      for (int64_t i = 0; i < kGroup; ++i) acc[i] = hn::Zero(df);
      for (int64_t c = 0; c < d; c += kLanes) {
        const V x = hn::LoadU(df, row + c);
        for (int64_t i = 0; i < kGroup; ++i) acc[i] = hn::MulAdd(x, load(df, k[i] + c), acc[i]);
      }
      float* to = s + r * ld + j0;
      if (n == kGroup) {  // a whole group: stored as it is summed
        for (int64_t i = 0; i < kGroup; i += kLanes) {
          V sum = sum_each(df, acc + i);
          if (key_scales != nullptr) sum = hn::Mul(sum, hn::LoadU(df, key_scales + j0 + i));
          hn::StoreU(sum, df, to + i);
        }
        continue;
      }
      HWY_ALIGN float sums[kGroup];
      for (int64_t i = 0; i < kGroup; i += kLanes) hn::Store(sum_each(df, acc + i), df, sums + i);
      for (int64_t i = 0; i < n; ++i)
        to[i] = key_scales != nullptr ? sums[i] * key_scales[j0 + i] : sums[i];
    }
  }
}

// One row's output features [0, kLanes * Chunks) over every key it gives a weight, in registers.
template <int Chunks, typename In>
HWY_INLINE void weigh_values(const float* p, const In* const* values, const float* scales,
                             int64_t cols, int64_t c0, float* acc) {
  const D df;
  V a[Chunks];
  for (int i = 0; i < Chunks; ++i) a[i] = hn::LoadU(df, acc + kLanes * i);
  for (int64_t j = 0; j < cols; ++j) {
    // A value a row gives no weight is never read for it, whatever it (or its scale) holds.
    if (p[j] == 0.0f) continue;
    const V w = hn::Set(df, scales != nullptr ? p[j] * scales[j] : p[j]);
    const In* v = values[j] + c0;
    for (int i = 0; i < Chunks; ++i) a[i] = hn::MulAdd(w, load(df, v + kLanes * i), a[i]);
  }
  for (int i = 0; i < Chunks; ++i) hn::StoreU(a[i], df, acc + kLanes * i);
}

// Calls f(std::integral_constant<int, n>()) with n = min(Max, count), count >= 1: a number of
// rows or registers as a template argument, so that the registers are known when it compiles.
template <int Max, typename F>
HWY_INLINE void up_to(int64_t count, const F& f) {
  if constexpr (Max == 1) {
    f(std::integral_constant<int, 1>());
  } else {
    if (count >= Max) {
      f(std::integral_constant<int, Max>());
    } else {
      up_to<Max - 1>(count, f);
    }
  }
}

template <typename In>
void values(const float* p, int64_t ld, int64_t rows, const In* const* values,
            const float* value_scales, int64_t cols, float* acc, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* weights = p + r * ld;
    float* out = acc + r * dv;
    for (int64_t c0 = 0; c0 < dv; c0 += 8 * kLanes) {
      up_to<8>((dv - c0) / kLanes, [&](auto chunks) {
        weigh_values<chunks()>(weights, values, value_scales, cols, c0, out + c0);
      });
    }
  }
}

// bfloat16 and 8-bit keys and values: each widened in registers once per block of up to four
// rows, and used there by all of them. Widening a group of keys into a float buffer that every
// row then read (an earlier form) took about twice the instructions, and the decoding step with
// such a cache is bound by them where its rows are in the processor's caches. (Float rows are
// the multiply-adds' operands as they are, one query row at a time.)

// The keys [j0, j0 + n) of a group of Keys in k, n = min(Keys, cols - j0). A short last group
// repeats its first key in the missing places; their sums are not stored.
template <int64_t Keys, typename In>
HWY_INLINE int64_t key_group(const In* const* keys, int64_t j0, int64_t cols, const In** k) {
  const int64_t n = std::min<int64_t>(Keys, cols - j0);
  for (int64_t i = 0; i < Keys; ++i) k[i] = keys[j0 + (i < n ? i : 0)];
  return n;
}

// Asks for the keys kGroup ahead of a group of Keys at j0 (and at the first group for those in
// between), each once: the next group alone is too short a distance for the memory to deliver
// the rows in time (docs/PERFORMANCE.md, the bfloat16 decoding step on an AVX2 processor).
template <int64_t Keys, typename In>
HWY_INLINE void prefetch_ahead(const In* const* keys, int64_t j0, int64_t cols, int64_t d) {
  const int64_t from = j0 == 0 ? Keys : j0 + kGroup;
  const int64_t to = std::min<int64_t>(cols, j0 + kGroup + Keys);
  if (to > from) prefetch_rows(keys + from, to - from, d);
}

// Rows [0, Rows) against keys [0, cols), kLanes / 4 keys at a time; acc[r * kKeys + i] holds row
// r's partial sums against key i, so that one sum_each gives the block's scores. 8-bit keys are
// times their scales; bfloat16 keys (key_scales null) have none.
template <int Rows, typename In>
void scores_block(const float* q, int64_t d, const In* const* keys, const float* key_scales,
                  int64_t cols, float* s, int64_t ld) {
  constexpr int64_t kKeys = kLanes / 4;
  const D df;
  for (int64_t j0 = 0; j0 < cols; j0 += kKeys) {
    const In* k[kKeys];
    const int64_t n = key_group<kKeys>(keys, j0, cols, k);
    prefetch_ahead<kKeys>(keys, j0, cols, d);
    V acc[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) acc[i] = hn::Zero(df);
    for (int64_t c = 0; c < d; c += kLanes) {
      for (int64_t i = 0; i < kKeys; ++i) {
        const V x = load(df, k[i] + c);
        for (int r = 0; r < Rows; ++r) {
          acc[r * kKeys + i] = hn::MulAdd(hn::LoadU(df, q + r * d + c), x, acc[r * kKeys + i]);
        }
      }
    }
    HWY_ALIGN float sums[kLanes];  // lane r * kKeys + i: row r against key i
    hn::Store(sum_each(df, acc), df, sums);
    for (int r = 0; r < Rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        s[r * ld + j0 + i] =
            key_scales != nullptr ? sums[r * kKeys + i] * key_scales[j0 + i] : sums[r * kKeys + i];
      }
    }
  }
}

// Scores of rows against widened keys: one row a group of keys at a time, more in blocks of up
// to four rows.
template <typename In>
void scores_rows(const float* q, int64_t rows, int64_t d, const In* const* keys,
                 const float* key_scales, int64_t cols, float* s, int64_t ld) {
  if (rows == 1) {  // a group of keys at a time in registers
    scores<In>(q, rows, d, keys, key_scales, cols, s, ld);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    up_to<4>(rows - r0, [&](auto block) {
      scores_block<block(), In>(q + r0 * d, d, keys, key_scales, cols, s + r0 * ld, ld);
    });
  }
}

void scores_i8(const float* q, int64_t rows, int64_t d, const int8_t* const* keys,
               const float* key_scales, int64_t cols, float* s, int64_t ld) {
  scores_rows<int8_t>(q, rows, d, keys, key_scales, cols, s, ld);
}

// Rows [0, Rows)' outputs, features [c0, c0 + kLanes * Chunks), over keys [0, cols), each value
// widened once for all of them: weights[r * wld + j] is row r's weight of key j (for 8-bit
// values, times the key's scale, 0 where the weight is). A row adds nothing for a bfloat16 value
// it gives no weight: a NaN there stays out of it (8-bit codes are finite).
constexpr int64_t kWeightKeys = 64;

template <int Rows, int Chunks, typename In>
void values_block(const float* weights, int64_t wld, int64_t cols, const In* const* values,
                  const uint8_t* every_row_weighs, int64_t c0, float* acc, int64_t dv) {
  const D df;
  V a[Rows * Chunks];
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < Chunks; ++i)
      a[r * Chunks + i] = hn::LoadU(df, acc + r * dv + c0 + kLanes * i);
  }
  for (int64_t j = 0; j < cols; ++j) {
    const In* v = values[j] + c0;
    V x[Chunks];
    for (int i = 0; i < Chunks; ++i) x[i] = load(df, v + kLanes * i);
    // Where every row of the block weighs the value (marked once for all feature chunks), no
    // row's weight is tested: the tests would cost as much as the products.
    if (std::is_same_v<In, int8_t> || every_row_weighs[j]) {
      for (int r = 0; r < Rows; ++r) {
        const V w = hn::Set(df, weights[r * wld + j]);
        for (int i = 0; i < Chunks; ++i) a[r * Chunks + i] = hn::MulAdd(w, x[i], a[r * Chunks + i]);
      }
      continue;
    }
    for (int r = 0; r < Rows; ++r) {
      const float weight = weights[r * wld + j];
      if (weight == 0.0f) continue;
      const V w = hn::Set(df, weight);
      for (int i = 0; i < Chunks; ++i) a[r * Chunks + i] = hn::MulAdd(w, x[i], a[r * Chunks + i]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int i = 0; i < Chunks; ++i)
      hn::StoreU(a[r * Chunks + i], df, acc + r * dv + c0 + kLanes * i);
  }
}

// The most registers of features values_i8_block<Rows, ...> takes: its Rows x Chunks sums, the
// Chunks of a value and the weight within the registers (and at most 4).
template <int Rows>
constexpr int value_chunks() {
  int chunks = 4;
  while (chunks > 1 && Rows * chunks + chunks + 1 > kRegisters - 1) --chunks;
  return chunks;
}

// Keys [0, cols), up to kWeightKeys of them for 8-bit values (whose weights are 0 only where
// the row gives none); bfloat16 values are taken kWeightKeys keys at a time, each marked where
// every row of the block gives it a weight.
template <int Rows, typename In>
void values_rows(const float* weights, int64_t wld, int64_t cols, const In* const* values,
                 float* acc, int64_t dv) {
  constexpr int kChunks = value_chunks<Rows>();
  uint8_t every_row_weighs[kWeightKeys];
  for (int64_t j0 = 0; j0 < cols; j0 += kWeightKeys) {
    const int64_t m = std::min(kWeightKeys, cols - j0);
    if constexpr (!std::is_same_v<In, int8_t>) {
      for (int64_t j = 0; j < m; ++j) {
        bool every = true;
        for (int r = 0; r < Rows; ++r) every = every && weights[r * wld + j0 + j] != 0.0f;
        every_row_weighs[j] = every;
      }
    }
    for (int64_t c0 = 0; c0 < dv; c0 += kChunks * kLanes) {
      up_to<kChunks>((dv - c0) / kLanes, [&](auto chunks) {
        values_block<Rows, chunks(), In>(weights + j0, wld, m, values + j0, every_row_weighs, c0,
                                         acc, dv);
      });
    }
  }
}

void values_i8(const float* p, int64_t ld, int64_t rows, const int8_t* const* values,
               const float* value_scales, int64_t cols, float* acc, int64_t dv) {
  const D df;
  HWY_ALIGN float weights[4 * kWeightKeys];
  for (int64_t j0 = 0; j0 < cols; j0 += kWeightKeys) {
    const int64_t m = std::min(kWeightKeys, cols - j0);
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t block = std::min<int64_t>(4, rows - r0);
      // A weight of 0 stays 0, whatever the key's scale (a NaN scale stays out of a row that
      // gives its value no weight: the codes themselves are finite).
      for (int64_t r = 0; r < block; ++r) {
        const float* row = p + (r0 + r) * ld + j0;
        int64_t j = 0;
        for (; j + kLanes <= m; j += kLanes) {
          const V weight = hn::LoadU(df, row + j);
          const V scaled = hn::Mul(weight, hn::LoadU(df, value_scales + j0 + j));
          hn::Store(hn::IfThenZeroElse(hn::Eq(weight, hn::Zero(df)), scaled), df,
                    weights + r * kWeightKeys + j);
        }
        for (; j < m; ++j) {
          weights[r * kWeightKeys + j] = row[j] == 0.0f ? 0.0f : row[j] * value_scales[j0 + j];
        }
      }
      up_to<4>(block, [&](auto block_rows) {
        values_rows<block_rows(), int8_t>(weights, kWeightKeys, m, values + j0, acc + r0 * dv, dv);
      });
    }
  }
}

// ---- 8-bit keys against coded queries, on integer products ----
// Rows [0, Rows) of 16-bit query codes against kLanes / Rows keys at a time, their 8-bit codes
// widened to 16 bits once for all rows; acc[r * kKeys + i] holds row r's 32-bit partial sums
// against key i. Each lane's sum is exact; it is converted to float (within float's rounding of
// it) before one sum_each gathers the block's scores.

using D16 = hn::Repartition<int16_t, D>;  // twice the lanes of D
using D32 = hn::RebindToSigned<D>;
using V32 = hn::Vec<D32>;
constexpr int64_t kCodeLanes = 2 * kLanes;

// acc + a[2l] * b[2l] + a[2l + 1] * b[2l + 1] in each 32-bit lane l. (Highway's
// ReorderWidenMulAccumulate promises only the sum over all lanes: on x86 its lanes are the pairs,
// on NEON they are not, and the rows-across-lanes products need them to be.)
HWY_INLINE V32 dot_pairs(D32 d32, hn::Vec<D16> a, hn::Vec<D16> b, V32 acc) {
#if ATTENTION_DPWSSD
  (void)d32;
  return V32{_mm512_dpwssd_epi32(acc.raw, a.raw, b.raw)};
#elif HWY_ARCH_X86
  V32 unused = hn::Zero(d32);  // vpmaddwd: each lane its pair's sum, in the first sum
  return hn::ReorderWidenMulAccumulate(d32, a, b, acc, unused);
#elif HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
  (void)d32;
  const int32x4_t low = vmull_s16(vget_low_s16(a.raw), vget_low_s16(b.raw));
  const int32x4_t high = vmull_high_s16(a.raw, b.raw);
  return V32(vaddq_s32(acc.raw, vpaddq_s32(low, high)));
#else
  // Each pair's halves sign-extended in its 32-bit lane, multiplied and added.
  const auto wide_a = hn::BitCast(d32, a), wide_b = hn::BitCast(d32, b);
  const V32 even = hn::Mul(hn::ShiftRight<16>(hn::ShiftLeft<16>(wide_a)),
                           hn::ShiftRight<16>(hn::ShiftLeft<16>(wide_b)));
  const V32 odd = hn::Mul(hn::ShiftRight<16>(wide_a), hn::ShiftRight<16>(wide_b));
  return hn::Add(acc, hn::Add(even, odd));
#endif
}

template <int Rows>
void scores_coded_block(const int16_t* codes, const float* q_scales, int64_t d,
                        const int8_t* const* keys, const float* key_scales, int64_t cols, float* s,
                        int64_t ld, RowsAhead* ahead) {
  constexpr int64_t kKeys = kLanes / Rows;
  const D df;
  const D32 d32;
  const D16 d16;
  const hn::Rebind<int8_t, D16> d8;
  for (int64_t j0 = 0; j0 < cols; j0 += kKeys) {
    const int8_t* k[kKeys];
    const int64_t n = key_group<kKeys>(keys, j0, cols, k);
    prefetch_rows(keys + j0 + n, std::min<int64_t>(kKeys, cols - j0 - n), d);  // the next group
    if (ahead != nullptr) ahead->step();
    V32 acc[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) acc[i] = hn::Zero(d32);
    for (int64_t c = 0; c < d; c += kCodeLanes) {
      for (int64_t i = 0; i < kKeys; ++i) {
        const auto x = hn::PromoteTo(d16, hn::LoadU(d8, k[i] + c));
        for (int r = 0; r < Rows; ++r) {
          acc[r * kKeys + i] =
              dot_pairs(d32, hn::LoadU(d16, codes + r * d + c), x, acc[r * kKeys + i]);
        }
      }
    }
    V sums_of[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) sums_of[i] = hn::ConvertTo(df, acc[i]);
    HWY_ALIGN float sums[kLanes];  // lane r * kKeys + i: row r against key i
    hn::Store(sum_each(df, sums_of), df, sums);
    for (int r = 0; r < Rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        s[r * ld + j0 + i] = sums[r * kKeys + i] * (q_scales[r] * key_scales[j0 + i]);
      }
    }
  }
}

void scores_coded(const int16_t* codes, const float* q_scales, int64_t rows, int64_t d,
                  const int8_t* const* keys, const float* key_scales, int64_t cols, float* s,
                  int64_t ld, RowsAhead* ahead) {
  if (ahead != nullptr) {
    // One step for each group of keys of each block of rows below.
    const auto groups = [&](int64_t keys_a_group) {
      return (cols + keys_a_group - 1) / keys_a_group;
    };
    ahead->spread_over(rows / 4 * groups(kLanes / 4) + rows % 4 / 2 * groups(kLanes / 2) +
                       rows % 2 * groups(kLanes));
  }
  int64_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) {
    scores_coded_block<4>(codes + r0 * d, q_scales + r0, d, keys, key_scales, cols, s + r0 * ld, ld,
                          ahead);
  }
  if (rows - r0 >= 2) {
    scores_coded_block<2>(codes + r0 * d, q_scales + r0, d, keys, key_scales, cols, s + r0 * ld, ld,
                          ahead);
    r0 += 2;
  }
  if (r0 < rows) {
    scores_coded_block<1>(codes + r0 * d, q_scales + r0, d, keys, key_scales, cols, s + r0 * ld, ld,
                          ahead);
  }
  if (ahead != nullptr) ahead->rest();
}

// Many rows against a tile's keys, the rows across lanes: for each pair of features, each key's
// pair of codes (widened to 16 bits once, for every row) is broadcast into every lane and meets
// RowVecs registers of rows' code pairs; kBlockKeys keys at a time, kBlockKeys * RowVecs sums in
// registers (a group of kColumnKeys widened keys in blocks of 4 where there are 16 registers).
constexpr int64_t kColumnKeys = kCodedColumnKeys;
constexpr int64_t kBlockKeys = kRegisters >= 32 ? kColumnKeys : 4;
static_assert(kColumnKeys % kBlockKeys == 0, "a group is whole blocks");

// The products of both: sums[k * RowVecs + v] = the sum over p < count of the pairs of rows
// v * kLanes... in lanes (lane_pairs[p * rows + ...]) times the pair broadcast[k * k_step + p *
// p_step], for k < kBlockKeys.
template <int RowVecs>
HWY_INLINE void column_products(const int32_t* lane_pairs, int64_t rows, const int32_t* broadcast,
                                int64_t k_step, int64_t p_step, int64_t count, V32* sums) {
  const D32 d32;
  const D16 d16;
  ATTENTION_UNROLL
  for (int64_t i = 0; i < kBlockKeys * RowVecs; ++i) sums[i] = hn::Zero(d32);
  // Two pairs a step (an unrolled copy of the loop): GCC copies each sum between two registers at
  // the end of every step, half as often then.
  ATTENTION_UNROLL_TWICE
  for (int64_t p = 0; p < count; ++p) {
    hn::Vec<D16> lanes[RowVecs];
    for (int v = 0; v < RowVecs; ++v) {
      lanes[v] = hn::BitCast(d16, hn::LoadU(d32, lane_pairs + p * rows + v * kLanes));
    }
    for (int64_t k = 0; k < kBlockKeys; ++k) {
      const auto pair = hn::BitCast(d16, hn::Set(d32, broadcast[k * k_step + p * p_step]));
      for (int v = 0; v < RowVecs; ++v) {
        sums[k * RowVecs + v] = dot_pairs(d32, lanes[v], pair, sums[k * RowVecs + v]);
      }
    }
  }
}

template <int RowVecs>
void scores_columns_block(const int32_t* pairs, const float* q_scales, int64_t rows, int64_t d,
                          const int32_t* key_pairs, const float* key_scales, int64_t n, float* s_t,
                          int64_t ld_t) {
  const D df;
  V32 acc[kBlockKeys * RowVecs];
  column_products<RowVecs>(pairs, rows, key_pairs, d / 2, 1, d / 2, acc);
  // Constant bounds (ATTENTION_UNROLL): with `n` as the bound the sums were kept on the stack,
  // zeroed there and copied between registers in the loop above.
  ATTENTION_UNROLL
  for (int64_t k = 0; k < kBlockKeys; ++k) {
    if (k >= n) continue;
    ATTENTION_UNROLL
    for (int v = 0; v < RowVecs; ++v) {
      const V scales = hn::Mul(hn::LoadU(df, q_scales + v * kLanes), hn::Set(df, key_scales[k]));
      hn::StoreU(hn::Mul(hn::ConvertTo(df, acc[k * RowVecs + v]), scales), df,
                 s_t + k * ld_t + v * kLanes);
    }
  }
}

void scores_coded_columns(const int32_t* pairs, const float* q_scales, int64_t rows, int64_t d,
                          const int8_t* const* keys, const float* key_scales, int64_t cols,
                          float* s_t, int64_t ld_t, int32_t* key_pairs) {
  const D32 d32;
  const D16 d16;
  const hn::Rebind<int8_t, D16> d8;
  for (int64_t j0 = 0; j0 < cols; j0 += kColumnKeys) {
    const int64_t n = std::min(kColumnKeys, cols - j0);
    // The group's keys widened to 16 bits, in pairs (a short group's missing keys repeat its
    // first).
    for (int64_t k = 0; k < kColumnKeys; ++k) {
      const int8_t* key = keys[j0 + (k < n ? k : 0)];
      for (int64_t c = 0; c < d; c += kCodeLanes) {
        const auto widened = hn::PromoteTo(d16, hn::LoadU(d8, key + c));
        hn::StoreU(hn::BitCast(d32, widened), d32, key_pairs + (k * d + c) / 2);
      }
    }
    prefetch_rows(keys + j0 + n, std::min(kColumnKeys, cols - j0 - n), d);
    for (int64_t k0 = 0; k0 < n; k0 += kBlockKeys) {
      const int32_t* block = key_pairs + k0 * (d / 2);
      const int64_t block_n = std::min(kBlockKeys, n - k0);
      float* to = s_t + (j0 + k0) * ld_t;
      int64_t r0 = 0;
      for (; r0 + 2 * kLanes <= rows; r0 += 2 * kLanes) {
        scores_columns_block<2>(pairs + r0, q_scales + r0, rows, d, block, key_scales + j0 + k0,
                                block_n, to + r0, ld_t);
      }
      for (; r0 < rows; r0 += kLanes) {
        scores_columns_block<1>(pairs + r0, q_scales + r0, rows, d, block, key_scales + j0 + k0,
                                block_n, to + r0, ld_t);
      }
    }
  }
}

// Weighted 8-bit values on integer products: rows' weights coded in 16 bits over runs of up to
// kCodedValueKeys keys, two keys' weights a 32-bit word broadcast into every lane against the two
// keys' value codes interleaved in 16-bit pairs. InterleaveLower and InterleaveUpper pair the
// codes within each 128-bit block, so lane 4k + i of the lower product sums feature 8k + i of
// the register's features and of the upper one feature 8k + 4 + i; the sums are put back in
// order once per run.
constexpr int64_t kCodedValueKeys = 256;
// Rows of a block: each pair of value registers is made once for all of them, in products of
// up to kProductRows rows (two sums a row, within the registers).
constexpr int64_t kCodedValueRows = 8;
constexpr int kProductRows = kRegisters >= 32 ? 8 : 4;
// A row's codes in the block's buffer: room for the 0 after an odd run.
constexpr int64_t kCodedValueStride = kCodedValueKeys + 2;
static_assert(coded_values_scratch_words(0, 1) == kCodedValueKeys / 2,
              "the scratch holds a run's pairs of keys");

// Row `p`'s weights of keys [0, m) times their scales, as codes (codes[m] is 0, for an odd m's
// last pair) and the scale they take; false where a weight is not finite or too small for a
// scale, or (*scale 0) where every weight is 0.
bool code_weights(const float* p, const float* scales, int64_t m, int16_t* codes, float* scale) {
  const D df;
  const hn::Rebind<int16_t, D32> d16;
  HWY_ALIGN float w[kCodedValueKeys];
  V largest = hn::Zero(df), probe = hn::Zero(df);  // probe: NaN where a weight is not finite
  int64_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    const V weight = hn::LoadU(df, p + j);
    const V scaled = hn::IfThenZeroElse(hn::Eq(weight, hn::Zero(df)),
                                        hn::Mul(weight, hn::LoadU(df, scales + j)));
    probe = hn::MulAdd(scaled, hn::Zero(df), probe);
    largest = hn::Max(largest, hn::Abs(scaled));
    hn::Store(scaled, df, w + j);
  }
  float top = hn::GetLane(hn::MaxOfLanes(df, largest));
  bool finite = !std::isnan(hn::GetLane(hn::SumOfLanes(df, probe)));
  for (; j < m; ++j) {
    w[j] = p[j] == 0.0f ? 0.0f : p[j] * scales[j];
    finite = finite && std::isfinite(w[j]);
    top = std::max(top, std::abs(w[j]));
  }
  if (!finite) return false;
  codes[m] = 0;
  *scale = top / 32767.0f;
  if (top == 0) return true;
  if (*scale == 0) return false;  // weights too small for a scale
  const V step = hn::Set(df, *scale);
  j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    const auto code = hn::NearestInt(hn::Div(hn::Load(df, w + j), step));
    hn::StoreU(hn::DemoteTo(d16, code), d16, codes + j);
  }
  for (; j < m; ++j) codes[j] = static_cast<int16_t>(std::nearbyint(w[j] / *scale));
  return true;
}

// Row `p`'s weights of keys [0, m) coded as code_weights() codes them, into codes[0, m] and
// *scale. A row it cannot code takes values_i8's float products into acc_row here, and codes of
// 0 and a scale of 0 for the integer products, as does a row whose weights are all 0: whatever
// those add is 0.
void code_row(const float* p, const int8_t* const* values, const float* value_scales, int64_t m,
              float* acc_row, int64_t dv, int16_t* codes, float* scale) {
  const bool coded = code_weights(p, value_scales, m, codes, scale);
  if (!coded) values_i8(p, m, 1, values, value_scales, m, acc_row, dv);
  if (!coded || *scale == 0) {
    std::fill(codes, codes + m + 1, int16_t{0});
    *scale = 0;
  }
}

// Rows [0, Rows) of coded weights (codes[r * kCodedValueStride + j]) against the values of keys
// [0, m), added to acc (row stride dv) times each row's scale.
template <int Rows>
void values_coded_block(const int16_t* codes, const float* scales, const int8_t* const* values,
                        int64_t m, float* acc, int64_t dv, RowsAhead* ahead) {
  const D df;
  const D32 d32;
  const D16 d16;
  const hn::Rebind<int8_t, D16> d8;
  for (int64_t c0 = 0; c0 < dv; c0 += kCodeLanes) {
    if (ahead != nullptr) ahead->step();
    V32 lower[Rows], upper[Rows];
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) lower[r] = upper[r] = hn::Zero(d32);
    // Two pairs of keys a step (an unrolled copy of the loop): GCC copies each sum between two
    // registers at the end of every step, half as often then.
    ATTENTION_UNROLL_TWICE
    for (int64_t j = 0; j < m; j += 2) {
      const auto x0 = hn::PromoteTo(d16, hn::LoadU(d8, values[j] + c0));
      // An odd run's last pair: its second weight is 0, any row will do. (A select: the branch
      // it replaced read x0's row twice.)
      const auto x1 = hn::PromoteTo(d16, hn::LoadU(d8, values[std::min(j + 1, m - 1)] + c0));
      const auto low = hn::InterleaveLower(d16, x0, x1), high = hn::InterleaveUpper(d16, x0, x1);
      ATTENTION_UNROLL
      for (int r = 0; r < Rows; ++r) {
        int32_t word;  // the weights of keys j (low half) and j + 1
        std::memcpy(&word, codes + r * kCodedValueStride + j, sizeof word);
        const auto pair = hn::BitCast(d16, hn::Set(d32, word));
        lower[r] = dot_pairs(d32, low, pair, lower[r]);
        upper[r] = dot_pairs(d32, high, pair, upper[r]);
      }
    }
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) {
      HWY_ALIGN float low_sums[kLanes], high_sums[kLanes];
      const V scale = hn::Set(df, scales[r]);
      hn::Store(hn::Mul(hn::ConvertTo(df, lower[r]), scale), df, low_sums);
      hn::Store(hn::Mul(hn::ConvertTo(df, upper[r]), scale), df, high_sums);
      float* out = acc + r * dv + c0;
      for (int64_t l = 0; l < kLanes; ++l) {
        const int64_t feature = 8 * (l / 4) + l % 4;
        out[feature] += low_sums[l];
        out[feature + 4] += high_sums[l];
      }
    }
  }
}

// Many rows' weighted values, the rows across lanes (as scores_columns_block's scores): for each
// pair of keys, each feature's pair of value codes (widened to 16 bits once a run, for every row)
// is broadcast into every lane and meets RowVecs registers of rows' weight-code pairs. A run's
// pairs of keys go by for kBlockKeys features at a time, kBlockKeys * RowVecs sums in registers;
// the features' value pairs lie in slots (value_pairs) as values_coded_block's lanes hold them.

// The feature a value-pair slot holds, within each chunk of kCodeLanes features: the lanes of
// InterleaveLower's product and then of InterleaveUpper's (values_coded_block's order).
HWY_INLINE int64_t slot_feature(int64_t slot) {
  const int64_t lane = slot % kLanes;
  return slot - slot % kCodeLanes + 8 * (lane / 4) + lane % 4 +
         (slot % kCodeLanes >= kLanes ? 4 : 0);
}

template <int RowVecs>
void values_columns_block(const int32_t* weight_pairs, int64_t rows, int64_t pairs,
                          const int32_t* value_pairs, int64_t dv, int64_t s0, const float* scales,
                          float* acc) {
  const D df;
  V32 sums[kBlockKeys * RowVecs];
  column_products<RowVecs>(weight_pairs, rows, value_pairs + s0, 1, dv, pairs, sums);
  ATTENTION_UNROLL
  for (int64_t f = 0; f < kBlockKeys; ++f) {
    const int64_t feature = slot_feature(s0 + f);
    ATTENTION_UNROLL
    for (int v = 0; v < RowVecs; ++v) {
      HWY_ALIGN float weighted[kLanes];
      hn::Store(
          hn::Mul(hn::ConvertTo(df, sums[f * RowVecs + v]), hn::LoadU(df, scales + v * kLanes)), df,
          weighted);
      for (int64_t l = 0; l < kLanes; ++l) acc[(v * kLanes + l) * dv + feature] += weighted[l];
    }
  }
}

// values_coded's products where the rows are a multiple of the lanes: each run's rows coded one
// at a time, their codes laid in pairs across rows, its values widened into pairs of keys once.
void values_coded_columns(const float* p, int64_t ld, int64_t rows, const int8_t* const* values,
                          const float* value_scales, int64_t cols, float* acc, int64_t dv,
                          RowsAhead* ahead, int32_t* scratch) {
  const D32 d32;
  const D16 d16;
  const hn::Rebind<int8_t, D16> d8;
  constexpr int64_t kMostPairs = kCodedValueKeys / 2;
  int32_t* value_pairs = scratch;                                              // kMostPairs x dv
  int32_t* weight_pairs = scratch + kMostPairs * dv;                           // kMostPairs x rows
  float* scales = reinterpret_cast<float*>(weight_pairs + kMostPairs * rows);  // rows
  if (ahead != nullptr) {
    const int64_t runs = (cols + kCodedValueKeys - 1) / kCodedValueKeys;
    ahead->spread_over(runs * (dv / kBlockKeys) * ((rows + 2 * kLanes - 1) / (2 * kLanes)));
  }
  HWY_ALIGN int16_t codes[kCodedValueStride];
  for (int64_t j0 = 0; j0 < cols; j0 += kCodedValueKeys) {
    const int64_t m = std::min(kCodedValueKeys, cols - j0), pairs = (m + 1) / 2;
    for (int64_t r = 0; r < rows; ++r) {
      code_row(p + r * ld + j0, values + j0, value_scales + j0, m, acc + r * dv, dv, codes,
               scales + r);
      for (int64_t q = 0; q < pairs; ++q) {
        const auto low = static_cast<uint16_t>(codes[2 * q]);
        const auto high = static_cast<uint16_t>(codes[2 * q + 1]);
        weight_pairs[q * rows + r] = static_cast<int32_t>(static_cast<uint32_t>(high) << 16 | low);
      }
    }
    for (int64_t q = 0; q < pairs; ++q) {
      // An odd run's last pair: its second weight is 0, any row will do.
      const int8_t* first = values[j0 + 2 * q];
      const int8_t* second = values[j0 + std::min(2 * q + 1, m - 1)];
      for (int64_t c0 = 0; c0 < dv; c0 += kCodeLanes) {
        const auto x0 = hn::PromoteTo(d16, hn::LoadU(d8, first + c0));
        const auto x1 = hn::PromoteTo(d16, hn::LoadU(d8, second + c0));
        int32_t* to = value_pairs + q * dv + c0;
        hn::StoreU(hn::BitCast(d32, hn::InterleaveLower(d16, x0, x1)), d32, to);
        hn::StoreU(hn::BitCast(d32, hn::InterleaveUpper(d16, x0, x1)), d32, to + kLanes);
      }
    }
    for (int64_t s0 = 0; s0 < dv; s0 += kBlockKeys) {
      int64_t r0 = 0;
      for (; r0 + 2 * kLanes <= rows; r0 += 2 * kLanes) {
        if (ahead != nullptr) ahead->step();
        values_columns_block<2>(weight_pairs + r0, rows, pairs, value_pairs, dv, s0, scales + r0,
                                acc + r0 * dv);
      }
      for (; r0 < rows; r0 += kLanes) {
        if (ahead != nullptr) ahead->step();
        values_columns_block<1>(weight_pairs + r0, rows, pairs, value_pairs, dv, s0, scales + r0,
                                acc + r0 * dv);
      }
    }
  }
  if (ahead != nullptr) ahead->rest();
}

void values_coded(const float* p, int64_t ld, int64_t rows, const int8_t* const* values,
                  const float* value_scales, int64_t cols, float* acc, int64_t dv, RowsAhead* ahead,
                  int32_t* scratch) {
  if (scratch != nullptr && rows % kLanes == 0 && rows >= 2 * kLanes) {
    values_coded_columns(p, ld, rows, values, value_scales, cols, acc, dv, ahead, scratch);
    return;
  }
  HWY_ALIGN int16_t codes[kCodedValueRows * kCodedValueStride];
  float scales[kCodedValueRows];
  if (ahead != nullptr) {
    // One step for each block of features of each block of rows of each run below.
    const int64_t runs = (cols + kCodedValueKeys - 1) / kCodedValueKeys;
    const int64_t blocks =
        rows / kCodedValueRows * ((kCodedValueRows + kProductRows - 1) / kProductRows) +
        (rows % kCodedValueRows + kProductRows - 1) / kProductRows;
    ahead->spread_over(runs * blocks * (dv / kCodeLanes));
  }
  for (int64_t j0 = 0; j0 < cols; j0 += kCodedValueKeys) {
    const int64_t m = std::min(kCodedValueKeys, cols - j0);
    for (int64_t r0 = 0; r0 < rows; r0 += kCodedValueRows) {
      const int64_t block = std::min(kCodedValueRows, rows - r0);
      for (int64_t r = 0; r < block; ++r) {
        code_row(p + (r0 + r) * ld + j0, values + j0, value_scales + j0, m, acc + (r0 + r) * dv, dv,
                 codes + r * kCodedValueStride, scales + r);
      }
      for (int64_t b0 = 0; b0 < block; b0 += kProductRows) {
        up_to<kProductRows>(block - b0, [&](auto block_rows) {
          values_coded_block<block_rows()>(codes + b0 * kCodedValueStride, scales + b0, values + j0,
                                           m, acc + (r0 + b0) * dv, dv, ahead);
        });
      }
    }
  }
  if (ahead != nullptr) ahead->rest();
}

// Float and bfloat16 rows carry no scales. A bfloat16 row is widened once for a block of up to
// four query rows (a float row is an operand of the multiply-adds as it is).
template <typename In>
void plain_scores(const float* q, int64_t rows, int64_t d, const In* const* keys, int64_t cols,
                  float* s, int64_t ld) {
  if constexpr (std::is_same_v<In, float>) {
    scores<In>(q, rows, d, keys, nullptr, cols, s, ld);
  } else {
    scores_rows<In>(q, rows, d, keys, nullptr, cols, s, ld);
  }
}
template <typename In>
void plain_values(const float* p, int64_t ld, int64_t rows, const In* const* v, int64_t cols,
                  float* acc, int64_t dv) {
  if (std::is_same_v<In, float> || rows == 1) {
    values<In>(p, ld, rows, v, nullptr, cols, acc, dv);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    up_to<4>(rows - r0, [&](auto block) {
      values_rows<block(), In>(p + r0 * ld, ld, cols, v, acc + r0 * dv, dv);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace attention
HWY_AFTER_NAMESPACE();
#endif

#if HWY_ONCE

#include "platform/cpu_features.h"

namespace attention {
namespace kernels {
namespace cpu {

std::vector<const DecodeProducts*> supported_decode_products() {
  std::vector<const DecodeProducts*> supported;
  const int64_t runs = hwy::SupportedTargets();
  // A set compiled for TARGET (in Highway's namespace of it), where this processor runs it.
#define ATTENTION_PRODUCTS_ROUTE(TARGET, NAMESPACE, NAME)                       \
  if ((runs & (TARGET)) != 0) {                                                 \
    static constexpr DecodeProducts products{NAME,                              \
                                             NAMESPACE::kLanes,                 \
                                             NAMESPACE::plain_scores<float>,    \
                                             NAMESPACE::plain_scores<uint16_t>, \
                                             NAMESPACE::plain_values<float>,    \
                                             NAMESPACE::plain_values<uint16_t>, \
                                             NAMESPACE::scores_i8,              \
                                             NAMESPACE::values_i8,              \
                                             NAMESPACE::scores_coded,           \
                                             NAMESPACE::scores_coded_columns,   \
                                             NAMESPACE::values_coded};          \
    supported.push_back(&products);                                             \
  }
  // Best first.
#if HWY_TARGETS & HWY_AVX3_DL
  ATTENTION_PRODUCTS_ROUTE(HWY_AVX3_DL, N_AVX3_DL, "avx512_vnni")
#endif
#if HWY_TARGETS & HWY_AVX3
  ATTENTION_PRODUCTS_ROUTE(HWY_AVX3, N_AVX3, "avx512")
#endif
#if HWY_TARGETS & HWY_AVX2
  ATTENTION_PRODUCTS_ROUTE(HWY_AVX2, N_AVX2, "avx2")
#endif
#if HWY_TARGETS & HWY_SSE4
  ATTENTION_PRODUCTS_ROUTE(HWY_SSE4, N_SSE4, "sse4")
#endif
#if HWY_TARGETS & HWY_NEON
  ATTENTION_PRODUCTS_ROUTE(HWY_NEON, N_NEON, "neon")
#endif
#undef ATTENTION_PRODUCTS_ROUTE
  return supported;
}

void pack_code_pairs(const int16_t* codes, int64_t rows, int64_t d, int32_t* pairs) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < d / 2; ++p) {
      const auto low = static_cast<uint16_t>(codes[r * d + 2 * p]);
      const auto high = static_cast<uint16_t>(codes[r * d + 2 * p + 1]);
      pairs[p * rows + r] = static_cast<int32_t>(static_cast<uint32_t>(high) << 16 | low);
    }
  }
}

bool int8_products_enabled() {
  static const bool enabled = [] {
    const char* route = std::getenv("ATTENTION_CPU_INT8");
    return route == nullptr || std::strcmp(route, "widened") != 0;
  }();
  return enabled;
}

const DecodeProducts* decode_products() {
  static const DecodeProducts* const chosen = chosen_vector_set(supported_decode_products());
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention

#endif  // HWY_ONCE
