// The Chunked backward, both of its kernels (the fused CPU kernel and the device-generic tiles,
// which other devices and dtypes take), against the gradients autograd gives through the Math
// backend; and bfloat16, which the fused kernels compute in float, and a module's bfloat16
// projections with their gradients.

#include <attention/functional.h>
#include <attention/multi_head_attention.h>

#include "chunked_kernels.h"
#include "helpers.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <random>
#include <tuple>

namespace F = attention::functional;
namespace K = attention::kernels;
using F::Backend;
using Options = F::ScaledDotProductAttentionOptions;

namespace {

using test::chunked_grads;
using test::math_grads;
using test::with_threads;
using test::worst;

// The largest error of `got` relative to the largest magnitude of `want`.
double relative_to_largest(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want).abs().max().item<double>() /
         want.abs().max().item<double>();
}

}  // namespace

TEST_CASE("chunked backward: both kernels equal math's gradients in double", "[chunked]") {
  std::mt19937 rng(41);
  torch::manual_seed(41);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  // One thread and two: with two, a problem of one key/value head splits its key blocks between
  // two items, whose query gradients are summed.
  for (int threads : {1, 2}) {
    with_threads(threads, [&] {
      for (int trial = 0; trial < 24; ++trial) {
        const int64_t b = pick({1, 2}), kv = pick({1, 2, 3}), group = pick({1, 2, 4});
        const int64_t t_q = pick({1, 9, 40, 100}), t_k = pick({1, 13, 40, 90});
        const int64_t d = pick({4, 16}), dv = pick({3, 8}), block = pick({7, 16, 64});
        const bool causal = trial % 2 == 0;
        auto q = torch::randn({b, t_q, kv * group, d}, opts).transpose(1, 2);  // strided heads
        auto k = torch::randn({b, kv, t_k, d}, opts) * 2;
        auto v = torch::randn({b, kv, t_k, dv}, opts);
        torch::Tensor mask;
        if (trial % 3 == 1) mask = torch::rand({b, 1, 1, t_k}) < 0.3;
        if (trial % 3 == 2) mask = torch::randn({b, kv * group, t_q, t_k}, opts);
        INFO("threads " << threads << ", trial " << trial << ": q " << q.sizes() << ", k "
                        << k.sizes() << ", causal " << causal << ", block " << block);
        const auto options = Options().attn_mask(mask).is_causal(causal).block_size(block);
        const auto upstream = torch::randn({b, kv * group, t_q, dv}, opts);
        const auto truth = math_grads(q, k, v, options, upstream);
        CHECK(worst(chunked_grads(q, k, v, options, upstream, true), truth) < 1e-10);
        CHECK(worst(chunked_grads(q, k, v, options, upstream, false), truth) < 1e-10);
      }
    });
  }
}

TEST_CASE("chunked backward: float32 at T >= 1024 is as accurate as math's", "[chunked]") {
  // Grouped heads (one key/value head of four queries, so two threads split its key blocks),
  // causal with more keys than queries, and a key-padding mask; errors against the float64
  // truth, since two float32 results differ by how the BLAS rounds.
  torch::manual_seed(43);
  const int64_t t_q = 1100, t_k = 1300;
  auto q = torch::randn({1, 4, t_q, 32}), k = torch::randn({1, 1, t_k, 32}),
       v = torch::randn({1, 1, t_k, 16});
  auto mask = torch::rand({1, 1, 1, t_k}) < 0.1;
  const auto upstream = torch::randn({1, 4, t_q, 16});
  const auto options = Options().attn_mask(mask).is_causal(true);
  const auto as_double = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const auto truth =
      math_grads(as_double(q), as_double(k), as_double(v), options, as_double(upstream));
  with_threads(2, [&] {
    const double math_error = worst(math_grads(q, k, v, options, upstream), truth);
    for (bool fused : {true, false}) {
      INFO((fused ? "fused" : "tiles") << ", math's error " << math_error);
      CHECK(worst(chunked_grads(q, k, v, options, upstream, fused), truth) <=
            2 * math_error + 1e-6);
    }
  });
}

TEST_CASE("chunked backward: NaN and fully masked rows follow the contract", "[chunked]") {
  // docs/CONTRACT.md: gradients equal Math's wherever Math's are finite; where Math's are NaN a
  // blockwise backend may stay finite (Math's NaN softmax row reaches even the keys the query
  // cannot see). A NaN query's own gradient is NaN; a query that sees no key adds nothing.
  torch::manual_seed(47);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({1, 2, 12, 4}, opts), k = torch::randn({1, 2, 12, 4}, opts),
       v = torch::randn({1, 2, 12, 3}, opts);
  q[0][1][5][2] = NAN;
  auto mask = torch::zeros({1, 1, 12, 12}, torch::kBool);
  mask[0][0][3].fill_(true);
  const auto upstream = torch::randn({1, 2, 12, 3}, opts);
  const auto options = Options().attn_mask(mask).is_causal(true).block_size(4);
  const auto truth = math_grads(q, k, v, options, upstream);
  const auto equal_where_finite = [](const torch::Tensor& got, const torch::Tensor& want) {
    const auto finite = want.isfinite();
    return torch::equal(got.isfinite().logical_and(finite), finite) &&
           test::max_abs_diff(got.masked_select(finite), want.masked_select(finite)) < 1e-10;
  };
  for (bool fused : {true, false}) {
    INFO((fused ? "fused" : "tiles"));
    const auto got = chunked_grads(q, k, v, options, upstream, fused);
    CHECK(equal_where_finite(got.q, truth.q));
    CHECK(equal_where_finite(got.k, truth.k));
    CHECK(equal_where_finite(got.v, truth.v));
    CHECK(got.q[0][1][5].isnan().all().item<bool>());
    CHECK(got.q[0][0][3].abs().sum().item<double>() == 0.0);
  }
}

TEST_CASE("chunked backward: autograd through the module path takes the fused kernel",
          "[chunked]") {
  // The same gradients through scaled_dot_product_attention (autograd's Chunked function) as
  // from the fused kernel called directly: the function hands its backward to it.
  torch::manual_seed(53);
  auto q = torch::randn({2, 3, 70, 8}, torch::requires_grad());
  auto k = torch::randn({2, 3, 70, 8}, torch::requires_grad());
  auto v = torch::randn({2, 3, 70, 8}, torch::requires_grad());
  const auto options = Options().is_causal(true).block_size(32);
  const auto upstream = torch::randn({2, 3, 70, 8});
  F::scaled_dot_product_attention(q, k, v, Options(options).backend(Backend::Chunked))
      .output.backward(upstream);
  const auto direct = chunked_grads(q.detach(), k.detach(), v.detach(), options, upstream, true);
  CHECK(torch::equal(q.grad(), direct.q));
  CHECK(torch::equal(k.grad(), direct.k));
  CHECK(torch::equal(v.grad(), direct.v));
}

TEST_CASE("chunked backward: bfloat16 runs the fused kernels in float and follows float32",
          "[chunked]") {
  // Inputs rounded to bfloat16 and widened back are the float32 problem the kernels solve. On the
  // widened route the only further error is one rounding of each result to bfloat16 (8
  // significant bits); on the processor's bfloat16 products (kernels/cpu/bf16_products.h) each
  // tile's probabilities and score gradients are rounded to bfloat16 once as well. Either way the
  // fused results stay within 2^-7 of float32 (relative to the largest value). The tiles, which
  // other devices take, round every intermediate to bfloat16, as the whole-matrix formula does in
  // bfloat16: they stay within the error of that formula (Math in bfloat16), which depends on how
  // the processor's BLAS rounds bfloat16 products (0.045 for these outputs of order 1 on an AMD
  // Zen 3); a quarter more is allowed, for processors where the formula rounds more luckily.
  torch::manual_seed(59);
  const auto low = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  const auto wide = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  auto q = low(torch::randn({2, 4, 300, 16})), k = low(torch::randn({2, 2, 330, 16})),
       v = low(torch::randn({2, 2, 330, 8}));
  auto mask = low(torch::randn({300, 330}));
  const auto upstream = low(torch::randn({2, 4, 300, 8}));
  const auto options = Options().is_causal(true).attn_mask(mask).block_size(64);
  auto float_options = options;
  float_options.attn_mask(wide(mask));
  const auto reference = math_grads(wide(q), wide(k), wide(v), float_options, wide(upstream));
  const auto reference_out = F::scaled_dot_product_attention(wide(q), wide(k), wide(v),
                                                             float_options.backend(Backend::Math))
                                 .output;
  auto out = F::scaled_dot_product_attention(q, k, v, Options(options).backend(Backend::Chunked));
  REQUIRE(out.output.scalar_type() == torch::kBFloat16);
  CHECK(F::last_path() == F::Path::ChunkedFused);
  const auto relative = [](const torch::Tensor& got, const torch::Tensor& want) {
    return test::max_abs_diff(got, want) / want.abs().max().item<double>();
  };
  CHECK(relative(out.output, reference_out) < 2.0 / 256);
  const auto got = chunked_grads(q, k, v, options, upstream, true);
  REQUIRE(got.q.scalar_type() == torch::kBFloat16);
  CHECK(relative(got.q, reference.q) < 2.0 / 256);
  CHECK(relative(got.k, reference.k) < 2.0 / 256);
  CHECK(relative(got.v, reference.v) < 2.0 / 256);

  auto p = K::make_problem(q, k, v, options, "test");
  p.mask = p.expanded_mask();
  const auto tiles = K::tiles_forward_with_lse(p, q, k, v).first;
  REQUIRE(tiles.scalar_type() == torch::kBFloat16);
  const auto math_low =
      F::scaled_dot_product_attention(q, k, v, Options(options).backend(Backend::Math)).output;
  REQUIRE(math_low.scalar_type() == torch::kBFloat16);
  const double formula_error = test::max_abs_diff(math_low, reference_out);
  INFO("Math in bfloat16: " << formula_error);
  CHECK(formula_error < 0.1);
  CHECK(test::max_abs_diff(tiles, reference_out) <= 1.25 * formula_error);
}

TEST_CASE("chunked backward: a double backward through the fused kernels is refused, Math's works",
          "[chunked]") {
  torch::manual_seed(17);
  const auto q = torch::randn({1, 2, 40, 8}, torch::dtype(torch::kDouble).requires_grad(true));
  const auto k = torch::randn({1, 2, 40, 8}, torch::dtype(torch::kDouble).requires_grad(true));
  const auto v = torch::randn({1, 2, 40, 8}, torch::dtype(torch::kDouble).requires_grad(true));
  const auto first_order = [&](Backend backend) {
    const auto out =
        F::scaled_dot_product_attention(q, k, v, Options().is_causal(true).backend(backend)).output;
    return torch::autograd::grad({out.square().sum()}, {q}, {}, /*retain_graph=*/true,
                                 /*create_graph=*/true)[0];
  };
  // Its gradients carry no record: taken as constants, a second order would be wrong.
  CHECK_THROWS_C10(first_order(Backend::Chunked), c10::Error,
                   "attention::functional::scaled_dot_product_attention: the fused CPU backward "
                   "gives first-order gradients only");
  const auto dq = first_order(Backend::Math);
  REQUIRE(dq.requires_grad());
  const auto second = torch::autograd::grad({dq.sum()}, {k})[0];
  CHECK(second.abs().sum().item<double>() > 0.0);
}

TEST_CASE("a module's bfloat16 projections and their gradients stay within their roundings",
          "[bf16_projections]") {
  // 192 rows of x: enough that where the library widens bfloat16 (no bfloat16 products, or
  // ATTENTION_CPU_BF16=widened: ctest's chunked.bf16_widened) the projections are widened into
  // float's products too, each result rounded once; elsewhere LibTorch's bfloat16 products take
  // them. (Not in the aarch64 leg: LibTorch's bfloat16 products fail in oneDNN under the
  // emulator, docs/DEVELOPMENT.md.) Against the same module in float64 (its bfloat16 weights
  // widened): the output and the gradients of x and of each projection's weight within eight
  // roundings (2^-6) of their largest values: the projections, the attention and the output
  // projection each round.
  torch::manual_seed(12);
  attention::MultiHeadAttention low(attention::MultiHeadAttentionOptions(64, 64, 4).qkv_bias(true));
  low->to(torch::kBFloat16);
  auto exact = std::dynamic_pointer_cast<attention::MultiHeadAttentionImpl>(low->clone());
  exact->to(torch::kDouble);
  const auto x = torch::randn({2, 96, 64}).to(torch::kBFloat16);
  const auto upstream = torch::randn({2, 96, 64}).to(torch::kBFloat16);
  const auto run = [&](auto& module, const torch::Tensor& input) {
    const auto in = input.detach().requires_grad_();
    const auto out = module->forward(in).output;
    const auto params = module->named_parameters();
    const auto grads = torch::autograd::grad(
        {out}, {in, params["W_query.weight"], params["W_value.bias"], params["out_proj.weight"]},
        {upstream.to(input.scalar_type())});
    return std::vector<torch::Tensor>{out.detach(), grads[0], grads[1], grads[2], grads[3]};
  };
  const auto got = run(low, x);
  const auto want = run(exact, x.to(torch::kDouble));
  {  // inference: the three projections of one x at once, within the same bound
    torch::NoGradGuard no_grad;
    const auto inferred = low->forward(x).output;
    INFO("inference: error " << relative_to_largest(inferred, want[0]) << " of its largest value");
    REQUIRE(inferred.scalar_type() == torch::kBFloat16);
    CHECK(relative_to_largest(inferred, want[0]) < 1.0 / 64);
  }
  const char* names[] = {"output", "x's gradient", "W_query's", "W_value's bias", "out_proj's"};
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(names[i] << ": error " << relative_to_largest(got[i], want[i]) << " of its largest value");
    REQUIRE(got[i].scalar_type() == torch::kBFloat16);
    CHECK(relative_to_largest(got[i], want[i]) < 1.0 / 64);
  }
}
