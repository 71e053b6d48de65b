#pragma once

// bfloat16 to float and back over runs of memory, for the widened route (kernels/cpu/tile.h's
// converted()): the fused kernels widen a bfloat16 call's inputs and round its results once, and
// LibTorch's copy_ does it at about a third of the memory's rate on these machines (8 ms for 6.3
// million elements, two threads), which made the widened forward+backward slower than float32's.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// out[i] = in[i] widened (exact: a bfloat16 is a float's upper half), for i < n, across
/// LibTorch's threads.
void widen_bf16(const uint16_t* in, float* out, int64_t n);

/// The same for `rows` rows of n elements (row strides ld_in and ld_out) on the calling thread
/// alone: what the fused kernels widen a tile's rows with, from inside their own parallel work,
/// where a parallel_for per row of a few dozen elements costs more than the row's conversion.
void widen_bf16_rows(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t n, float* out,
                     int64_t ld_out);

/// out[i] = in[i] rounded to bfloat16 to nearest even, NaN to a quiet NaN (0x7FC0), as
/// c10::BFloat16 rounds, for i < n.
void round_to_bf16(const float* in, uint16_t* out, int64_t n);

/// round_to_bf16() for `rows` rows of n elements (row strides ld_in and ld_out), on the calling
/// thread alone (see widen_bf16_rows()).
void round_to_bf16_rows(const float* in, int64_t ld_in, int64_t rows, int64_t n, uint16_t* out,
                        int64_t ld_out);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
