#pragma once

// The fused CPU kernels' exponential passes in vector code: the forward's online-softmax step and
// the backward's probabilities, for float (and so for bfloat16, which the kernels widen to float).
// The portable loops beside the kernels (kernels/cpu/forward.cpp, kernels/cpu/backward.cpp)
// vectorize through the compiler, which computes their exp with every operation under a mask,
// sums a row's lanes one after the other, and keeps one accumulator in the row's maximum; these
// passes take about half as many operations per score. One source (kernels/cpu/softmax.cpp,
// through Google Highway) over the row loops of kernels/cpu/softmax_rows.h, compiled for AVX-512F
// and AVX2 with FMA on x86-64 and for NEON, SVE and SVE2 on aarch64, chosen at run time.

#include <cstdint>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

/// One instruction set's two passes.
struct SoftmaxPasses {
  /// The route's name, as ATTENTION_CPU_VECTOR names it: "avx512", "avx2", "sve2", "sve" or
  /// "neon".
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

/// The passes the kernels take in this process, decided once: the best route this processor runs
/// (the first of supported_softmax_passes()); nullptr (the compiler-vectorized loops) where it
/// runs none. ATTENTION_CPU_VECTOR=portable keeps the loops; ATTENTION_CPU_VECTOR=NAME takes the
/// route of that name where the processor runs it (avx2 on an AVX-512 processor, neon on an SVE
/// one), to compare the routes on one machine.
const SoftmaxPasses* softmax_passes();

/// Every route compiled into the library that this processor runs, best first, whatever
/// softmax_passes() took (for tests and benchmarks).
std::vector<const SoftmaxPasses*> supported_softmax_passes();

/// The route named `name` where this processor runs it, else nullptr.
const SoftmaxPasses* softmax_passes_named(const char* name);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
