// The matrix product of the fused CPU kernels, on each of its routes (libxsmm's generated
// kernels, the process's BLAS called directly, and LibTorch's addmm), against torch::mm in
// double: every transpose combination, padded row strides, beta 0 with C full of NaN (which must
// not be read), the shapes BLAS itself refuses (a one-row operand whose row stride is below its
// width), and what the libxsmm route and the library's vector products take and refuse.

#include "gemm/blas.h"
#include "gemm/small_gemm.h"
#include "gemm/vector_gemm.h"

#include <torch/torch.h>
#include "catch_compat.h"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace cpu = attention::kernels::cpu;

namespace {

// A row-major rows x cols matrix inside a buffer whose rows are `ld` apart.
struct Padded {
  torch::Tensor storage;  // (rows, ld)
  torch::Tensor matrix() const { return storage.narrow(1, 0, cols); }
  int64_t cols;
};

template <typename T>
Padded padded(int64_t rows, int64_t cols, int64_t pad, double fill_padding) {
  const auto dtype = c10::CppTypeToScalarType<T>::value;
  auto storage = torch::full({rows, cols + pad}, fill_padding, torch::dtype(dtype));
  storage.narrow(1, 0, cols).copy_(torch::randn({rows, cols}, torch::dtype(dtype)));
  return {storage, cols};
}

// Random products up to max_side on a side, each side a multiple of granule; with unit_alpha,
// alpha is 1 (what the libxsmm route takes).
template <typename T, typename Route>
void check_route(Route route, const char* name, int64_t max_side = 70, bool unit_alpha = false,
                 int64_t granule = 1) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> size(1, max_side / granule), pad(0, 5);
  for (int trial = 0; trial < 60; ++trial) {
    const bool trans_a = trial % 2 == 1, trans_b = trial / 2 % 2 == 1, accumulate = trial % 3 == 0;
    const int64_t m = granule * size(rng), n = granule * size(rng), k = granule * size(rng);
    const Padded a = trans_a ? padded<T>(k, m, pad(rng), 0) : padded<T>(m, k, pad(rng), 0);
    const Padded b = trans_b ? padded<T>(n, k, pad(rng), 0) : padded<T>(k, n, pad(rng), 0);
    // beta = 0 must not read C: NaN there would show.
    const Padded c = padded<T>(m, n, pad(rng), accumulate ? 0.0 : std::nan(""));
    if (accumulate) c.matrix().copy_(torch::randn({m, n}, c.storage.options()));
    const auto op_a = trans_a ? a.matrix().t() : a.matrix();
    const auto op_b = trans_b ? b.matrix().t() : b.matrix();
    const T alpha = unit_alpha ? T(1) : T(0.75), beta = accumulate ? T(1) : T(0);
    const auto expected =
        (alpha * torch::mm(op_a.to(at::kDouble), op_b.to(at::kDouble)) +
         (accumulate ? c.matrix().to(at::kDouble) : torch::zeros({m, n}, at::kDouble)));
    route(trans_a, trans_b, m, n, k, alpha, a.storage.template data_ptr<T>(), a.storage.stride(0),
          b.storage.template data_ptr<T>(), b.storage.stride(0), beta,
          c.storage.template data_ptr<T>(), c.storage.stride(0));
    INFO(name << ": trans_a " << trans_a << ", trans_b " << trans_b << ", m " << m << ", n " << n
              << ", k " << k << ", beta " << beta);
    const double tolerance = std::is_same_v<T, float> ? 1e-4 * std::sqrt(double(k)) : 1e-12;
    REQUIRE(torch::allclose(c.matrix().to(at::kDouble), expected, tolerance, tolerance));
  }
}

// small_gemm() (with its scratch) where it takes the product, addmm where it does not.
template <typename T>
void small_or_addmm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                    const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  std::vector<T> scratch(m * n);
  if (!cpu::small_gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                          scratch.data()))
    cpu::gemm_through_addmm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// vector_gemm() where it takes the product, addmm where it does not.
void vector_or_addmm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                     int64_t ldc) {
  if (!cpu::vector_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    cpu::gemm_through_addmm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

TEMPLATE_TEST_CASE("cpu::gemm equals torch::mm on both routes", "[cpu_blas]", float, double) {
  INFO("gemm_route() = " << cpu::gemm_route());
  check_route<TestType>([](auto... args) { cpu::gemm<TestType>(args...); }, "gemm");
  check_route<TestType>(cpu::gemm_through_addmm<TestType>, "gemm_through_addmm");
}

TEST_CASE("cpu::gemm takes a one-row operand whose row stride is below its width", "[cpu_blas]") {
  // BLAS refuses a leading dimension below the rows of its column-major matrix; a (1, k) view
  // may carry any row stride, so such products go through addmm.
  const auto a = torch::randn({5});  // one row of 5, row stride 1
  const auto b = torch::randn({5, 3});
  auto c = torch::full({1, 3}, std::nanf(""));
  cpu::gemm<float>(false, false, 1, 3, 5, 1.0f, a.data_ptr<float>(), 1, b.data_ptr<float>(), 3,
                   0.0f, c.data_ptr<float>(), 3);
  REQUIRE(torch::allclose(c, torch::mm(a.view({1, 5}), b), 1e-5, 1e-5));
}

TEMPLATE_TEST_CASE("cpu::small_gemm equals torch::mm where it takes the product", "[cpu_blas]",
                   float, double) {
  INFO("small_gemm_enabled() = " << cpu::small_gemm_enabled());
  // Ragged sides (which it leaves to BLAS), and multiples of the granule up to tile sizes.
  check_route<TestType>(small_or_addmm<TestType>, "small_gemm", 70, true);
  check_route<TestType>(small_or_addmm<TestType>, "small_gemm", 96, true, cpu::kSmallGemmGranule);
  check_route<TestType>(small_or_addmm<TestType>, "small_gemm", 320, true, cpu::kSmallGemmGranule);
}

TEST_CASE("cpu::small_gemm takes the fused kernels' products and refuses what it cannot compute",
          "[cpu_blas]") {
  if (!cpu::small_gemm_enabled()) {
    WARN("skipped: this build has no libxsmm, or ATTENTION_CPU_GEMM switched it off");
    return;
  }
  const int64_t side = 64;
  const auto a = torch::randn({side, side}), b = torch::randn({side, side});
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  auto c = torch::zeros({side, side});
  float* pc = c.data_ptr<float>();
  std::vector<float> scratch(side * side);
  // The kernels' products: alpha 1, A plain or transposed, beta 0, and beta 1 with scratch.
  for (const bool trans_a : {false, true}) {
    INFO("trans_a " << trans_a);
    CHECK(cpu::small_gemm<float>(trans_a, false, side, side, side, 1.0f, pa, side, pb, side, 0.0f,
                                 pc, side, nullptr));
    CHECK(cpu::small_gemm<float>(trans_a, false, side, side, side, 1.0f, pa, side, pb, side, 1.0f,
                                 pc, side, scratch.data()));
  }
  // What it refuses leaves C as it was.
  const auto before = c.clone();
  CHECK_FALSE(cpu::small_gemm<float>(false, true, side, side, side, 1.0f, pa, side, pb, side, 0.0f,
                                     pc, side, nullptr));
  CHECK_FALSE(cpu::small_gemm<float>(false, false, side, side, side, 0.5f, pa, side, pb, side, 0.0f,
                                     pc, side, nullptr));
  CHECK_FALSE(cpu::small_gemm<float>(false, false, side, side, side, 1.0f, pa, side, pb, side, 0.5f,
                                     pc, side, scratch.data()));
  CHECK_FALSE(cpu::small_gemm<float>(false, false, side, side, side, 1.0f, pa, side, pb, side, 1.0f,
                                     pc, side, nullptr));
  CHECK_FALSE(cpu::small_gemm<float>(false, false, side - 1, side, side, 1.0f, pa, side, pb, side,
                                     0.0f, pc, side, nullptr));  // a ragged side
  const int64_t too_long = cpu::kMaxSmallGemmSide + cpu::kSmallGemmGranule;
  const auto wide = torch::randn({side, too_long});
  auto wide_c = torch::zeros({side, too_long});
  CHECK_FALSE(cpu::small_gemm<float>(false, false, side, too_long, side, 1.0f, pa, side,
                                     wide.data_ptr<float>(), too_long, 0.0f,
                                     wide_c.data_ptr<float>(), too_long, nullptr));
  CHECK(torch::equal(c, before));
  CHECK(torch::equal(wide_c, torch::zeros_like(wide_c)));
  // The float products may go to the vector code first (gemm/vector_gemm.h), the rest to libxsmm.
  const std::string route = cpu::gemm_route();
  CHECK((route == "libxsmm" || route == "vector+libxsmm"));
}

TEST_CASE("cpu::vector_gemm equals torch::mm where it takes the product", "[cpu_blas]") {
  if (!cpu::vector_gemm_enabled()) {
    WARN("skipped: the vector products are not taken here (ATTENTION_CPU_GEMM=vector takes them)");
    return;
  }
  INFO("vector_gemm_set() = " << cpu::vector_gemm_set());
  // Ragged sides (n past whole vectors is refused), whole vectors, and the tiles' sizes up to the
  // largest block: rows past the last block of 6, one vector past the last pair.
  check_route<float>(vector_or_addmm, "vector_gemm", 70, true);
  check_route<float>(vector_or_addmm, "vector_gemm", 96, true, 8);
  check_route<float>(vector_or_addmm, "vector_gemm", cpu::kMaxVectorGemmSide, true, 16);
}

TEST_CASE("cpu::vector_gemm takes the fused kernels' products and refuses what it cannot compute",
          "[cpu_blas]") {
  if (!cpu::vector_gemm_enabled()) {
    WARN("skipped: the vector products are not taken here (ATTENTION_CPU_GEMM=vector takes them)");
    return;
  }
  const int64_t side = 64, deep = cpu::kMaxVectorGemmSide;
  const auto a = torch::randn({side, deep}), b = torch::randn({deep, side});
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  auto c = torch::zeros({side, side});
  float* pc = c.data_ptr<float>();
  // The kernels' products: A plain or transposed, beta 0 and 1 (no scratch), one row, one term,
  // the deepest.
  for (const bool trans_a : {false, true}) {
    INFO("trans_a " << trans_a);
    const int64_t lda = trans_a ? side : deep;
    CHECK(cpu::vector_gemm(trans_a, false, side, side, side, 1.0f, pa, lda, pb, side, 0.0f, pc,
                           side));
    CHECK(cpu::vector_gemm(trans_a, false, side, side, side, 1.0f, pa, lda, pb, side, 1.0f, pc,
                           side));
    CHECK(cpu::vector_gemm(trans_a, false, 1, side, 1, 1.0f, pa, lda, pb, side, 0.0f, pc, side));
  }
  CHECK(cpu::vector_gemm(false, false, side, side, deep, 1.0f, pa, deep, pb, side, 0.0f, pc, side));
  CHECK(torch::allclose(c, torch::mm(a, b), 1e-3, 1e-3));
  // What it refuses leaves C as it was: the options at their extremes.
  const auto before = c.clone();
  struct Call {
    bool trans_b = false;
    int64_t m = side, n = side, k = side;
    float alpha = 1.0f;
    int64_t lda = deep, ldb = side;
    float beta = 0.0f;
    int64_t ldc = side;
  };
  const auto refused = [&](const Call& call) {
    return !cpu::vector_gemm(false, call.trans_b, call.m, call.n, call.k, call.alpha, pa, call.lda,
                             pb, call.ldb, call.beta, pc, call.ldc);
  };
  // Call's defaults (a product it takes) with one option changed.
  const auto refused_with = [&](auto member, auto value) {
    Call call;
    call.*member = value;
    return refused(call);
  };
  CHECK(refused_with(&Call::trans_b, true));
  CHECK(refused_with(&Call::alpha, 0.5f));
  CHECK(refused_with(&Call::beta, 0.5f));
  CHECK(refused_with(&Call::n, side - 1));  // past whole vectors
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  const int64_t two_31 = int64_t{1} << 31;
  for (const int64_t bad : {int64_t{0}, int64_t{-1}, deep + 1, two_31, kHuge}) {
    INFO("side " << bad);
    CHECK(refused_with(&Call::m, bad));
    CHECK(refused_with(&Call::n, bad));
    CHECK(refused_with(&Call::k, bad));
  }
  for (const int64_t bad : {int64_t{1}, two_31, kHuge}) {  // strides too short or too long
    INFO("stride " << bad);
    CHECK(refused_with(&Call::lda, bad));
    CHECK(refused_with(&Call::ldb, bad));
    CHECK(refused_with(&Call::ldc, bad));
  }
  CHECK(torch::equal(c, before));
}

TEMPLATE_TEST_CASE("cpu::transpose_scaled turns and scales a strided block", "[cpu_blas]", float,
                   double) {
  // Sides that are not multiples of its square blocks, a padded input and output.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 70}, {256, 64}, {1, 5}}) {
    const auto dtype = c10::CppTypeToScalarType<TestType>::value;
    const auto in = torch::randn({rows, cols + 3}, torch::dtype(dtype));
    auto out = torch::full({cols, rows + 2}, 7.0, torch::dtype(dtype));
    cpu::transpose_scaled<TestType>(in.template data_ptr<TestType>(), cols + 3, rows, cols,
                                    TestType(0.5), out.template data_ptr<TestType>(), rows + 2);
    INFO(rows << " x " << cols);
    CHECK(torch::equal(out.narrow(1, 0, rows), in.narrow(1, 0, cols).t() * 0.5));
    CHECK(torch::equal(out.narrow(1, rows, 2), torch::full({cols, 2}, 7.0, torch::dtype(dtype))));
  }
}
