#include <attention/self_attention.h>

#include "helpers.h"
#include "module_checks.h"

#include <torch/torch.h>

using attention::SelfAttention;

TEST_CASE("SelfAttention: parameter names, shapes and the article's initialization order",
          "[self_attention]") {
  torch::manual_seed(7);
  SelfAttention sa(5, 3, 4);
  auto params = sa->named_parameters();
  REQUIRE(params.size() == 3);
  CHECK(params["W_query"].sizes() == torch::IntArrayRef({5, 3}));
  CHECK(params["W_key"].sizes() == torch::IntArrayRef({5, 3}));
  CHECK(params["W_value"].sizes() == torch::IntArrayRef({5, 4}));
  torch::manual_seed(7);
  auto q = torch::rand({5, 3}), k = torch::rand({5, 3}), v = torch::rand({5, 4});
  CHECK(torch::equal(sa->W_query, q));
  CHECK(torch::equal(sa->W_key, k));
  CHECK(torch::equal(sa->W_value, v));
}

TEST_CASE("SelfAttention: forward is softmax(Q K^T / sqrt(d_out_kq)) V", "[self_attention]") {
  SelfAttention sa(4, 3, 2);
  auto x = torch::randn({7, 4});
  auto q = x.matmul(sa->W_query), k = x.matmul(sa->W_key), v = x.matmul(sa->W_value);
  auto expected = torch::softmax(q.matmul(k.t()) / std::sqrt(3.0), -1).matmul(v);
  CHECK(test::max_abs_diff(sa(x), expected) < 1e-6);
}

TEST_CASE("SelfAttention: batched output equals the stacked unbatched outputs",
          "[self_attention]") {
  SelfAttention sa(3, 2, 4);
  check_batched_equals_stacked([&](const torch::Tensor& x) { return sa(x); }, 3);
}

TEST_CASE("SelfAttention: gradients reach every parameter", "[self_attention]") {
  SelfAttention sa(3, 2, 4);
  check_gradients_reach_parameters(*sa, [&] { return sa(torch::randn({2, 5, 3})); });
}

TEST_CASE("SelfAttention: float64 parameters take float64 input", "[self_attention]") {
  SelfAttention sa(3, 2, 4);
  sa->to(torch::kDouble);
  auto x = torch::randn({5, 3}, torch::kDouble);
  auto out = sa(x);
  CHECK(out.scalar_type() == torch::kDouble);
  CHECK(test::max_abs_diff(
            out, torch::softmax(
                     x.matmul(sa->W_query).matmul(x.matmul(sa->W_key).t()) / std::sqrt(2.0), -1)
                     .matmul(x.matmul(sa->W_value))) < 1e-12);
}

TEST_CASE("SelfAttention: clone is deep and pretty_print names the options", "[self_attention]") {
  SelfAttention sa(3, 2, 4);
  auto copy = std::dynamic_pointer_cast<attention::SelfAttentionImpl>(sa->clone());
  REQUIRE(copy);
  CHECK(torch::equal(copy->W_query, sa->W_query));
  copy->W_query.data().add_(1.0);
  CHECK_FALSE(torch::equal(copy->W_query, sa->W_query));
  CHECK(c10::str(*sa) == "attention::SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)");
}

TEST_CASE("SelfAttention: bad input names the module, the expected and the actual shape",
          "[self_attention][errors]") {
  SelfAttention sa(3, 2, 4);
  CHECK_THROWS_C10(sa(torch::rand({6, 4})), c10::ValueError,
                   "attention::SelfAttention: expected input (T, 3) or (B, T, 3), got (6, 4)");
  CHECK_THROWS_C10(sa(torch::rand({6})), c10::ValueError, "got (6,)");
  CHECK_THROWS_C10(sa(torch::rand({1, 2, 6, 3})), c10::ValueError, "got (1, 2, 6, 3)");
  CHECK_THROWS_C10(sa(torch::Tensor()), c10::ValueError, "defined tensor");
  CHECK_THROWS_C10(sa(torch::rand({6, 3}, torch::kDouble)), c10::TypeError,
                   "expected input of dtype Float (the parameters' dtype), got Double");
  CHECK_THROWS_C10(SelfAttention(0, 2, 4), c10::ValueError, "expected d_in > 0, got 0");
  CHECK_THROWS_C10(SelfAttention(3, 2, -1), c10::ValueError, "expected d_out_v > 0, got -1");
}
