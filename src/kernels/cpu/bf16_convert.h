#pragma once

// bfloat16 to float and back over runs of memory, for the widened route (kernels/cpu/tile.h's
// converted()): the fused kernels widen a bfloat16 call's inputs and round its results once, and
// LibTorch's copy_ does it at about a third of the memory's rate on these machines (8 ms for 6.3
// million elements, two threads), which made the widened forward+backward slower than float32's.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// out[i] = in[i] widened (exact: a bfloat16 is a float's upper half), for i < n.
void widen_bf16(const uint16_t* in, float* out, int64_t n);

/// out[i] = in[i] rounded to bfloat16 to nearest even, NaN to a quiet NaN (0x7FC0), as
/// c10::BFloat16 rounds, for i < n.
void round_to_bf16(const float* in, uint16_t* out, int64_t n);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
