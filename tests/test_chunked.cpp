// The Chunked and Native backends against the Math backend (the article's formula).

#include <attention/functional.h>

#include "helpers.h"

#include <torch/torch.h>

#include <random>

namespace F = attention::functional;
using F::Backend;
using Options = F::ScaledDotProductAttentionOptions;

namespace {

struct ChunkedInputs {
  torch::Tensor q, k, v, mask;
};

// A random problem: leading dims, heads (grouped or not), lengths, and maybe a mask.
ChunkedInputs random_problem(std::mt19937& rng, torch::Dtype dtype) {
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const int64_t b = pick({1, 2, 3}), kv_heads = pick({1, 2, 3}), group = pick({1, 2, 4});
  const int64_t t_q = pick({1, 5, 17, 33, 64}), t_k = pick({1, 7, 17, 40, 64});
  const int64_t d = pick({3, 8, 16}), dv = pick({2, 8, 5});
  auto opts = torch::TensorOptions().dtype(dtype);
  ChunkedInputs in;
  in.q = torch::randn({b, kv_heads * group, t_q, d}, opts) * 2;
  in.k = torch::randn({b, kv_heads, t_k, d}, opts) * 2;
  in.v = torch::randn({b, kv_heads, t_k, dv}, opts);
  switch (rng() % 4) {
    case 1:
      in.mask = torch::rand({b, 1, 1, t_k}) < 0.3;
      break;  // key padding
    case 2:
      in.mask = torch::rand({t_q, t_k}) < 0.3;
      break;  // shared bool mask
    case 3:
      in.mask = torch::randn({b, kv_heads * group, t_q, t_k}, opts);
      break;  // additive
    default:
      break;
  }
  return in;
}

}  // namespace

TEST_CASE("chunked: equals math across shapes, masks, causal settings, GQA and block remainders",
          "[chunked]") {
  std::mt19937 rng(2024);
  torch::manual_seed(2024);
  for (int trial = 0; trial < 60; ++trial) {
    auto in = random_problem(rng, torch::kFloat);
    const bool causal = trial % 2 == 0;
    const int64_t block = std::vector<int64_t>{7, 16, 128}[trial % 3];
    INFO("trial " << trial << ": q " << in.q.sizes() << ", k " << in.k.sizes() << ", causal "
                  << causal << ", block " << block << ", mask "
                  << (in.mask.defined() ? c10::str(in.mask.sizes()) : "none"));
    auto options = Options().attn_mask(in.mask).is_causal(causal);
    auto math = F::scaled_dot_product_attention(in.q, in.k, in.v, options.backend(Backend::Math));
    auto chunked = F::scaled_dot_product_attention(
        in.q, in.k, in.v, options.backend(Backend::Chunked).block_size(block));
    CHECK(test::max_abs_diff(chunked.output, math.output) < 1e-5);
    auto native =
        F::scaled_dot_product_attention(in.q, in.k, in.v, options.backend(Backend::Native));
    CHECK(test::max_abs_diff(native.output, math.output) < 1e-5);
  }
}

TEST_CASE("chunked: long sequences, diagonal strips, strided heads and the output layout",
          "[chunked]") {
  // Heads split from (B, T, H, d) the way a module does; blocks over 64 rows are computed in
  // strips where they cross the causal diagonal; large scores reach the exp's underflow range.
  std::mt19937 rng(31);
  torch::manual_seed(31);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t kv = pick({4, 2, 1}), t_q = pick({130, 257, 300});
    const int64_t t_k = pick({t_q, t_q + 77, t_q - 50}), d = pick({16, 64});
    const int64_t block = pick({128, 256});
    const double magnitude = trial % 4 == 3 ? 20.0 : 2.0;
    const bool causal = trial % 3 != 0;
    auto q = (torch::randn({2, t_q, 4, d}) * magnitude).transpose(1, 2);
    auto k = torch::randn({2, t_k, kv, d}).transpose(1, 2);
    auto v = torch::randn({2, t_k, kv, 24}).transpose(1, 2);
    torch::Tensor mask;
    if (trial % 4 == 1) mask = torch::rand({2, 1, 1, t_k}) < 0.2;
    if (trial % 4 == 2) mask = torch::randn({t_q, t_k});
    INFO("trial " << trial << ": t_q " << t_q << ", t_k " << t_k << ", kv heads " << kv << ", d "
                  << d << ", block " << block << ", causal " << causal);
    auto options = Options().attn_mask(mask).is_causal(causal);
    auto math = F::scaled_dot_product_attention(q, k, v, options.backend(Backend::Math));
    auto chunked = F::scaled_dot_product_attention(
        q, k, v, options.backend(Backend::Chunked).block_size(block));
    // Against the float64 truth: Chunked must be as accurate as Math in float32. With queries of
    // magnitude 20 both are ~2e-5 off (the rounding of the inputs' scores), so a fixed bound
    // between the two float32 results would depend on how the machine's BLAS rounds.
    auto as_double = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
    auto options64 = options;
    if (mask.defined()) options64.attn_mask(mask.is_floating_point() ? as_double(mask) : mask);
    auto truth = F::scaled_dot_product_attention(as_double(q), as_double(k), as_double(v),
                                                 options64.backend(Backend::Math));
    const double math_error = test::max_abs_diff(math.output, truth.output);
    CHECK(test::max_abs_diff(chunked.output, truth.output) <= 2 * math_error + 2e-6);
    // Laid out like the queries: the transpose back to (B, T, H, dv) is a view.
    CHECK(chunked.output.transpose(1, 2).is_contiguous());
  }
}

TEST_CASE("chunked: gradients through strided heads and diagonal strips equal math's",
          "[chunked]") {
  torch::manual_seed(5);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  std::vector<torch::Tensor> grads[2];
  const auto upstream = torch::randn({2, 3, 150, 8}, opts);
  const auto q0 = torch::randn({2, 150, 3, 16}, opts), k0 = torch::randn({2, 170, 3, 16}, opts);
  const auto v0 = torch::randn({2, 170, 3, 8}, opts);
  for (int which = 0; which < 2; ++which) {
    auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
         v = v0.clone().requires_grad_();
    auto options =
        Options().is_causal(true).block_size(128).backend(which ? Backend::Chunked : Backend::Math);
    F::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    options)
        .output.backward(upstream);
    grads[which] = {q.grad(), k.grad(), v.grad()};
  }
  for (int i = 0; i < 3; ++i) CHECK(test::max_abs_diff(grads[0][i], grads[1][i]) < 1e-10);
}

TEST_CASE("chunked: gradients equal the math backend's", "[chunked]") {
  std::mt19937 rng(7);
  torch::manual_seed(7);
  for (int trial = 0; trial < 20; ++trial) {
    auto in = random_problem(rng, torch::kDouble);
    const bool causal = trial % 2 == 1;
    INFO("trial " << trial << ": q " << in.q.sizes() << ", k " << in.k.sizes() << ", causal "
                  << causal);
    std::vector<torch::Tensor> grads[2];
    auto upstream = torch::Tensor();
    for (int which = 0; which < 2; ++which) {
      auto q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(),
           v = in.v.clone().requires_grad_();
      auto options = Options().attn_mask(in.mask).is_causal(causal).block_size(16).backend(
          which ? Backend::Chunked : Backend::Math);
      auto out = F::scaled_dot_product_attention(q, k, v, options).output;
      if (!upstream.defined()) upstream = torch::randn_like(out);
      out.backward(upstream);
      grads[which] = {q.grad(), k.grad(), v.grad()};
    }
    for (int i = 0; i < 3; ++i) CHECK(test::max_abs_diff(grads[0][i], grads[1][i]) < 1e-10);
  }
}

TEST_CASE("chunked: fully masked queries give zeros and finite gradients", "[chunked]") {
  auto q = torch::randn({2, 2, 9, 4}, torch::requires_grad());
  auto k = torch::randn({2, 2, 9, 4}, torch::requires_grad());
  auto v = torch::randn({2, 2, 9, 3}, torch::requires_grad());
  auto mask = torch::zeros({2, 1, 9, 9}, torch::kBool);
  mask[1][0][4].fill_(true);
  auto out = F::scaled_dot_product_attention(
                 q, k, v, Options().attn_mask(mask).backend(Backend::Chunked).block_size(4))
                 .output;
  CHECK(out[1].select(1, 4).abs().sum().item<double>() == 0.0);
  out.sum().backward();
  for (const auto& t : {q, k, v}) CHECK(torch::isfinite(t.grad()).all().item<bool>());
  // More causal queries than keys: the first queries see nothing.
  auto few = F::scaled_dot_product_attention(torch::randn({6, 4}), torch::randn({2, 4}),
                                             torch::randn({2, 3}),
                                             Options().is_causal(true).backend(Backend::Chunked));
  CHECK(few.output.slice(0, 0, 4).abs().sum().item<double>() == 0.0);
  CHECK(few.output.slice(0, 4).abs().sum().item<double>() > 0.0);
}

TEST_CASE("chunked: NaN propagates, empty sequences give empty or zero outputs", "[chunked]") {
  auto q = torch::randn({5, 4}), k = torch::randn({5, 4}), v = torch::randn({5, 2});
  q[2][1] = NAN;
  auto out = F::scaled_dot_product_attention(q, k, v, Options().backend(Backend::Chunked)).output;
  CHECK(torch::isnan(out[2]).all().item<bool>());
  CHECK(torch::isfinite(out[0]).all().item<bool>());
  auto none = F::scaled_dot_product_attention(torch::randn({0, 4}), k, v,
                                              Options().backend(Backend::Chunked));
  CHECK(none.output.sizes() == torch::IntArrayRef({0, 2}));
}

TEST_CASE("chunked: Auto picks chunked for large scores and math when weights are asked for",
          "[chunked]") {
  auto q = torch::randn({1, 4, 600, 8}), k = torch::randn({1, 4, 600, 8}),
       v = torch::randn({1, 4, 600, 8});
  auto aut = F::scaled_dot_product_attention(q, k, v, Options().is_causal(true));
  auto math =
      F::scaled_dot_product_attention(q, k, v, Options().is_causal(true).backend(Backend::Math));
  CHECK(test::max_abs_diff(aut.output, math.output) < 1e-5);
  CHECK(F::scaled_dot_product_attention(q, k, v, Options().need_weights(true)).weights.defined());
  CHECK_THROWS_C10(F::scaled_dot_product_attention(
                       q, k, v, Options().need_weights(true).backend(Backend::Chunked)),
                   c10::Error,
                   "the Chunked backend computes neither attention weights nor dropout");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, k, v, Options().block_size(0)),
                   c10::ValueError, "expected block_size > 0, got 0");
}
