// The fused kernels' exponential passes of each route this processor runs (AVX-512F and AVX2 with
// FMA on x86-64, SVE2, SVE and NEON on aarch64: kernels/cpu/softmax.h) against references in double
// written here: the backward's probabilities as a test of the exp itself (within 1.05 ulp of
// std::exp over its whole range, exactly 1 at 0, 0 below -87 and at -inf, NaN for NaN, hidden keys
// 0 in a row whose log-sum-exp is NaN), and the forward's online-softmax step over two tiles
// (ragged rows, causal rows that see none, some or all of their columns, NaN and +inf scores, fully
// masked rows with and without a NaN, the running maximum, sum and rescaled accumulator, and the
// padding past the tile left alone). The kernels' differential tests against Math run on the passes
// softmax_passes() takes; ctest's chunked.avx2_softmax runs them on AVX2's and
// chunked.portable_softmax on the portable loops.

#include "kernels/cpu/soft_cap.h"
#include "kernels/cpu/softmax.h"
#include "platform/cpu_features.h"

#include <torch/torch.h>
#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace cpu = attention::kernels::cpu;

namespace {

constexpr float kInfFloat = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// How far `got` is from the exact exp(x), in units of the last place of the float nearest to it.
double ulps_from_exp(float got, float x) {
  const double exact = std::exp(static_cast<double>(x));
  const float nearest = static_cast<float>(exact);
  const double ulp =
      std::nextafter(nearest, kInfFloat) - static_cast<double>(nearest);  // the spacing above it
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

std::vector<float> random_scores(int64_t count, double spread, uint64_t seed) {
  torch::manual_seed(seed);
  const auto t = (torch::randn({count}, torch::kDouble) * spread).to(torch::kFloat);
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + count);
}

// The passes of every instruction set this processor runs, whichever the kernels took.
std::vector<const cpu::SoftmaxPasses*> runnable_passes() {
  std::vector<const cpu::SoftmaxPasses*> sets = cpu::supported_softmax_passes();
  if (sets.empty()) WARN("skipped: this processor runs none of the vector routes");
  return sets;
}

}  // namespace

TEST_CASE("cpu softmax: the passes' exp is within 1.05 ulp of exp, with its edges", "[chunked]") {
  for (const cpu::SoftmaxPasses* passes : runnable_passes()) {
    INFO(passes->name);
    // One row per range of x, 1003 columns (full vectors and a partial one in 16 lanes and in 8).
    const int64_t rows = 6, cols = 1003;
    std::vector<float> s(rows * cols), prob(rows * cols, -1.0f), lse(rows, 0.0f);
    for (int64_t j = 0; j < cols; ++j) {
      const double u = static_cast<double>(j) / (cols - 1);
      s[0 * cols + j] = static_cast<float>(-87.0 * u);                 // the whole range
      s[1 * cols + j] = static_cast<float>(-1.0 * u);                  // near 1
      s[2 * cols + j] = static_cast<float>(-std::pow(10.0, -12 * u));  // -1 ... -1e-12
      s[3 * cols + j] = static_cast<float>(-86.0 - 1.0 * u);           // the low edge
    }
    // Row 4: the edges; row 5 sees them with a NaN log-sum-exp.
    const std::vector<float> edges = {0.0f,    -0.0f,   -kInfFloat, kNaN,
                                      -87.01f, -100.0f, -1e30f,     -1e-30f};
    for (int64_t r : {4, 5}) {
      std::fill(s.begin() + r * cols, s.begin() + (r + 1) * cols, -0.5f);
      std::copy(edges.begin(), edges.end(), s.begin() + r * cols);
    }
    lse[5] = kNaN;
    const std::vector<float> scores = s;
    passes->probabilities(s.data(), prob.data(), rows, cols, false, 0, lse.data());

    double worst = 0;
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        worst = std::max(worst, ulps_from_exp(prob[r * cols + j], scores[r * cols + j]));
      }
    }
    INFO("largest error: " << worst << " ulp");
    CHECK(worst <= 1.05);
    const float* e = prob.data() + 4 * cols;
    CHECK(e[0] == 1.0f);
    CHECK(e[1] == 1.0f);
    CHECK(e[2] == 0.0f);
    CHECK(std::isnan(e[3]));
    CHECK(e[4] == 0.0f);
    CHECK(e[5] == 0.0f);
    CHECK(e[6] == 0.0f);
    CHECK(e[7] == 1.0f);
    const float* n = prob.data() + 5 * cols;
    CHECK(n[2] == 0.0f);  // a hidden key stays 0 where the row is NaN
    CHECK(std::isnan(n[0]));
    CHECK(std::isnan(n[cols - 1]));
    // A row that sees every column leaves its scores as they were (bits: NaN is among them).
    CHECK(std::memcmp(s.data(), scores.data(), s.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("cpu softmax: the probabilities mark what causal rows do not see", "[chunked]") {
  for (const cpu::SoftmaxPasses* passes : runnable_passes()) {
    INFO(passes->name);
    const int64_t rows = 40, cols = 83, valid = -3;  // rows 0-3 see nothing, rows 37+ see all
    std::vector<float> s = random_scores(rows * cols, 2.0, 1), prob(rows * cols, -1.0f);
    std::vector<float> lse = random_scores(rows, 1.0, 2);
    for (float& x : lse) x = std::abs(x) + 3.0f;
    const std::vector<float> scores = s;
    passes->probabilities(s.data(), prob.data(), rows, cols, true, valid, lse.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t seen = std::clamp<int64_t>(valid + r, 0, cols);
      for (int64_t j = 0; j < cols; ++j) {
        const float got = prob[r * cols + j];
        if (j < seen) {
          const float x = scores[r * cols + j] - lse[r];
          CHECK(ulps_from_exp(got, x) <= 1.05);
          CHECK(s[r * cols + j] == scores[r * cols + j]);
        } else {
          CHECK(got == 0.0f);
          CHECK(s[r * cols + j] == -kInfFloat);
        }
      }
    }
  }
}

TEST_CASE("cpu softmax: the online-softmax step equals the step in double", "[chunked]") {
  const bool causal = GENERATE(false, true);
  for (const cpu::SoftmaxPasses* passes : runnable_passes()) {
    INFO(passes->name);
    const int64_t rows = 40, cols = 83, ld = 96, dv = 20, acc_ld = 24;
    const int64_t valid = causal ? -3 : 0;
    std::vector<float> max(rows, -kInfFloat), sum(rows, 0.0f);
    std::vector<float> acc = random_scores(rows * acc_ld, 1.0, 3);
    for (int tile = 0; tile < 2; ++tile) {
      // Scores in a padded tile (the padding is NaN and must stay so); the second tile's larger
      // spread moves most rows' maximum.
      std::vector<float> s(rows * ld, kNaN);
      const std::vector<float> values =
          random_scores(rows * cols, tile == 0 ? 2.0 : 4.0, 10 + tile);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(values.begin() + r * cols, cols, s.begin() + r * ld);
      }
      s[10 * ld + 7] = kNaN;                               // row 10: NaN, sum NaN
      s[11 * ld + 50] = kInfFloat;                         // row 11: +inf, sum NaN
      std::fill_n(s.begin() + 12 * ld, cols, -kInfFloat);  // row 12: masked in both tiles
      if (tile == 0)
        std::fill_n(s.begin() + 13 * ld, cols, -kInfFloat);  // row 13: in the first only
      std::fill_n(s.begin() + 14 * ld, cols, -kInfFloat);  // row 14: masked but for a NaN, sum NaN
      s[14 * ld] = kNaN;
      const std::vector<float> scores = s, max_before = max, sum_before = sum, acc_before = acc;

      passes->softmax_step(s.data(), rows, cols, ld, causal, valid, max.data(), sum.data(),
                           acc.data(), dv, acc_ld);

      for (int64_t r = 0; r < rows; ++r) {
        INFO("tile " << tile << ", row " << r << (causal ? ", causal" : ""));
        const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
        const float* in = scores.data() + r * ld;
        bool nan = false;
        float row_max = -kInfFloat;
        for (int64_t j = 0; j < seen; ++j) {
          nan |= std::isnan(in[j]);
          if (!std::isnan(in[j])) row_max = std::max(row_max, in[j]);
        }
        const float new_max = std::max(row_max, max_before[r]);
        for (int64_t j = cols; j < ld; ++j) CHECK(std::isnan(s[r * ld + j]));
        if (new_max == -kInfFloat) {
          for (int64_t j = 0; j < cols; ++j) CHECK(s[r * ld + j] == 0.0f);
          CHECK(max[r] == -kInfFloat);
          if (nan) CHECK(std::isnan(sum[r]));
          if (!nan) CHECK(sum[r] == sum_before[r]);
          for (int64_t c = 0; c < dv; ++c) CHECK(acc[r * acc_ld + c] == acc_before[r * acc_ld + c]);
          continue;
        }
        double added = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const float got = s[r * ld + j];
          if (j >= seen) {
            CHECK(got == 0.0f);
          } else if (std::isnan(in[j]) || (in[j] == kInfFloat && new_max == kInfFloat)) {
            CHECK(std::isnan(got));
          } else {
            const float x = in[j] - new_max;  // rounded to float, as the kernel does
            CHECK(ulps_from_exp(got, x) <= 1.05);
            added += std::exp(static_cast<double>(x));
          }
        }
        CHECK(max[r] == new_max);
        // exp(inf - inf) after a +inf score: 0 by the kernels' scalar exp (NaN gives 0), and the
        // row's sum is NaN already.
        const double shift = static_cast<double>(max_before[r]) - new_max;
        const double correction = std::isnan(shift) ? 0.0 : std::exp(shift);
        if (nan || row_max == kInfFloat || std::isnan(sum_before[r])) {
          CHECK(std::isnan(sum[r]));
        } else {
          const double expected = sum_before[r] * correction + added;
          CHECK(std::abs(sum[r] - expected) <= 1e-6 * expected);
        }
        for (int64_t c = 0; c < dv; ++c) {
          const double expected = acc_before[r * acc_ld + c] * correction;
          CHECK(std::abs(acc[r * acc_ld + c] - expected) <= 1e-6 * std::abs(expected) + 1e-30);
        }
        for (int64_t c = dv; c < acc_ld; ++c) {
          CHECK(acc[r * acc_ld + c] == acc_before[r * acc_ld + c]);  // past the row: untouched
        }
      }
    }
  }
}

TEST_CASE("cpu softmax: the route follows the processor and ATTENTION_CPU_VECTOR", "[chunked]") {
  const char* forced = std::getenv("ATTENTION_CPU_VECTOR");
  const std::string asked = forced != nullptr ? forced : "";
  const std::vector<const cpu::SoftmaxPasses*> supported = cpu::supported_softmax_passes();
  std::vector<std::string> names;
  for (const cpu::SoftmaxPasses* p : supported) names.emplace_back(p->name);
    // The routes the processor runs, by what it says of itself.
#if defined(__x86_64__)
  std::vector<std::string> expected_names;
  if (cpu::processor_has_avx512f()) expected_names.emplace_back("avx512");
  if (cpu::processor_has_avx2_fma()) expected_names.emplace_back("avx2");
  CHECK(names == expected_names);
#elif defined(__aarch64__)
  // Linux's hardware capabilities (asm/hwcap.h: HWCAP_SVE, HWCAP2_SVE2).
  std::vector<std::string> expected_names;
  if ((getauxval(AT_HWCAP2) & (1ul << 1)) != 0) expected_names.emplace_back("sve2");
  if ((getauxval(AT_HWCAP) & (1ul << 22)) != 0) expected_names.emplace_back("sve");
  expected_names.emplace_back("neon");  // every aarch64 processor has NEON
  CHECK(names == expected_names);
#endif
  const cpu::SoftmaxPasses* expected = supported.empty() ? nullptr : supported.front();
  for (const cpu::SoftmaxPasses* p : supported) {
    if (asked == p->name) expected = p;
    CHECK(cpu::softmax_passes_named(p->name) == p);
  }
  if (asked == "portable") expected = nullptr;
  CHECK(cpu::softmax_passes() == expected);
  CHECK(cpu::softmax_passes_named("portable") == nullptr);
  CHECK(cpu::softmax_passes_named("") == nullptr);
}

TEST_CASE("cpu soft-capping: tanh within 3 ulp of tanh in double, with its edges and slopes",
          "[chunked]") {
  std::vector<float> x;
  for (float v = -30.0f; v <= 30.0f; v += 0.00731f) x.push_back(v);
  for (const float v :
       {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, 1e-4f, 0.624999f, 0.625f, 0.625001f, 9.0f, 44.0f,
        1e30f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(v);
  }
  const auto cols = static_cast<int64_t>(x.size());
  std::vector<float> s(x), slope(x.size());
  attention::kernels::cpu::soft_cap(s.data(), cols, 1, cols, 1.0f, slope.data());
  double worst = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    const double expected = std::tanh(static_cast<double>(x[j]));
    INFO("x = " << x[j] << ": got " << s[j] << ", tanh " << expected);
    if (std::isnan(x[j])) {
      CHECK(std::isnan(s[j]));
      continue;
    }
    CHECK(std::signbit(s[j]) == std::signbit(x[j]));
    const float rounded = static_cast<float>(expected);
    const double ulp = std::max(
        static_cast<double>(std::nextafter(std::fabs(rounded), 1.0f / 0.0f)) - std::fabs(rounded),
        static_cast<double>(std::numeric_limits<float>::denorm_min()));
    worst = std::max(worst, std::fabs(s[j] - expected) / ulp);
    CHECK(std::fabs(slope[j] - (1.0 - static_cast<double>(s[j]) * s[j])) < 1e-6);
  }
  CHECK(worst <= 3.0);
  WARN("soft-capping's tanh: worst " << worst << " ulp");
}
