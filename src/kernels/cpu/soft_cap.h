#pragma once

// Soft-capping of a tile of scores, apart from tile.h (and its vectorization pragmas) so that a
// test can reach it with nothing else.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// Soft-capping on a tile of scores `s` (row stride ld): cap * tanh(s / cap), with the slopes
/// 1 - tanh^2 written to `slope` (row stride cols) when given. Built per instruction set, with a
/// tanh the compiler vectorizes (float; within a few ulp of std::tanh); double calls std::tanh.
void soft_cap(float* s, int64_t ld, int64_t rows, int64_t cols, float cap, float* slope);
void soft_cap(double* s, int64_t ld, int64_t rows, int64_t cols, double cap, double* slope);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
