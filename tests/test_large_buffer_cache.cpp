// The cache of large temporaries: memory handed out again only once its tensor is gone, kept
// within its limit (the longest-kept buffers going first), let go on request (buffers in use then
// are freed, not kept, when their tensors go), and a training step's results and gradients the
// same from kept memory as from fresh.

#include <attention/multi_head_attention.h>
#include <attention/workspace.h>

#include "helpers.h"
#include "memory/empty_large.h"

#include <torch/torch.h>

#include <atomic>
#include <thread>

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A float tensor of `mib` MiB from the cache.
torch::Tensor large(int64_t mib) {
  return attention::detail::empty_large({mib * kMiB / 4}, torch::kFloat);
}

// Restores the default limit and an empty cache around a test.
struct FreshCache {
  FreshCache() { reset(); }
  ~FreshCache() { reset(); }
  static void reset() {
    attention::set_large_buffer_cache_limit(attention::kDefaultLargeBufferCacheLimit);
    attention::release_large_buffer_cache();
  }
};

}  // namespace

TEST_CASE("The large-buffer cache hands memory out again only once its tensor is gone",
          "[large_buffer_cache]") {
  FreshCache fresh;
  CHECK(attention::large_buffer_cache_limit() == attention::kDefaultLargeBufferCacheLimit);
  auto a = large(8);
  const void* memory = a.data_ptr();
  a.fill_(1.0f);
  CHECK(attention::large_buffer_cache_bytes() == 0);

  auto b = large(8);  // a is still in use
  CHECK(b.data_ptr() != memory);
  CHECK(torch::all(a == 1.0f).item<bool>());

  a = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  auto c = large(8);
  CHECK(c.data_ptr() == memory);  // kept and handed out again
  CHECK(attention::large_buffer_cache_bytes() == 0);

  // Sizes are rounded up to 2 MiB: 9 MiB takes 10 MiB, and 8 MiB memory does not fit it.
  c = torch::Tensor();
  auto d = large(9);
  CHECK(d.data_ptr() != memory);
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  d = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 18 * kMiB);

  // A view keeps the memory in use.
  auto e = large(10);
  auto view = e.narrow(0, 0, 16);
  e = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  view = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 18 * kMiB);

  // Small tensors and other devices are not the cache's.
  const auto small = attention::detail::empty_large({1024}, torch::kFloat);
  CHECK(attention::large_buffer_cache_bytes() == 18 * kMiB);
}

TEST_CASE("The large-buffer cache keeps at most its limit, the longest-kept buffers going first",
          "[large_buffer_cache]") {
  FreshCache fresh;
  attention::set_large_buffer_cache_limit(20 * kMiB);
  auto a = large(8), b = large(8), c = large(8);
  const void* newest = c.data_ptr();
  a = torch::Tensor();
  b = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 16 * kMiB);
  c = torch::Tensor();  // a goes to make room
  CHECK(attention::large_buffer_cache_bytes() == 16 * kMiB);
  auto d = large(8);
  CHECK(d.data_ptr() == newest);  // the newest kept buffer first

  // A lower limit frees what is idle beyond it now.
  attention::set_large_buffer_cache_limit(10 * kMiB);
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  // A buffer above the limit is never kept.
  auto big = large(12);
  big = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  // Limit 0: nothing is kept.
  attention::set_large_buffer_cache_limit(0);
  CHECK(attention::large_buffer_cache_bytes() == 0);
  d = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 0);
}

TEST_CASE("Releasing the large-buffer cache frees what is idle and, later, what was in use",
          "[large_buffer_cache]") {
  FreshCache fresh;
  auto a = large(8), b = large(8);
  a = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
  attention::release_large_buffer_cache();
  CHECK(attention::large_buffer_cache_bytes() == 0);
  b = torch::Tensor();  // in use during the release: freed, not kept
  CHECK(attention::large_buffer_cache_bytes() == 0);
  auto c = large(8);  // taken after it: kept again
  c = torch::Tensor();
  CHECK(attention::large_buffer_cache_bytes() == 8 * kMiB);
}

TEST_CASE("A training step from kept memory equals one from fresh memory",
          "[large_buffer_cache][multi_head_attention]") {
  FreshCache fresh;
  torch::manual_seed(11);
  // Projections of (2, 1024, 1024) floats: 8 MiB each, from the cache.
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(1024, 1024, 8));
  const auto x = torch::randn({2, 1024, 1024}, torch::requires_grad());
  const auto upstream = torch::randn({2, 1024, 1024});
  const auto step = [&] {
    mha->zero_grad();
    x.mutable_grad() = torch::Tensor();
    const auto out = mha(x).output;
    out.backward(upstream);
    return std::vector<torch::Tensor>{out.detach().clone(), x.grad().clone(),
                                      mha->W_query->weight.grad().clone(),
                                      mha->out_proj->weight.grad().clone()};
  };
  attention::set_large_buffer_cache_limit(0);
  // The process's first step is left out of the comparison: on two threads of an AMD Zen 3 it
  // differs from every later step in the last bits (2e-7 of 1.3 in the output), whatever memory
  // it runs in, and with one thread it does not; kept memory is compared with a fresh step that
  // is not the first.
  step();
  const auto fresh_step = step();
  CHECK(attention::large_buffer_cache_bytes() == 0);
  attention::set_large_buffer_cache_limit(attention::kDefaultLargeBufferCacheLimit);
  step();  // fills the cache
  const int64_t kept = attention::large_buffer_cache_bytes();
  CHECK(kept >= 4 * 8 * kMiB);  // at least the four projections
  // Poisoned kept memory: every value a step reads must be one it wrote.
  {
    std::vector<torch::Tensor> held;
    for (int64_t i = 0; i < kept / (8 * kMiB); ++i) held.push_back(large(8).fill_(NAN));
    CHECK(attention::large_buffer_cache_bytes() == 0);  // all of it poisoned
  }
  const auto reused = step();
  CHECK(attention::large_buffer_cache_bytes() == kept);  // and no more memory
  for (size_t i = 0; i < reused.size(); ++i) {
    INFO(i);
    CHECK(torch::equal(reused[i], fresh_step[i]));
  }
}

TEST_CASE("The large-buffer cache under concurrent steps and releases",
          "[large_buffer_cache][concurrency]") {
  FreshCache fresh;
  std::atomic<int> mismatches{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto a = large(8).fill_(static_cast<float>(t));
        auto b = large(8).fill_(static_cast<float>(i));
        if (!torch::all(a == static_cast<float>(t)).item<bool>()) ++mismatches;
        if (!torch::all(b == static_cast<float>(i)).item<bool>()) ++mismatches;
      }
    });
  }
  std::thread releaser([&] {
    while (!done) {
      attention::release_large_buffer_cache();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  releaser.join();
  CHECK(mismatches == 0);
  CHECK(attention::large_buffer_cache_bytes() <= attention::large_buffer_cache_limit());
}
