#pragma once

// The exponential of the fused CPU kernels' softmax, apart from LibTorch so that the
// instruction-set files of the exponential passes (kernels/cpu/softmax_*.cpp) compile without it.

#include "platform/compiler.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace attention {
namespace kernels {
namespace cpu {

// exp(x) for x <= 0 (NaN gives 0: callers check for NaN themselves), written with nothing but
// arithmetic and one select so that every compiler vectorizes the loops calling it: Cephes'
// single-precision polynomial after a reduction by ln 2 (within 2 ulp of std::exp). x below -87
// (results near 2^-126 and below) gives 0, decided once at the end: clamping the reduced
// exponent as well made GCC compute the polynomial twice, once per side of the clamp. Small
// positive x (rounding above a maximum) are fine.
ATTENTION_ALWAYS_INLINE float exp_nonpositive(float x) {
  const bool tiny = !(x >= -87.0f);  // NaN included
  const float xc = tiny ? -87.0f : x;
  const float round = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504089f + round) - round;  // >= -126: 2^n is a normal number
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float y = poly * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (int32_t{1} << 23);
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const float e = y * two_n;
  return tiny ? 0.0f : e;
}

ATTENTION_ALWAYS_INLINE double exp_nonpositive(double x) {
  return std::exp(x);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
