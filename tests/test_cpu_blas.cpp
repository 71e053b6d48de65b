// The matrix product of the fused CPU kernels, on both of its routes (the process's BLAS called
// directly, and LibTorch's addmm), against torch::mm in double: every transpose combination,
// padded row strides, beta 0 with C full of NaN (which must not be read), and the shapes BLAS
// itself refuses (a one-row operand whose row stride is below its width).

#include "kernels/cpu_blas.h"

#include <torch/torch.h>
#include "catch_compat.h"

#include <random>

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

template <typename T, typename Route>
void check_route(Route route, const char* name) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> size(1, 70), pad(0, 5);
  for (int trial = 0; trial < 60; ++trial) {
    const bool trans_a = trial % 2 == 1, trans_b = trial / 2 % 2 == 1, accumulate = trial % 3 == 0;
    const int64_t m = size(rng), n = size(rng), k = size(rng);
    const Padded a = trans_a ? padded<T>(k, m, pad(rng), 0) : padded<T>(m, k, pad(rng), 0);
    const Padded b = trans_b ? padded<T>(n, k, pad(rng), 0) : padded<T>(k, n, pad(rng), 0);
    // beta = 0 must not read C: NaN there would show.
    const Padded c = padded<T>(m, n, pad(rng), accumulate ? 0.0 : std::nan(""));
    if (accumulate) c.matrix().copy_(torch::randn({m, n}, c.storage.options()));
    const auto op_a = trans_a ? a.matrix().t() : a.matrix();
    const auto op_b = trans_b ? b.matrix().t() : b.matrix();
    const T alpha = T(0.75), beta = accumulate ? T(1) : T(0);
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

}  // namespace

TEMPLATE_TEST_CASE("cpu::gemm equals torch::mm on both routes", "[cpu_blas]", float, double) {
  INFO("gemm_route() = " << cpu::gemm_route());
  check_route<TestType>(cpu::gemm<TestType>, "gemm");
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
