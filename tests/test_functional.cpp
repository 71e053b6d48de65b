#include <attention/functional.h>

#include "helpers.h"

#include <torch/torch.h>

namespace F = attention::functional;
using Options = F::ScaledDotProductAttentionOptions;

namespace {

// The plain formula, written out with unmasked softmax: softmax(Q Kᵀ scale + mask) V.
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& additive_mask, double scale) {
  auto scores = q.matmul(k.transpose(-2, -1)) * scale;
  if (additive_mask.defined()) scores = scores + additive_mask;
  return torch::softmax(scores, -1).matmul(v);
}

torch::Tensor to_additive(const torch::Tensor& bool_mask) {
  return torch::zeros(bool_mask.sizes()).masked_fill(bool_mask, -INFINITY);
}

}  // namespace

TEST_CASE("functional: equals the plain formula, with and without a scale", "[functional]") {
  auto q = torch::randn({2, 3, 5, 8}), k = torch::randn({2, 3, 7, 8}),
       v = torch::randn({2, 3, 7, 4});
  CHECK(test::max_abs_diff(F::scaled_dot_product_attention(q, k, v).output,
                           reference(q, k, v, {}, 1 / std::sqrt(8.0))) < 1e-6);
  CHECK(test::max_abs_diff(F::scaled_dot_product_attention(q, k, v, Options().scale(0.3)).output,
                           reference(q, k, v, {}, 0.3)) < 1e-6);
}

TEST_CASE("functional: bool masks (true = masked) and additive masks agree", "[functional]") {
  auto q = torch::randn({2, 3, 5, 8}), k = torch::randn({2, 3, 7, 8}),
       v = torch::randn({2, 3, 7, 4});
  auto mask = torch::rand({2, 1, 5, 7}) < 0.3;
  mask.select(-1, 0).fill_(false);  // every query keeps a key
  auto expected = reference(q, k, v, to_additive(mask), 1 / std::sqrt(8.0));
  CHECK(test::max_abs_diff(
            F::scaled_dot_product_attention(q, k, v, Options().attn_mask(mask)).output, expected) <
        1e-6);
  CHECK(test::max_abs_diff(
            F::scaled_dot_product_attention(q, k, v, Options().attn_mask(to_additive(mask))).output,
            expected) < 1e-6);
  auto bias = torch::randn({5, 7});
  CHECK(
      test::max_abs_diff(F::scaled_dot_product_attention(q, k, v, Options().attn_mask(bias)).output,
                         reference(q, k, v, bias, 1 / std::sqrt(8.0))) < 1e-6);
}

TEST_CASE("functional: causal with fewer queries than keys treats queries as the last positions",
          "[functional]") {
  auto q = torch::randn({2, 9, 4}), k = torch::randn({2, 9, 4}), v = torch::randn({2, 9, 3});
  auto full = F::scaled_dot_product_attention(q, k, v, Options().is_causal(true)).output;
  auto tail =
      F::scaled_dot_product_attention(q.slice(1, 6), k, v, Options().is_causal(true)).output;
  CHECK(test::max_abs_diff(tail, full.slice(1, 6)) < 1e-6);
}

TEST_CASE("functional: weights are returned on request and rows sum to one", "[functional]") {
  auto q = torch::randn({3, 5, 4}), k = torch::randn({3, 6, 4}), v = torch::randn({3, 6, 2});
  auto out = F::scaled_dot_product_attention(q, k, v, Options().need_weights(true));
  REQUIRE(out.weights.sizes() == torch::IntArrayRef({3, 5, 6}));
  CHECK(test::max_abs_diff(out.weights.sum(-1), torch::ones({3, 5})) < 1e-6);
  CHECK(test::max_abs_diff(out.weights.matmul(v), out.output) < 1e-6);
  CHECK_FALSE(F::scaled_dot_product_attention(q, k, v).weights.defined());
}

TEST_CASE("functional: grouped-query attention equals repeated key/value heads", "[functional]") {
  auto q = torch::randn({2, 6, 5, 8}), k = torch::randn({2, 2, 7, 8}),
       v = torch::randn({2, 2, 7, 3});
  auto mask = torch::rand({2, 6, 5, 7}) < 0.2;
  mask.select(-1, 0).fill_(false);
  auto expected =
      F::scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                      Options().attn_mask(mask))
          .output;
  auto grouped = F::scaled_dot_product_attention(q, k, v, Options().attn_mask(mask)).output;
  CHECK(test::max_abs_diff(grouped, expected) < 1e-6);
  auto mqa = F::scaled_dot_product_attention(q, k.slice(1, 0, 1), v.slice(1, 0, 1),
                                             Options().is_causal(true))
                 .output;
  CHECK(test::max_abs_diff(mqa, reference(q, k.slice(1, 0, 1).expand({2, 6, 7, 8}),
                                          v.slice(1, 0, 1).expand({2, 6, 7, 3}),
                                          to_additive(torch::ones({5, 7}, torch::kBool).triu(3)),
                                          1 / std::sqrt(8.0))) < 1e-6);
}

TEST_CASE("functional: a query whose keys are all masked gives zeros, never NaN", "[functional]") {
  auto q = torch::randn({2, 4, 8}, torch::requires_grad());
  auto k = torch::randn({2, 5, 8}, torch::requires_grad());
  auto v = torch::randn({2, 5, 3}, torch::requires_grad());
  auto mask = torch::zeros({2, 4, 5}, torch::kBool);
  mask[0][1].fill_(true);
  mask[1][3].fill_(true);
  for (const auto& m : {mask, to_additive(mask)}) {
    auto out = F::scaled_dot_product_attention(q, k, v, Options().attn_mask(m).need_weights(true));
    CHECK(torch::isfinite(out.output).all().item<bool>());
    CHECK(out.output[0][1].abs().sum().item<double>() == 0.0);
    CHECK(out.weights[1][3].abs().sum().item<double>() == 0.0);
    CHECK(test::max_abs_diff(out.output[0][0], reference(q[0][0].unsqueeze(0), k[0], v[0], {},
                                                         1 / std::sqrt(8.0))[0]) < 1e-6);
    out.output.sum().backward();
    for (const auto& t : {q, k, v}) CHECK(torch::isfinite(t.grad()).all().item<bool>());
    CHECK(q.grad()[0][1].abs().sum().item<double>() == 0.0);
    for (const auto& t : {q, k, v}) t.mutable_grad() = torch::Tensor();
  }
  // More causal queries than keys: the first queries have no key at all.
  auto out = F::scaled_dot_product_attention(torch::randn({6, 4}), torch::randn({3, 4}),
                                             torch::randn({3, 2}), Options().is_causal(true));
  CHECK(out.output.slice(0, 0, 3).abs().sum().item<double>() == 0.0);
  CHECK(out.output.slice(0, 3).abs().sum().item<double>() > 0.0);
}

TEST_CASE("functional: NaN and Inf in the input propagate without a crash", "[functional]") {
  auto q = torch::randn({4, 3}), k = torch::randn({4, 3}), v = torch::randn({4, 2});
  q[1][0] = NAN;
  auto out = F::scaled_dot_product_attention(q, k, v).output;
  CHECK(torch::isnan(out[1]).all().item<bool>());
  CHECK(torch::isfinite(out[0]).all().item<bool>());
}

TEST_CASE("functional: dropout is applied when dropout_p > 0", "[functional]") {
  auto q = torch::randn({8, 4}), k = torch::randn({8, 4}), v = torch::randn({8, 2});
  auto w =
      F::scaled_dot_product_attention(q, k, v, Options().dropout_p(0.5).need_weights(true)).weights;
  CHECK((w == 0).sum().item<int64_t>() > 0);
}

TEST_CASE("functional: bad input names the function and what was expected",
          "[functional][errors]") {
  auto q = torch::randn({2, 5, 4}), k = torch::randn({2, 6, 4}), v = torch::randn({2, 6, 3});
  const char* name = "attention::functional::scaled_dot_product_attention: ";
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, torch::randn({2, 6, 5}), v), c10::ValueError,
                   std::string(name) + "expected query and key with the same feature size");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, k, torch::randn({2, 7, 3})), c10::ValueError,
                   "expected key and value that differ only in the last dimension");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, k[0], v), c10::ValueError, "same rank");
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(torch::randn({1, 3, 5, 4}), torch::randn({1, 2, 6, 4}),
                                      torch::randn({1, 2, 6, 3})),
      c10::ValueError, "H a multiple of Hkv");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, k.to(torch::kDouble), v), c10::TypeError,
                   "of one dtype");
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(q, k, v, Options().attn_mask(torch::zeros({5, 5}))),
      c10::ValueError, "expected attn_mask broadcastable to the scores (2, 5, 6), got (5, 5)");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(
                       q, k, v, Options().attn_mask(torch::zeros({5, 6}, torch::kInt))),
                   c10::TypeError, "expected attn_mask of dtype bool (true = masked out)");
  CHECK_THROWS_C10(F::scaled_dot_product_attention(q, k, v, Options().dropout_p(1.5)),
                   c10::ValueError, "expected dropout_p in [0, 1)");
}

TEST_CASE("functional: projected_attention's direct path for tiny inputs equals the general path",
          "[functional][tiny]") {
  torch::manual_seed(31);
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (bool causal : {false, true}) {
      for (auto shapes : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
               {{6, 3}, {6, 3}},
               {{2, 5, 3}, {2, 9, 7}},
               {{1, 1, 3}, {1, 4, 7}},
               {{7, 3}, {3, 7}}}) {
        auto x_q = torch::randn(shapes.first, dtype), x_kv = torch::randn(shapes.second, dtype);
        auto w_q = torch::rand({3, 4}, dtype), w_k = torch::rand({x_kv.size(-1), 4}, dtype),
             w_v = torch::rand({x_kv.size(-1), 5}, dtype);
        INFO("x_q " << x_q.sizes() << ", x_kv " << x_kv.sizes() << ", causal " << causal);
        auto options = Options().is_causal(causal);
        torch::Tensor direct;
        {
          torch::NoGradGuard no_grad;
          direct = F::projected_attention(x_q, x_kv, w_q, w_k, w_v, options);
        }
        // Requiring a gradient forces the general path.
        auto general =
            F::projected_attention(x_q, x_kv, w_q.clone().requires_grad_(), w_k, w_v, options);
        CHECK(test::max_abs_diff(direct, general) < (dtype == torch::kFloat ? 1e-6 : 1e-12));
      }
    }
  }
}
