#include <attention/cross_attention.h>

#include "helpers.h"
#include "module_checks.h"

#include <torch/torch.h>

using attention::CrossAttention;
using attention::CrossAttentionOptions;

TEST_CASE("CrossAttention: another length and another width for x_2", "[cross]") {
  torch::manual_seed(11);
  CrossAttention cross(CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  CHECK(cross->W_query.sizes() == torch::IntArrayRef({3, 2}));
  CHECK(cross->W_key.sizes() == torch::IntArrayRef({5, 2}));
  CHECK(cross->W_value.sizes() == torch::IntArrayRef({5, 4}));
  torch::manual_seed(11);
  auto q = torch::rand({3, 2}), k = torch::rand({5, 2}), v = torch::rand({5, 4});
  CHECK((torch::equal(cross->W_query, q) && torch::equal(cross->W_key, k) &&
         torch::equal(cross->W_value, v)));

  auto x_1 = torch::randn({2, 6, 3}), x_2 = torch::randn({2, 9, 5});
  auto out = cross(x_1, x_2);
  CHECK(out.sizes() == torch::IntArrayRef({2, 6, 4}));
  auto expected =
      torch::softmax(x_1.matmul(q).matmul(x_2.matmul(k).transpose(1, 2)) / std::sqrt(2.0), -1)
          .matmul(x_2.matmul(v));
  CHECK(test::max_abs_diff(out, expected) < 1e-6);
}

TEST_CASE("CrossAttention: with x_2 = x_1 it is SelfAttention", "[cross]") {
  CrossAttention cross(3, 2, 4);
  auto x = torch::randn({6, 3});
  auto q = x.matmul(cross->W_query), k = x.matmul(cross->W_key);
  auto expected =
      torch::softmax(q.matmul(k.t()) / std::sqrt(2.0), -1).matmul(x.matmul(cross->W_value));
  CHECK(test::max_abs_diff(cross(x, x), expected) < 1e-6);
}

TEST_CASE("CrossAttention: batched equals stacked, gradients reach every parameter", "[cross]") {
  CrossAttention cross(CrossAttentionOptions(3, 2, 4).d_in_kv(2));
  auto x_2 = torch::randn({3, 4, 2});
  auto batch = torch::randn({3, 5, 3});
  auto batched = cross(batch, x_2);
  std::vector<torch::Tensor> items;
  for (int64_t b = 0; b < 3; ++b) items.push_back(cross(batch[b], x_2[b]));
  CHECK(test::max_abs_diff(batched, torch::stack(items)) < 1e-6);
  check_gradients_reach_parameters(*cross, [&] { return cross(batch, x_2); });
}

TEST_CASE("CrossAttention: bad input", "[cross][errors]") {
  CrossAttention cross(CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  CHECK_THROWS_C10(
      cross(torch::rand({2, 6, 3}), torch::rand({3, 8, 5})), c10::ValueError,
      "expected x_1 and x_2 with the same batch size, got x_1 (2, 6, 3) and x_2 (3, 8, 5)");
  CHECK_THROWS_C10(cross(torch::rand({6, 3}), torch::rand({3, 8, 5})), c10::ValueError,
                   "same batch size");
  CHECK_THROWS_C10(cross(torch::rand({6, 3}), torch::rand({8, 3})), c10::ValueError,
                   "attention::CrossAttention: expected x_2 (T, 5) or (B, T, 5), got (8, 3)");
  CHECK_THROWS_C10(cross(torch::rand({6, 4}), torch::rand({8, 5})), c10::ValueError,
                   "expected x_1 (T, 3) or (B, T, 3), got (6, 4)");
  CHECK_THROWS_C10(cross(torch::rand({6, 3}), torch::rand({8, 5}, torch::kDouble)), c10::TypeError,
                   "expected x_2 of dtype Float");
  CHECK(c10::str(*cross) == "attention::CrossAttention(d_in=3, d_out_kq=2, d_out_v=4, d_in_kv=5)");
}
