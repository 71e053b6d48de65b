// The buffers MultiHeadAttention keeps between calls: reused only when nothing else refers to
// them, never overwriting a tensor still in use, bounded by the largest call, released on
// request; and the module's results unchanged by the reuse. The fused kernels' kept tiles: the
// same results from kept and fresh memory, the pool's bound, release, concurrent callers.

#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>
#include <attention/workspace.h>

#include "helpers.h"
#include "modules/projection.h"

#include <torch/torch.h>

#include <atomic>
#include <thread>

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

TEST_CASE("Workspace refuses options a flat buffer cannot serve, and keeps the slot as it was",
          "[workspace][bad_input]") {
  Workspace workspace;
  workspace.take(0, {4}, torch::kFloat);
  CHECK_THROWS_C10(workspace.take(0, {8}, torch::TensorOptions().layout(torch::kSparse)),
                   c10::ValueError,
                   "attention::Workspace::take: expected a strided layout, got Sparse");
  CHECK_THROWS_C10(
      workspace.take(0, {1, 2, 2, 2},
                     torch::TensorOptions().memory_format(torch::MemoryFormat::ChannelsLast)),
      c10::ValueError,
      "attention::Workspace::take: expected the contiguous memory format, got ChannelsLast");
  CHECK_THROWS_C10(workspace.take(0, {4}, torch::TensorOptions().requires_grad(true)),
                   c10::ValueError,
                   "attention::Workspace::take: expected options without requires_grad");
  CHECK(workspace.bytes() == 16);
  CHECK(workspace.take(0, {4}, torch::kFloat).fill_(1.0f).sum().item<float>() == 4.0f);
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

namespace {

namespace F = attention::functional;

// A causal forward and backward on the fused Chunked kernels: the output and the three
// gradients, stacked.
torch::Tensor chunked_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           int64_t block = 256) {
  auto ql = q.detach().requires_grad_(), kl = k.detach().requires_grad_(),
       vl = v.detach().requires_grad_();
  const auto out = F::scaled_dot_product_attention(ql, kl, vl,
                                                   F::ScaledDotProductAttentionOptions()
                                                       .is_causal(true)
                                                       .backend(F::Backend::Chunked)
                                                       .block_size(block))
                       .output;
  const auto grads = torch::autograd::grad({out}, {ql, kl, vl}, {torch::ones_like(out)});
  return torch::stack({out.detach(), grads[0], grads[1], grads[2]});
}

}  // namespace

TEST_CASE("The fused kernels keep their tiles between calls, bounded, until released",
          "[workspace][chunked]") {
  torch::manual_seed(5);
  const auto q = torch::randn({2, 3, 600, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
  // How many tiles are leased at once depends on how the pool's threads interleave, so the exact
  // reuse is checked on one thread, and the pool's threads are held to one thread's share each.
  int64_t kept = 0;
  torch::Tensor first;
  test::with_threads(1, [&] {
    attention::release_kernel_workspace();
    CHECK(attention::kernel_workspace_bytes() == 0);
    first = chunked_step(q, k, v);
    kept = attention::kernel_workspace_bytes();
    // At least the backward's three 256 x 256 float tiles, at most the pool's bound.
    CHECK(kept >= 3 * 256 * 256 * 4);
    CHECK(kept <= (int64_t{32} << 20));
    CHECK(torch::equal(chunked_step(q, k, v), first));   // reused tiles change nothing
    CHECK(attention::kernel_workspace_bytes() == kept);  // and take no more memory
    attention::release_kernel_workspace();
    CHECK(attention::kernel_workspace_bytes() == 0);
    CHECK(torch::equal(chunked_step(q, k, v), first));
    // Blocks of 1024 in float need tiles above 4 MiB: used for the call, not kept.
    attention::release_kernel_workspace();
    const auto big = chunked_step(q, k, v, 1024);
    CHECK(attention::kernel_workspace_bytes() == 0);
    CHECK((big - first).abs().max().item<float>() < 1e-4);
  });
  attention::release_kernel_workspace();
  const auto pooled = chunked_step(q, k, v);
  for (int call = 0; call < 4; ++call) {
    CHECK(torch::equal(chunked_step(q, k, v), pooled));
    CHECK(attention::kernel_workspace_bytes() > 0);
    CHECK(attention::kernel_workspace_bytes() <= at::get_num_threads() * kept);
  }
}

TEST_CASE("The fused kernels' kept tiles under concurrent calls and releases",
          "[workspace][chunked][concurrency]") {
  torch::manual_seed(6);
  const auto q = torch::randn({1, 2, 700, 32}), k = torch::randn_like(q), v = torch::randn_like(q);
  const auto expected = chunked_step(q, k, v);
  std::atomic<int> mismatches{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 6; ++i) {
        if (!torch::equal(chunked_step(q, k, v), expected)) ++mismatches;
      }
    });
  }
  std::thread releaser([&] {
    while (!done) {
      attention::release_kernel_workspace();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  releaser.join();
  CHECK(mismatches == 0);
}

TEST_CASE("The training projections on huge pages equal linear, in every gradient order",
          "[workspace][multi_head_attention]") {
  torch::manual_seed(7);
  for (const bool with_bias : {true, false}) {
    INFO("bias: " << with_bias);
    const auto x = torch::randn({3, 5, 8}, torch::kDouble).requires_grad_();
    const auto w = torch::randn({6, 8}, torch::kDouble).requires_grad_();
    const auto b = with_bias ? torch::randn({6}, torch::kDouble).requires_grad_() : torch::Tensor();
    const auto upstream = torch::randn({3, 5, 6}, torch::kDouble);
    const auto ours = attention::detail::linear_large(x, w, b);
    const auto theirs = torch::nn::functional::linear(x, w, b);
    CHECK(torch::allclose(ours, theirs, 0, 1e-12));
    std::vector<torch::Tensor> inputs{x, w};
    if (with_bias) inputs.push_back(b);
    const auto g1 = torch::autograd::grad({ours}, inputs, {upstream}, true, true);
    const auto g2 = torch::autograd::grad({theirs}, inputs, {upstream}, true, true);
    for (size_t i = 0; i < inputs.size(); ++i) CHECK(torch::allclose(g1[i], g2[i], 0, 1e-12));
    // Through the first gradients (create_graph): the second ones agree too.
    const auto h1 = torch::autograd::grad({g1[0].square().sum()}, {w});
    const auto h2 = torch::autograd::grad({g2[0].square().sum()}, {w});
    CHECK(torch::allclose(h1[0], h2[0], 0, 1e-12));
  }
}

TEST_CASE("The fused backward's gradients come in the layout of their inputs",
          "[workspace][chunked]") {
  // Heads split from a (B, T, H * d) projection by a view: gradients that fold back into it
  // without a copy, equal to Math's.
  torch::manual_seed(8);
  const auto split = [](const torch::Tensor& x) { return x.view({2, 300, 4, 16}).transpose(1, 2); };
  const auto qp = torch::randn({2, 300, 64}, torch::kDouble),
             kp = torch::randn({2, 300, 64}, torch::kDouble),
             vp = torch::randn({2, 300, 64}, torch::kDouble);
  std::vector<torch::Tensor> grads[2];
  for (const auto backend : {F::Backend::Chunked, F::Backend::Math}) {
    auto q = split(qp).detach().requires_grad_(), k = split(kp).detach().requires_grad_(),
         v = split(vp).detach().requires_grad_();
    const auto out =
        F::scaled_dot_product_attention(
            q, k, v,
            F::ScaledDotProductAttentionOptions().is_causal(true).backend(backend).block_size(64))
            .output;
    grads[backend == F::Backend::Math] =
        torch::autograd::grad({out}, {q, k, v}, {torch::ones_like(out)});
  }
  for (int i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    CHECK(grads[0][i].transpose(1, 2).is_contiguous());
    CHECK(torch::allclose(grads[0][i], grads[1][i], 0, 1e-12));
  }
}
