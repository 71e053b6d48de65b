// Eight threads calling forward on one module in eval mode get exactly the single-threaded result.

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <atomic>
#include <thread>

namespace {

void check_threads(const std::string& what, const std::function<torch::Tensor()>& forward) {
  INFO(what);
  const auto expected = forward();
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      torch::NoGradGuard no_grad;
      for (int i = 0; i < 20; ++i) {
        if (!torch::equal(forward(), expected)) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("concurrency: eight threads on one module agree with one thread", "[concurrency]") {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 40, 8}), small = torch::randn({6, 8});
  attention::SelfAttention sa(8, 4, 4);
  attention::CausalSelfAttention causal(8, 4, 4);
  attention::CrossAttention cross(8, 4, 4);
  attention::MultiHeadAttentionWrapper wrapper(8, 4, 4, 3);
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(8, 8, 2).num_kv_heads(1));
  for (auto* m : std::vector<torch::nn::Module*>{sa.get(), causal.get(), cross.get(), wrapper.get(),
                                                 mha.get()}) {
    m->eval();
  }
  check_threads("SelfAttention", [&] { return sa(x); });
  check_threads("SelfAttention, direct path", [&] { return sa(small); });
  check_threads("CausalSelfAttention", [&] { return causal(x); });
  check_threads("CrossAttention", [&] { return cross(x, x.flip(1)); });
  check_threads("MultiHeadAttentionWrapper", [&] { return wrapper(x); });
  check_threads("MultiHeadAttention", [&] { return mha(x).output; });
  auto long_x = torch::randn({1, 1100, 8});
  check_threads("MultiHeadAttention, chunked", [&] {
    return mha(long_x, attention::MultiHeadAttentionForwardOptions().backend(
                           attention::functional::Backend::Chunked))
        .output;
  });
}
