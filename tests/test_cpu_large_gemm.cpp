// The projections' large products on the generated kernels (gemm/large_gemm.h) against
// torch::mm in double: A plain and transposed, padded row strides, C full of NaN (never read),
// sides that span several tiles and a ragged last tile, contractions summed in pieces; the same
// result on one thread and two; what it refuses leaves C as it was; the module's projections
// with their gradients on it against linear in double; and the rule that picks their route.

#include "gemm/blas.h"
#include "gemm/large_gemm.h"
#include "gemm/small_gemm.h"
#include "modules/projection.h"
#include "platform/cpu_features.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>
#include "catch_compat.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

namespace cpu = attention::kernels::cpu;

namespace {

// A rows x cols matrix in a (rows, cols + pad) buffer; the padding is NaN, which must not be read.
template <typename T>
torch::Tensor padded_random(int64_t rows, int64_t cols, int64_t pad) {
  auto storage = torch::full({rows, cols + pad}, std::nan(""),
                             torch::dtype(c10::CppTypeToScalarType<T>::value));
  storage.narrow(1, 0, cols).normal_();
  return storage;
}

struct Product {
  torch::Tensor a, b, c;  // padded storages; op(A) B lands in c's first n columns
  int64_t n = 0;
  torch::Tensor result() const { return c.narrow(1, 0, n); }
};

template <typename T>
std::pair<Product, bool> run(bool trans_a, int64_t m, int64_t n, int64_t k, int64_t pad) {
  Product p;
  p.a = trans_a ? padded_random<T>(k, m, pad) : padded_random<T>(m, k, pad);
  p.b = padded_random<T>(k, n, pad);
  p.c = torch::full({m, n + pad}, std::nan(""), p.a.options());
  p.n = n;
  const bool taken = cpu::large_gemm<T>(trans_a, m, n, k, p.a.template data_ptr<T>(), p.a.stride(0),
                                        p.b.template data_ptr<T>(), p.b.stride(0),
                                        p.c.template data_ptr<T>(), p.c.stride(0));
  return {p, taken};
}

torch::Tensor expected_of(bool trans_a, const Product& p, int64_t m, int64_t k) {
  const auto a = trans_a ? p.a.narrow(1, 0, m).t() : p.a.narrow(1, 0, k);
  return torch::mm(a.to(at::kDouble), p.b.narrow(1, 0, p.n).to(at::kDouble));
}

}  // namespace

TEMPLATE_TEST_CASE("cpu::large_gemm equals torch::mm in double", "[cpu_blas][large_gemm]", float,
                   double) {
  if (!cpu::small_gemm_enabled()) {
    WARN("skipped: this build has no libxsmm, or ATTENTION_CPU_GEMM switched it off");
    return;
  }
  torch::manual_seed(3);
  const int64_t g = cpu::kSmallGemmGranule;
  // (m, n, k): one tile; several tiles with ragged last ones on both sides; a contraction at the
  // kernels' bound (taken whole) and two beyond it (summed in pieces, the last one short).
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{g, g, g},
                                {17 * g, 5 * g, 3 * g},
                                {9 * g, 13 * g, cpu::kMaxSmallGemmSide},
                                {3 * g, 4 * g, cpu::kMaxSmallGemmSide + g},
                                {2 * g, 2 * g, 129 * g}}) {
    for (const bool trans_a : {false, true}) {
      for (const int64_t pad : {0, 3}) {
        INFO("m " << m << ", n " << n << ", k " << k << ", trans_a " << trans_a << ", pad " << pad);
        const auto [p, taken] = run<TestType>(trans_a, m, n, k, pad);
        REQUIRE(taken);
        const double tolerance =
            std::is_same_v<TestType, float> ? 1e-4 * std::sqrt(double(k)) : 1e-12;
        CHECK(torch::allclose(p.result().to(at::kDouble), expected_of(trans_a, p, m, k), tolerance,
                              tolerance));
        CHECK(p.c.narrow(1, n, pad).isnan().all().template item<bool>());  // C's padding untouched
      }
    }
  }
}

TEMPLATE_TEST_CASE("cpu::large_gemm accumulates into C on request", "[cpu_blas][large_gemm]", float,
                   double) {
  if (!cpu::small_gemm_enabled()) {
    WARN("skipped: this build has no libxsmm, or ATTENTION_CPU_GEMM switched it off");
    return;
  }
  torch::manual_seed(4);
  const int64_t g = cpu::kSmallGemmGranule;
  // A contraction taken whole and one summed in pieces; A plain and transposed.
  for (const int64_t k : {3 * g, cpu::kMaxSmallGemmSide + 2 * g}) {
    for (const bool trans_a : {false, true}) {
      INFO("k " << k << ", trans_a " << trans_a);
      const int64_t m = 9 * g, n = 5 * g;
      const auto dtype = c10::CppTypeToScalarType<TestType>::value;
      const auto a = trans_a ? torch::randn({k, m}, dtype) : torch::randn({m, k}, dtype);
      const auto b = torch::randn({k, n}, dtype);
      const auto before = torch::randn({m, n}, dtype);
      auto c = before.clone();
      REQUIRE(cpu::large_gemm<TestType>(trans_a, m, n, k, a.template data_ptr<TestType>(),
                                        a.size(1), b.template data_ptr<TestType>(), n,
                                        c.template data_ptr<TestType>(), n, /*accumulate=*/true));
      const auto op_a = (trans_a ? a.t() : a).to(at::kDouble);
      const auto expected = before.to(at::kDouble) + torch::mm(op_a, b.to(at::kDouble));
      const double tolerance =
          std::is_same_v<TestType, float> ? 1e-4 * std::sqrt(double(k)) : 1e-12;
      CHECK(torch::allclose(c.to(at::kDouble), expected, tolerance, tolerance));
    }
  }
}

TEST_CASE("cpu::large_gemm gives the same bits on one thread and two", "[cpu_blas][large_gemm]") {
  if (!cpu::small_gemm_enabled()) {
    WARN("skipped: this build has no libxsmm, or ATTENTION_CPU_GEMM switched it off");
    return;
  }
  const int threads = at::get_num_threads();
  torch::manual_seed(5);
  const auto a = torch::randn({40 * 16, 48 * 16}), b = torch::randn({48 * 16, 20 * 16});
  const auto product_on = [&](int count) {
    at::set_num_threads(count);
    auto c = torch::empty({a.size(0), b.size(1)});
    REQUIRE(cpu::large_gemm<float>(false, a.size(0), b.size(1), a.size(1), a.data_ptr<float>(),
                                   a.size(1), b.data_ptr<float>(), b.size(1), c.data_ptr<float>(),
                                   c.size(1)));
    return c;
  };
  const auto one = product_on(1), two = product_on(2);
  at::set_num_threads(threads);
  CHECK(torch::equal(one, two));
}

TEST_CASE("cpu::large_gemm refuses what it does not take and leaves C as it was",
          "[cpu_blas][large_gemm]") {
  const int64_t g = cpu::kSmallGemmGranule;
  const auto a = torch::randn({4 * g, 4 * g}), b = torch::randn({4 * g, 4 * g});
  auto c = torch::full({4 * g, 4 * g}, 7.0f);
  const auto refuses = [&](int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
    return !cpu::large_gemm<float>(false, m, n, k, a.data_ptr<float>(), lda, b.data_ptr<float>(),
                                   ldb, c.data_ptr<float>(), ldc);
  };
  CHECK(refuses(4 * g - 1, 4 * g, 4 * g, 4 * g, 4 * g, 4 * g));  // a ragged side
  CHECK(refuses(4 * g, 4 * g - 3, 4 * g, 4 * g, 4 * g, 4 * g));
  CHECK(refuses(4 * g, 4 * g, 0, 4 * g, 4 * g, 4 * g));          // an empty contraction
  CHECK(refuses(4 * g, 4 * g, 4 * g, 4 * g - 1, 4 * g, 4 * g));  // a stride shorter than its row
  CHECK(refuses(2 * g, 4 * g, 4 * g, 4 * g, 4 * g, 2 * g));
  CHECK((c == 7.0f).all().item<bool>());
  if (!cpu::small_gemm_enabled()) CHECK(refuses(4 * g, 4 * g, 4 * g, 4 * g, 4 * g, 4 * g));
}

TEMPLATE_TEST_CASE("The projections and their gradients on the generated kernels equal linear",
                   "[cpu_blas][large_gemm][workspace]", float, double) {
  torch::manual_seed(11);
  const auto dtype = c10::CppTypeToScalarType<TestType>::value;
  // 160 rows of 64 features into 48: sides the generated kernels take (multiples of 16), and
  // rows enough for them (fewer take BLAS on W itself).
  const auto x = torch::randn({2, 80, 64}, dtype).requires_grad_();
  const auto w = torch::randn({48, 64}, dtype).requires_grad_();
  const auto b = torch::randn({48}, dtype).requires_grad_();
  const auto ours = attention::detail::linear_large(x, w, b);
  // The upstream of a sum (one value expanded) and a random one.
  for (const bool expanded : {true, false}) {
    INFO("expanded upstream: " << expanded);
    const auto upstream = expanded ? torch::ones({1, 1, 1}, dtype).expand(ours.sizes())
                                   : torch::randn(ours.sizes(), dtype);
    const auto grads = torch::autograd::grad({ours}, {x, w, b}, {upstream}, true);
    const auto x64 = x.detach().to(at::kDouble).requires_grad_();
    const auto w64 = w.detach().to(at::kDouble).requires_grad_();
    const auto b64 = b.detach().to(at::kDouble).requires_grad_();
    const auto theirs = torch::nn::functional::linear(x64, w64, b64);
    const auto expected =
        torch::autograd::grad({theirs}, {x64, w64, b64}, {upstream.to(at::kDouble)});
    const double tolerance = std::is_same_v<TestType, float> ? 1e-4 : 1e-12;
    CHECK(torch::allclose(ours.to(at::kDouble), theirs, tolerance, tolerance));
    for (int i = 0; i < 3; ++i) {
      INFO("gradient " << i);
      CHECK(torch::allclose(grads[i].to(at::kDouble), expected[i], tolerance, tolerance));
    }
  }
  // Inference: the workspace's projection (project without autograd) takes the same route.
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(torch::nn::LinearOptions(64, 48));
  linear->to(dtype);
  const auto plain = x.detach();
  const auto expected = torch::nn::functional::linear(
      plain.to(at::kDouble), linear->weight.to(at::kDouble), linear->bias.to(at::kDouble));
  const double tolerance = std::is_same_v<TestType, float> ? 1e-4 : 1e-12;
  CHECK(torch::allclose(attention::detail::project(linear, plain).to(at::kDouble), expected,
                        tolerance, tolerance));
}

TEMPLATE_TEST_CASE("Queries, keys and values of one input as one node equal three linears",
                   "[cpu_blas][large_gemm][workspace]", float, double) {
  torch::manual_seed(12);
  const auto dtype = c10::CppTypeToScalarType<TestType>::value;
  const double tolerance = std::is_same_v<TestType, float> ? 1e-4 : 1e-12;
  // 64 features (the generated kernels' sides) and 40 (LibTorch's BLAS, the sums by addmm);
  // with biases and without; every output in the loss, and the keys left out of it.
  for (const int64_t features : {64, 40}) {
    for (const bool bias : {true, false}) {
      for (const bool keys_used : {true, false}) {
        INFO("features " << features << ", bias " << bias << ", keys used " << keys_used);
        std::vector<torch::nn::Linear> linears;
        std::vector<torch::Tensor> params;
        for (int i = 0; i < 3; ++i) {
          linears.emplace_back(torch::nn::LinearOptions(features, 32 + 16 * i).bias(bias));
          linears.back()->to(dtype);
          for (const auto& p : linears.back()->parameters()) params.push_back(p);
        }
        const auto x = torch::randn({2, 48, features}, dtype).requires_grad_();
        const auto ours =
            attention::detail::project_qkv(linears[0], linears[1], linears[2], x, x, nullptr);
        CHECK(ours[0].grad_fn() == ours[2].grad_fn());  // one node
        std::vector<torch::Tensor> theirs, upstreams;
        std::vector<torch::Tensor> inputs{x};
        inputs.insert(inputs.end(), params.begin(), params.end());
        torch::Tensor loss_ours = torch::zeros({}, dtype), loss_theirs = torch::zeros({}, dtype);
        for (int i = 0; i < 3; ++i) {
          const auto& l = linears[i];
          theirs.push_back(torch::nn::functional::linear(x, l->weight, l->bias));
          CHECK(torch::allclose(ours[i], theirs[i], tolerance, tolerance));
          if (i == 1 && !keys_used) continue;
          const auto upstream = torch::randn(ours[i].sizes(), dtype);
          loss_ours = loss_ours + (ours[i] * upstream).sum();
          loss_theirs = loss_theirs + (theirs[i] * upstream).sum();
        }
        const auto g1 = torch::autograd::grad({loss_ours}, inputs, {}, true, true, true);
        const auto g2 = torch::autograd::grad({loss_theirs}, inputs, {}, true, true, true);
        for (size_t i = 0; i < inputs.size(); ++i) {
          INFO("gradient " << i);
          REQUIRE(g1[i].defined() == g2[i].defined());
          if (g1[i].defined()) CHECK(torch::allclose(g1[i], g2[i], tolerance, tolerance));
        }
        // Without create_graph (the kernels' route), and through the first gradients with it.
        const auto plain = torch::autograd::grad({loss_ours}, {x, params[0]}, {}, true);
        CHECK(torch::allclose(plain[0], g2[0], tolerance, tolerance));
        CHECK(torch::allclose(plain[1], g2[1], tolerance, tolerance));
        const auto h1 = torch::autograd::grad({g1[0].square().sum()}, {params[0]});
        const auto h2 = torch::autograd::grad({g2[0].square().sum()}, {params[0]});
        CHECK(torch::allclose(h1[0], h2[0], tolerance, tolerance));
      }
    }
  }
}

TEST_CASE("The projections take the generated kernels only where the BLAS lacks AVX-512 kernels",
          "[cpu_blas][large_gemm]") {
  // OpenBLAS's core names, as openblas_get_corename() spells them (and once in lower case).
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids", "sapphirerapids"}) {
    INFO(wide);
    CHECK_FALSE(cpu::generated_beats_blas(true, wide));
  }
  for (const char* narrow : {"Haswell", "Zen", "Prescott"}) {
    INFO(narrow);
    CHECK(cpu::generated_beats_blas(true, narrow));
    CHECK_FALSE(cpu::generated_beats_blas(false, narrow));  // the generated code is AVX2 too
  }
  CHECK_FALSE(cpu::generated_beats_blas(true, nullptr));  // another BLAS picks its own kernels
  CHECK_FALSE(cpu::generated_beats_blas(true, ""));
}

TEST_CASE("The projections' route follows the rule and ATTENTION_CPU_PROJECTIONS",
          "[cpu_blas][large_gemm]") {
  const char* forced = std::getenv("ATTENTION_CPU_PROJECTIONS");
  const std::string choice = forced != nullptr ? forced : "";
  const bool rule = cpu::generated_beats_blas(cpu::processor_has_avx512f(), cpu::blas_core_name());
  const bool expected =
      cpu::small_gemm_enabled() && choice != "blas" && (choice == "generated" || rule);
  INFO("BLAS core " << (cpu::blas_core_name() != nullptr ? cpu::blas_core_name() : "(unnamed)")
                    << ", ATTENTION_CPU_PROJECTIONS '" << choice << "'");
  CHECK(cpu::large_gemm_preferred() == expected);
}
