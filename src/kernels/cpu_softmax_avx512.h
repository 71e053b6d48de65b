#pragma once

// The fused CPU kernels' exponentials on AVX-512, written with its intrinsics: the forward's
// online-softmax step and the backward's probabilities, for float (and so for bfloat16, which
// the kernels widen to float). The portable loops beside the kernels (chunked_cpu.cpp,
// chunked_cpu_backward.cpp) vectorize through the compiler, which computes their exp with every
// operation under a mask, sums a row's lanes one after the other, and keeps one accumulator in
// the row's maximum; these passes take about half as many operations per score, and are chosen
// at run time where the processor has AVX-512.

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_HAS_AVX512_SOFTMAX 1
#else
#define ATTENTION_HAS_AVX512_SOFTMAX 0
#endif

namespace attention {
namespace kernels {
namespace cpu {

/// Whether the kernels take the passes below in this process: the processor has AVX-512F and
/// ATTENTION_CPU_VECTOR is not set to "portable" (which keeps the compiler-vectorized loops,
/// the route of every other processor). Decided once.
bool avx512_softmax_enabled();

#if ATTENTION_HAS_AVX512_SOFTMAX

/// The forward's online-softmax step of one tile (the contract of chunked_cpu.cpp's
/// softmax_step): rows x cols scaled scores in `s` (row stride ld), of which row r sees its
/// first valid + r columns when causal (all of them otherwise), become probabilities relative
/// to each row's new running maximum `max`; they are added to the running sum `sum` (NaN once a
/// score was NaN or +inf), and the row's accumulated values `acc` (rows x dv, row stride acc_ld)
/// are rescaled to the new maximum. Columns a row does not see become 0. Only where
/// avx512_softmax_enabled().
void softmax_step_avx512(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                         int64_t valid, float* max, float* sum, float* acc, int64_t dv,
                         int64_t acc_ld);

/// The backward's probabilities of one tile (the contract of chunked_cpu_backward.cpp's
/// probabilities): `prob` (rows x cols, contiguous) = exp(s - lse) row by row over the columns
/// a row sees, 0 where a score is -inf, NaN where it is NaN; the columns a row does not see get
/// -inf in `s` and 0 in `prob`. Only where avx512_softmax_enabled().
void probabilities_avx512(float* s, float* prob, int64_t rows, int64_t cols, bool causal,
                          int64_t valid, const float* lse);

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
