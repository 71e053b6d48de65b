#pragma once

// The fused CPU kernels' exponential passes written with a vector instruction set's intrinsics:
// the forward's online-softmax step and the backward's probabilities, for float (and so for
// bfloat16, which the kernels widen to float). The portable loops beside the kernels
// (kernels/cpu/forward.cpp, kernels/cpu/backward.cpp) vectorize through the compiler, which
// computes their exp with every operation under a mask, sums a row's lanes one after the other, and
// keeps one accumulator in the row's maximum; these passes take about half as many operations per
// score. One set per instruction set (AVX-512F: kernels/cpu/softmax_avx512.cpp; AVX2 with FMA:
// kernels/cpu/softmax_avx2.cpp) over the same row loops (kernels/cpu/softmax_rows.h), chosen at run
// time.

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_HAS_SIMD_SOFTMAX 1
#else
#define ATTENTION_HAS_SIMD_SOFTMAX 0
#endif

namespace attention {
namespace kernels {
namespace cpu {

/// One instruction set's two passes.
struct SoftmaxPasses {
  /// "avx512" or "avx2".
  const char* name;

  /// The forward's online-softmax step of one tile (the contract of kernels/cpu/forward.cpp's
  /// softmax_step): rows x cols scaled scores in `s` (row stride ld), of which row r sees its
  /// first valid + r columns when causal (all of them otherwise), become probabilities relative
  /// to each row's new running maximum `max`; they are added to the running sum `sum` (NaN once
  /// a score was NaN or +inf), and the row's accumulated values `acc` (rows x dv, row stride
  /// acc_ld) are rescaled to the new maximum. Columns a row does not see become 0.
  void (*softmax_step)(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal, int64_t valid,
                       float* max, float* sum, float* acc, int64_t dv, int64_t acc_ld);

  /// The backward's probabilities of one tile (the contract of kernels/cpu/backward.cpp's
  /// probabilities): `prob` (rows x cols, contiguous) = exp(s - lse) row by row over the columns
  /// a row sees, 0 where a score is -inf, NaN where it is NaN; the columns a row does not see get
  /// -inf in `s` and 0 in `prob`.
  void (*probabilities)(float* s, float* prob, int64_t rows, int64_t cols, bool causal,
                        int64_t valid, const float* lse);
};

/// The passes the kernels take in this process, decided once: AVX-512's where the processor has
/// AVX-512F, else AVX2's where it has AVX2 and FMA; nullptr (the compiler-vectorized loops, the
/// route of every other processor) elsewhere. ATTENTION_CPU_VECTOR=portable keeps the loops,
/// ATTENTION_CPU_VECTOR=avx2 takes AVX2's passes on an AVX-512 processor too.
const SoftmaxPasses* softmax_passes();

/// Each instruction set's passes where this processor runs them, else nullptr, whatever
/// softmax_passes() took (for tests and benchmarks).
const SoftmaxPasses* avx512_softmax_passes();
const SoftmaxPasses* avx2_softmax_passes();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
