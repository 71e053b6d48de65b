#include <attention/causal_self_attention.h>

#include "helpers.h"
#include "module_checks.h"

#include <torch/torch.h>

using attention::CausalSelfAttention;
using attention::CausalSelfAttentionOptions;

TEST_CASE("CausalSelfAttention: same parameters and seed as SelfAttention", "[causal]") {
  torch::manual_seed(3);
  CausalSelfAttention causal(4, 3, 5);
  torch::manual_seed(3);
  auto q = torch::rand({4, 3}), k = torch::rand({4, 3}), v = torch::rand({4, 5});
  CHECK(torch::equal(causal->named_parameters()["W_query"], q));
  CHECK(torch::equal(causal->named_parameters()["W_key"], k));
  CHECK(torch::equal(causal->named_parameters()["W_value"], v));
}

TEST_CASE("CausalSelfAttention: row t does not change when inputs after t change", "[causal]") {
  CausalSelfAttention causal(3, 2, 4);
  auto x = torch::randn({2, 7, 3});
  auto base = causal(x);
  for (int64_t t = 0; t < 7; ++t) {
    auto changed = x.clone();
    changed.slice(1, t + 1) += torch::randn_like(changed.slice(1, t + 1)) * 5;
    auto out = causal(changed);
    INFO("t = " << t);
    CHECK(test::max_abs_diff(out.slice(1, 0, t + 1), base.slice(1, 0, t + 1)) == 0.0);
    if (t + 1 < 7) CHECK(test::max_abs_diff(out.slice(1, t + 1), base.slice(1, t + 1)) > 0.0);
  }
}

TEST_CASE("CausalSelfAttention: the first token sees only itself, and T = 1 works", "[causal]") {
  CausalSelfAttention causal(3, 2, 4);
  auto x = torch::randn({5, 3});
  CHECK(test::max_abs_diff(causal(x)[0], x[0].matmul(causal->W_value)) < 1e-6);
  auto one = torch::randn({1, 3});
  CHECK(test::max_abs_diff(causal(one), one.matmul(causal->W_value)) < 1e-6);
}

TEST_CASE("CausalSelfAttention: dropout acts in training mode only", "[causal]") {
  CausalSelfAttention causal(CausalSelfAttentionOptions(3, 2, 4).dropout(0.5));
  auto x = torch::randn({2, 6, 3});
  causal->eval();
  auto a = causal(x), b = causal(x);
  CHECK(torch::equal(a, b));
  causal->train();
  torch::manual_seed(1);
  auto c = causal(x);
  CHECK(test::max_abs_diff(c, a) > 1e-3);
  CHECK_THROWS_C10(CausalSelfAttention(CausalSelfAttentionOptions(3, 2, 4).dropout(1.0)),
                   c10::ValueError, "expected dropout in [0, 1), got 1");
}

TEST_CASE("CausalSelfAttention: batched equals stacked, gradients, float64", "[causal]") {
  CausalSelfAttention causal(3, 2, 4);
  check_batched_equals_stacked([&](const torch::Tensor& x) { return causal(x); }, 3);
  check_gradients_reach_parameters(*causal, [&] { return causal(torch::randn({2, 5, 3})); });
  causal->to(torch::kDouble);
  CHECK(causal(torch::randn({4, 3}, torch::kDouble)).scalar_type() == torch::kDouble);
}

TEST_CASE("CausalSelfAttention: bad input", "[causal][errors]") {
  CausalSelfAttention causal(3, 2, 4);
  CHECK_THROWS_C10(
      causal(torch::rand({6, 2})), c10::ValueError,
      "attention::CausalSelfAttention: expected input (T, 3) or (B, T, 3), got (6, 2)");
  CHECK_THROWS_C10(causal(torch::rand({6, 3}, torch::kDouble)), c10::TypeError, "got Double");
}
