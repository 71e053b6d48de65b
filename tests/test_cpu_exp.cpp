// The fused kernels' vectorized exponential against std::exp: within 2 ulp over the whole range
// it serves (x <= 0), 0 below -87 and for NaN and -inf, 1 at 0.

#include "kernels/cpu_tile.h"

#include "catch_compat.h"

#include <cmath>
#include <limits>
#include <vector>

namespace cpu = attention::kernels::cpu;

TEST_CASE("cpu::exp_nonpositive is within 2 ulp of std::exp down to -87, and 0 below",
          "[chunked]") {
  double worst_ulps = 0;
  int checked = 0;
  for (float x = 0.0f; x >= -87.0f; x -= 0.00731f) {
    const float got = cpu::exp_nonpositive(x);
    const double truth = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(truth), 1.0f) - static_cast<float>(truth);
    worst_ulps = std::max(worst_ulps, std::abs(got - truth) / ulp);
    ++checked;
  }
  INFO(checked << " points, worst " << worst_ulps << " ulp");
  CHECK(worst_ulps <= 2.0);
  CHECK(cpu::exp_nonpositive(0.0f) == 1.0f);
  CHECK(cpu::exp_nonpositive(-87.0f) > 0.0f);
  for (const float below :
       {-87.01f, -88.0f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    INFO("x = " << below);
    CHECK(cpu::exp_nonpositive(below) == 0.0f);
  }
}

TEST_CASE("cpu::exp_nonpositive gives the same values in a vectorized loop", "[chunked]") {
  // The kernels call it from loops the compiler vectorizes: the lanes must agree with the
  // scalar calls (the select at the end, not a second path per lane).
  std::vector<float> x(4099), scalar(x.size()), vector(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = -0.0213f * static_cast<float>(i);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  x[18] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < x.size(); ++i) scalar[i] = cpu::exp_nonpositive(x[i]);
  const float* in = x.data();
  float* out = vector.data();
  const int64_t n = static_cast<int64_t>(x.size());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = cpu::exp_nonpositive(in[i]);
  CHECK(vector == scalar);
}
