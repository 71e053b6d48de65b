// Query rows as 16-bit codes (kernels/cpu/query_codes.h).

#include "kernels/cpu/query_codes.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attention {
namespace kernels {
namespace cpu {

int64_t query_code_limit(int64_t d) {
  // 128: a caller's own 8-bit pages may hold -128, which the cache's quantizer never writes.
  const int64_t most = std::numeric_limits<int32_t>::max() / 128 / std::max<int64_t>(d, 1);
  return std::clamp<int64_t>(most, 1, std::numeric_limits<int16_t>::max());
}

bool code_query_row(const float* q, int64_t d, int16_t* codes, float* scale) {
  float largest = 0;
  for (int64_t c = 0; c < d; ++c) {
    if (!std::isfinite(q[c])) return false;
    largest = std::max(largest, std::fabs(q[c]));
  }
  const auto limit = static_cast<float>(query_code_limit(d));
  if (largest == 0) {
    std::fill(codes, codes + d, int16_t{0});
    *scale = 0;
    return true;
  }
  const float s = largest / limit;
  if (s == 0) return false;  // a row of subnormals too small to code
  // Divided by the scale as it is stored, in double: a float quotient near 32767 is off by up to
  // 1/500 of a code, enough to round a near-tie the wrong way; this one by 1e-11.
  const double step = s;
  for (int64_t c = 0; c < d; ++c) {
    const double code = std::clamp(std::nearbyint(q[c] / step), -double{limit}, double{limit});
    codes[c] = static_cast<int16_t>(code);
  }
  *scale = s;
  return true;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
