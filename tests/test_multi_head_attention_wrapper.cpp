#include <attention/multi_head_attention_wrapper.h>

#include "helpers.h"
#include "module_checks.h"

#include <torch/torch.h>

using attention::MultiHeadAttentionWrapper;
using attention::SelfAttention;

TEST_CASE("MultiHeadAttentionWrapper: parameters are named heads.N.W_*", "[wrapper]") {
  MultiHeadAttentionWrapper mha(3, 2, 4, 3);
  auto params = mha->named_parameters();
  CHECK(params.size() == 9);
  for (const char* name : {"heads.0.W_query", "heads.1.W_key", "heads.2.W_value"}) {
    INFO(name);
    CHECK(params.contains(name));
  }
}

TEST_CASE("MultiHeadAttentionWrapper: equals the concatenation of separately seeded heads",
          "[wrapper]") {
  torch::manual_seed(42);
  MultiHeadAttentionWrapper mha(3, 2, 4, 3);
  torch::manual_seed(42);
  std::vector<SelfAttention> heads;
  for (int h = 0; h < 3; ++h) heads.emplace_back(3, 2, 4);
  auto x = torch::randn({2, 5, 3});
  std::vector<torch::Tensor> outputs;
  for (auto& head : heads) outputs.push_back(head(x));
  CHECK(torch::equal(mha(x), torch::cat(outputs, -1)));
}

TEST_CASE("MultiHeadAttentionWrapper: batched equals stacked, gradients, float64", "[wrapper]") {
  MultiHeadAttentionWrapper mha(3, 2, 2, 4);
  check_batched_equals_stacked([&](const torch::Tensor& x) { return mha(x); }, 3);
  check_gradients_reach_parameters(*mha, [&] { return mha(torch::randn({2, 5, 3})); });
  mha->to(torch::kDouble);
  CHECK(mha(torch::randn({4, 3}, torch::kDouble)).sizes() == torch::IntArrayRef({4, 8}));
}

TEST_CASE("MultiHeadAttentionWrapper: bad input and bad options", "[wrapper][errors]") {
  MultiHeadAttentionWrapper mha(3, 2, 4, 2);
  CHECK_THROWS_C10(
      mha(torch::rand({6, 5})), c10::ValueError,
      "attention::MultiHeadAttentionWrapper: expected input (T, 3) or (B, T, 3), got (6, 5)");
  CHECK_THROWS_C10(MultiHeadAttentionWrapper(3, 2, 4, 0), c10::ValueError,
                   "expected num_heads > 0, got 0");
  CHECK_THAT(
      c10::str(*mha),
      test::starts_with("attention::MultiHeadAttentionWrapper(d_in=3, d_out_kq=2, d_out_v=4, "
                        "num_heads=2)(\n  (heads): torch::nn::ModuleList(\n    (0): "
                        "attention::SelfAttention(d_in=3, d_out_kq=2, d_out_v=4)"));
}
