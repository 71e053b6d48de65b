// One core's multiply rates on x86's 256-bit vectors: what bounds the decoding step's products
// on a processor without AVX-512 (docs/PERFORMANCE.md). Each loop is inline assembly with eight
// independent accumulators in registers (eight chains hide a 4-cycle latency at 2 instructions a
// cycle). Written in C++ the compiler is free to keep the sums on the stack, and the loop then
// measures store-to-load forwarding instead: a program of intrinsics did, and gave half of
// vpmaddwd's rate.

#include "multiply_rates.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTENTION_BENCH_AVX2 __attribute__((target("avx2,fma"), noinline))
#endif

namespace attention_bench {

#ifdef ATTENTION_BENCH_AVX2
namespace {

constexpr int kChains = 8;

// Eight accumulators in ymm0-ymm7; a 32-bit operand word broadcast into ymm8 and ymm9, 16-bit
// ones into ymm10; a product's result in one of ymm11-ymm14 (renaming makes their reuse free), a
// second temporary in ymm15. Each function is one asm statement, so that no register copy or
// spill of the compiler's comes between the instructions timed.
#define ATTENTION_BENCH_EIGHT(step)                                                               \
  step("0", "11") step("1", "12") step("2", "13") step("3", "14") step("4", "11") step("5", "12") \
      step("6", "13") step("7", "14")
#define ATTENTION_BENCH_RATE(name, step)                                                           \
  ATTENTION_BENCH_AVX2 void name(int64_t n, int32_t operand) {                                     \
    const int32_t ones = 0x00010001;                                                               \
    __asm__ volatile(                                                                              \
        "vpbroadcastd %1, %%ymm8\n\tvpbroadcastd %1, %%ymm9\n\tvpbroadcastd %2, %%ymm10\n\t"       \
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\tvmovdqa %%ymm0, %%ymm1\n\tvmovdqa %%ymm0, %%ymm2\n\t"     \
        "vmovdqa %%ymm0, %%ymm3\n\tvmovdqa %%ymm0, %%ymm4\n\tvmovdqa %%ymm0, %%ymm5\n\t"           \
        "vmovdqa %%ymm0, %%ymm6\n\tvmovdqa %%ymm0, %%ymm7\n\t"                                     \
        "1:\n\t" ATTENTION_BENCH_EIGHT(step) "dec %0\n\tjnz 1b\n\t"                                \
        : "+r"(n)                                                                                  \
        : "m"(operand), "m"(ones)                                                                  \
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc");                                      \
  }

// acc += a * b: vfmadd231ps, 8 float products.
#define ATTENTION_BENCH_FLOATS(acc, tmp) "vfmadd231ps %%ymm8, %%ymm9, %%ymm" acc "\n\t"
ATTENTION_BENCH_RATE(float_products, ATTENTION_BENCH_FLOATS)

// acc += vpmaddwd(a, b): 16 products of 16-bit codes, each pair's sum added into a 32-bit lane
// (the decoding step's integer products on AVX2).
#define ATTENTION_BENCH_PAIRS(acc, tmp) \
  "vpmaddwd %%ymm8, %%ymm9, %%ymm" tmp "\n\tvpaddd %%ymm" tmp ", %%ymm" acc ", %%ymm" acc "\n\t"
ATTENTION_BENCH_RATE(pair_products, ATTENTION_BENCH_PAIRS)

// vpmaddwd alone, each result overwriting the last (no sum): the instruction's own rate.
#define ATTENTION_BENCH_PAIRS_ALONE(acc, tmp) "vpmaddwd %%ymm8, %%ymm9, %%ymm" acc "\n\t"
ATTENTION_BENCH_RATE(pair_products_alone, ATTENTION_BENCH_PAIRS_ALONE)

// acc += vpmaddwd(vpmaddubsw(a, b), ones): 32 products of unsigned by signed bytes, summed in
// (saturating) 16-bit pairs, those widened by the products by ones and added into 32-bit lanes.
#define ATTENTION_BENCH_BYTES(acc, tmp)                                                  \
  "vpmaddubsw %%ymm9, %%ymm8, %%ymm" tmp "\n\tvpmaddwd %%ymm10, %%ymm" tmp ", %%ymm" tmp \
  "\n\tvpaddd %%ymm" tmp ", %%ymm" acc ", %%ymm" acc "\n\t"
ATTENTION_BENCH_RATE(byte_products, ATTENTION_BENCH_BYTES)

// The same for signed bytes times signed bytes (the 8-bit cache's codes and 8-bit queries):
// vpabsb makes one side unsigned and vpsignb moves its signs to the other.
#define ATTENTION_BENCH_SIGNED_BYTES(acc, tmp)                                                  \
  "vpabsb %%ymm8, %%ymm" tmp                                                                    \
  "\n\tvpsignb %%ymm8, %%ymm9, %%ymm15\n\t"                                                     \
  "vpmaddubsw %%ymm15, %%ymm" tmp ", %%ymm" tmp "\n\tvpmaddwd %%ymm10, %%ymm" tmp ", %%ymm" tmp \
  "\n\tvpaddd %%ymm" tmp ", %%ymm" acc ", %%ymm" acc "\n\t"
ATTENTION_BENCH_RATE(signed_byte_products, ATTENTION_BENCH_SIGNED_BYTES)

#undef ATTENTION_BENCH_SIGNED_BYTES
#undef ATTENTION_BENCH_BYTES
#undef ATTENTION_BENCH_PAIRS_ALONE
#undef ATTENTION_BENCH_PAIRS
#undef ATTENTION_BENCH_FLOATS
#undef ATTENTION_BENCH_RATE
#undef ATTENTION_BENCH_EIGHT

// Products per second of `run(n, operand)` doing `per_step` products a step: the best of
// `repeats`.
template <typename Run>
double products_per_s(const Run& run, int32_t operand, double per_step, int repeats) {
  constexpr int64_t kSteps = 20'000'000 / kChains;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run(kSteps, operand);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return per_step * static_cast<double>(kSteps * kChains) / best;
}

}  // namespace

std::vector<MultiplyRate> multiply_rates(int repeats) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return {};
  return {
      // The operands: 0.5f; the 16-bit codes 5 and 3; the bytes -3, 5, -5, 3.
      {"vfmadd231ps", "float", products_per_s(float_products, 0x3f000000, 8, repeats)},
      {"vpmaddwd+vpaddd", "16-bit", products_per_s(pair_products, 0x00030005, 16, repeats)},
      {"vpmaddwd (no sum)", "16-bit", products_per_s(pair_products_alone, 0x00030005, 16, repeats)},
      {"vpmaddubsw+vpmaddwd+vpaddd", "8-bit",
       products_per_s(byte_products, 0x03fb05fd, 32, repeats)},
      {"vpabsb+vpsignb+vpmaddubsw+vpmaddwd+vpaddd", "8-bit signed",
       products_per_s(signed_byte_products, 0x03fb05fd, 32, repeats)},
  };
}

#else

std::vector<MultiplyRate> multiply_rates(int) {
  return {};
}

#endif

}  // namespace attention_bench
