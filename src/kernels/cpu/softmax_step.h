#pragma once

// The online-softmax step that the fused CPU forward (kernels/cpu/forward.cpp) and the paged
// forward (kernels/cpu/paged.cpp) take on each tile of scores: on the processor's vector
// instructions where kernels/cpu/softmax.h has passes for it, else in loops the compiler
// vectorizes.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// One tile's step: rows x cols scaled scores in `s` (row stride ld), of which row r sees its
/// first valid + r columns when causal (all of them otherwise), become probabilities relative to
/// each row's new running maximum `max`; they are added to the running sum `sum` (NaN once a
/// score was NaN or +inf), and the row's accumulated values `acc` (rows x dv, row stride acc_ld)
/// are rescaled to the new maximum. Columns a row does not see become 0; a row that has seen no
/// key but masked ones keeps its state and gets zeros.
void online_softmax_step(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                         int64_t valid, float* max, float* sum, float* acc, int64_t dv,
                         int64_t acc_ld);
void online_softmax_step(double* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                         int64_t valid, double* max, double* sum, double* acc, int64_t dv,
                         int64_t acc_ld);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
