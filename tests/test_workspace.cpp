// The buffers MultiHeadAttention keeps between calls: reused only when nothing else refers to
// them, never overwriting a tensor still in use, bounded by the largest call, released on
// request; and the module's results unchanged by the reuse.

#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>
#include <attention/workspace.h>

#include "helpers.h"

#include <torch/torch.h>

using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;
using attention::Workspace;

TEST_CASE("Workspace reuses a slot's buffer only once nothing else refers to it", "[workspace]") {
  Workspace workspace;
  auto first = workspace.take(0, {4, 8}, torch::kFloat);
  const void* memory = first.data_ptr();
  first.fill_(1.0f);

  // Still held: a second take must not hand out the same memory.
  auto second = workspace.take(0, {4, 8}, torch::kFloat);
  CHECK(second.data_ptr() != memory);
  second.fill_(2.0f);
  CHECK(torch::equal(first, torch::ones({4, 8})));

  // A view keeps the memory in use as well.
  const void* second_memory = second.data_ptr();
  auto view = second.narrow(0, 1, 2);
  second = torch::Tensor();
  CHECK(workspace.take(0, {4, 8}, torch::kFloat).data_ptr() != second_memory);
  view = torch::Tensor();

  // Free: the same memory again, smaller requests included.
  const void* kept = workspace.take(0, {4, 8}, torch::kFloat).data_ptr();
  auto again = workspace.take(0, {3, 5}, torch::kFloat);
  CHECK(again.data_ptr() == kept);
  CHECK(again.sizes() == c10::IntArrayRef({3, 5}));
  CHECK(again.is_contiguous());
}

TEST_CASE("Workspace holds the largest request per slot and gives it back on release",
          "[workspace]") {
  Workspace workspace;
  workspace.take(0, {100}, torch::kFloat);
  workspace.take(1, {10}, torch::kDouble);
  CHECK(workspace.bytes() == 100 * 4 + 10 * 8);
  workspace.take(0, {50}, torch::kFloat);  // fits: no growth
  CHECK(workspace.bytes() == 100 * 4 + 10 * 8);
  workspace.take(1, {10}, torch::kFloat);  // another dtype: a new buffer of its own size
  CHECK(workspace.bytes() == 100 * 4 + 10 * 4);

  auto held = workspace.take(0, {100}, torch::kFloat).fill_(3.0f);
  workspace.release();
  CHECK(workspace.bytes() == 0);
  CHECK(torch::equal(held, torch::full({100}, 3.0f)));  // still valid after release
}

TEST_CASE("MultiHeadAttention in inference: the reused projections change no result",
          "[workspace][multi_head_attention]") {
  torch::manual_seed(3);
  auto mha = MultiHeadAttention(MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2));
  const auto x = torch::randn({2, 9, 16}), y = torch::randn({2, 9, 16});
  torch::NoGradGuard no_grad;

  const auto first = mha(x).output;
  const auto first_copy = first.clone();
  const int64_t expected_bytes = (2 * 9 * 16 + 2 * (2 * 9 * 8)) * 4;  // queries, keys, values
  CHECK(mha->workspace().bytes() == expected_bytes);
  const auto other = mha(y).output;
  CHECK(mha->workspace().bytes() == expected_bytes);  // reused, not grown
  CHECK(torch::equal(first, first_copy));             // the earlier output is untouched
  CHECK(torch::equal(mha(x).output, first));          // and the same input gives it again
  CHECK_FALSE(torch::equal(other, first));

  // Decoding token by token through a KV cache equals the one-shot forward.
  attention::KVCache cache(9);
  std::vector<torch::Tensor> steps;
  for (int64_t t = 0; t < 9; ++t) {
    steps.push_back(
        mha(x.narrow(1, t, 1), MultiHeadAttentionForwardOptions().kv_cache(&cache)).output);
  }
  CHECK(torch::allclose(torch::cat(steps, 1), first, 1e-5, 1e-6));

  const auto copy = std::dynamic_pointer_cast<attention::MultiHeadAttentionImpl>(mha->clone());
  CHECK(copy->workspace().bytes() == 0);  // a clone shares no buffer
  mha->release_workspace();
  CHECK(mha->workspace().bytes() == 0);
  CHECK(torch::equal(mha(x).output, first));
}

TEST_CASE("MultiHeadAttention in training takes no workspace: autograd keeps its projections",
          "[workspace][multi_head_attention]") {
  torch::manual_seed(4);
  auto mha = MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2));
  const auto x = torch::randn({1, 5, 8});
  mha(x).output.sum().backward();
  CHECK(mha->workspace().bytes() == 0);
  const auto grad = mha->W_query->weight.grad().clone();
  mha->zero_grad();
  {
    torch::NoGradGuard no_grad;
    mha(torch::randn({1, 5, 8}));  // an inference call in between
  }
  mha(x).output.sum().backward();
  CHECK(torch::equal(mha->W_query->weight.grad(), grad));
}
