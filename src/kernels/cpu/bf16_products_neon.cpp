// The bfloat16 products on 64-bit ARM's BF16 extension (kernels/cpu/bf16_products.h; Neoverse V1
// and N2 on, Apple M2 on): BFDOT adds, in each float lane, the two products of a pair of bfloat16
// values, as AVX512_BF16's vdpbf16ps does (kernels/cpu/bf16_products_avx512.cpp has the same blocks
// on 16 lanes). C is computed in blocks of up to 4 rows by 16 columns, held in 16 registers while
// the contracted dimension goes by in pairs: each step loads a pair row of B's block (4 registers)
// and multiplies it by one pair of each row of A, taken from a register by lane. A row's last,
// partial vector goes through a copy on the stack (NEON has no masked loads or stores); an odd k
// ends with a step whose pair has its high half cleared in both operands, so nothing beyond the
// k-th value is read or counted. Not written with Highway: its 1.0 has no BF16 target (1.2 has).

#include "kernels/cpu/bf16_panels.h"
#include "kernels/cpu/bf16_products.h"
#include "platform/compiler.h"

#include <algorithm>
#include <cstring>

#if defined(__aarch64__) && defined(__GNUC__) && defined(__linux__)
#define ATTENTION_HAS_NEON_BF16_CODE 1
#include <arm_neon.h>
#include <sys/auxv.h>
#else
#define ATTENTION_HAS_NEON_BF16_CODE 0
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_NEON_BF16_CODE

namespace {

#define ATTENTION_UNROLL _Pragma("GCC unroll 16")
#define ATTENTION_BF16 __attribute__((target("arch=armv8.2-a+bf16")))

// The first `count` (1 to 4) 32-bit words at p, the others 0.
ATTENTION_ALWAYS_INLINE uint32x4_t load_words(const uint32_t* p, int64_t count) {
  if (count == 4) return vld1q_u32(p);
  uint32_t part[4] = {0, 0, 0, 0};
  std::memcpy(part, p, static_cast<size_t>(count) * sizeof(uint32_t));
  return vld1q_u32(part);
}

ATTENTION_ALWAYS_INLINE float32x4_t load_floats(const float* p, int64_t count) {
  if (count == 4) return vld1q_f32(p);
  float part[4] = {0, 0, 0, 0};
  std::memcpy(part, p, static_cast<size_t>(count) * sizeof(float));
  return vld1q_f32(part);
}

ATTENTION_ALWAYS_INLINE void store_floats(float* p, float32x4_t v, int64_t count) {
  if (count == 4) return vst1q_f32(p, v);
  float part[4];
  vst1q_f32(part, v);
  std::memcpy(p, part, static_cast<size_t>(count) * sizeof(float));
}

ATTENTION_BF16 ATTENTION_ALWAYS_INLINE float32x4_t dot_pairs(float32x4_t acc, uint32x4_t a,
                                                             uint32x4_t b) {
  return vbfdotq_f32(acc, vreinterpretq_bf16_u32(a), vreinterpretq_bf16_u32(b));
}

// One block of C: `Rows` rows from c, `Vectors` vectors of 4 columns, the last with `tail` (1 to
// 4).
template <int Rows, int Vectors>
struct Block {
  ATTENTION_BF16 static void run(int64_t k, float alpha, const uint16_t* a, int64_t lda,
                                 const uint32_t* b, int64_t ldb, bool accumulate, float* c,
                                 int64_t ldc, int64_t tail) {
    float32x4_t acc[Rows][Vectors];
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) {
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    }
    const auto count_of = [tail](int v) -> int64_t { return v == Vectors - 1 ? tail : 4; };
    const int64_t pairs = k / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      uint32x4_t pair_row[Vectors];
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) pair_row[v] = load_words(b + p * ldb + 4 * v, count_of(v));
      ATTENTION_UNROLL
      for (int r = 0; r < Rows; ++r) {
        uint32_t word;
        std::memcpy(&word, a + r * lda + 2 * p, sizeof word);
        const uint32x4_t pair = vdupq_n_u32(word);
        ATTENTION_UNROLL
        for (int v = 0; v < Vectors; ++v) acc[r][v] = dot_pairs(acc[r][v], pair, pair_row[v]);
      }
    }
    if (k % 2 != 0) {  // the last value alone: both high halves cleared
      const uint32x4_t low_half = vdupq_n_u32(0xFFFF);
      uint32x4_t pair_row[Vectors];
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) {
        pair_row[v] = vandq_u32(low_half, load_words(b + pairs * ldb + 4 * v, count_of(v)));
      }
      ATTENTION_UNROLL
      for (int r = 0; r < Rows; ++r) {
        const uint32x4_t last = vdupq_n_u32(a[r * lda + k - 1]);
        ATTENTION_UNROLL
        for (int v = 0; v < Vectors; ++v) acc[r][v] = dot_pairs(acc[r][v], last, pair_row[v]);
      }
    }
    ATTENTION_UNROLL
    for (int r = 0; r < Rows; ++r) {
      ATTENTION_UNROLL
      for (int v = 0; v < Vectors; ++v) {
        float* out = c + r * ldc + 4 * v;
        float32x4_t result = vmulq_n_f32(acc[r][v], alpha);
        if (accumulate) result = vaddq_f32(result, load_floats(out, count_of(v)));
        store_floats(out, result, count_of(v));
      }
    }
  }
};

void product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
             const uint32_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  bf16_product_in_panels<Block, 4>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc,
                                   [](int64_t count) { return count; });
}

// Four floats rounded to bfloat16 (BFCVTN: to nearest even, NaN stays NaN), widened into the low
// halves of four 32-bit words.
ATTENTION_BF16 ATTENTION_ALWAYS_INLINE uint32x4_t rounded_words(const float* in, int64_t count) {
  const bfloat16x4_t rounded = vcvt_bf16_f32(load_floats(in, count));
  return vmovl_u16(vreinterpret_u16_bf16(rounded));
}

ATTENTION_BF16 void round(const float* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                          int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* from = in + r * ld_in;
    uint16_t* to = out + r * ld_out;
    for (int64_t c = 0; c < cols; c += 4) {
      const int64_t rest = std::min<int64_t>(4, cols - c);
      const uint16x4_t rounded = vreinterpret_u16_bf16(vcvt_bf16_f32(load_floats(from + c, rest)));
      uint16_t part[4];
      vst1_u16(part, rounded);
      std::memcpy(to + c, part, static_cast<size_t>(rest) * sizeof(uint16_t));
    }
  }
}

ATTENTION_BF16 void round_row_pairs(const float* in, int64_t ld_in, int64_t rows, int64_t cols,
                                    uint32_t* out, int64_t ld_out) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* low = in + 2 * p * ld_in;
    const bool alone = 2 * p + 1 == rows;
    uint32_t* to = out + p * ld_out;
    for (int64_t c = 0; c < cols; c += 4) {
      const int64_t rest = std::min<int64_t>(4, cols - c);
      uint32x4_t words = rounded_words(low + c, rest);
      if (!alone) words = vorrq_u32(words, vshlq_n_u32(rounded_words(low + ld_in + c, rest), 16));
      uint32_t part[4];
      vst1q_u32(part, words);
      std::memcpy(to + c, part, static_cast<size_t>(rest) * sizeof(uint32_t));
    }
  }
}

#undef ATTENTION_BF16
#undef ATTENTION_UNROLL

void round_both(const float* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ld_out, uint32_t* pairs, int64_t ld_pairs) {
  round(in, ld_in, rows, cols, out, ld_out);
  round_row_pairs(in, ld_in, rows, cols, pairs, ld_pairs);
}

// The packing and the transposition are the plain loops' (bf16_products.cpp).
constexpr Bf16Products kNeonBf16Products{
    "neon_bf16", product, round, round_row_pairs, round_both, pack_column_pairs, transpose_16};

// Linux's hardware capabilities (asm/hwcap.h: HWCAP2_BF16).
bool processor_has_neon_bf16() {
  return (getauxval(AT_HWCAP2) & (1ul << 14)) != 0;
}

}  // namespace

const Bf16Products* neon_bf16_products() {
  return processor_has_neon_bf16() ? &kNeonBf16Products : nullptr;
}

#else

const Bf16Products* neon_bf16_products() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
