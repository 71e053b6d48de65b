// SlidingKVCache: memory bounded by the window, decoding with a sliding-window module equal to one
// forward (the golden case rope_llama3_gqa_window_rolling_decode holds it to Python), and
// StreamingLLM's sink tokens equal to one forward with the mask they stand for.

#include <attention/multi_head_attention.h>
#include <attention/sliding_kv_cache.h>

#include "helpers.h"

#include <torch/torch.h>

namespace {

using attention::MultiHeadAttentionForwardOptions;
using attention::SlidingKVCache;

// The outputs of `mha` fed `x` (B, T, d) in chunks of `sizes` through `cache`, concatenated.
torch::Tensor decode(attention::MultiHeadAttention& mha, const torch::Tensor& x,
                     SlidingKVCache& cache, const std::vector<int64_t>& sizes) {
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (const int64_t n : sizes) {
    outputs.push_back(
        mha(x.narrow(1, start, n), MultiHeadAttentionForwardOptions().sliding_kv_cache(&cache))
            .output);
    start += n;
    CHECK(cache.position() == start);
    CHECK(cache.length() <= cache.sink_tokens() + cache.window() - 1);
  }
  return torch::cat(outputs, 1);
}

}  // namespace

TEST_CASE("sliding kv cache: a sliding-window module decodes as one forward, memory bounded",
          "[kv_cache]") {
  torch::manual_seed(91);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(16, 32, 4).num_kv_heads(2).sliding_window(6).rope(
          attention::functional::RotaryOptions()));
  const auto x = torch::randn({2, 40, 16});
  torch::NoGradGuard no_grad;
  const auto whole = mha(x).output;
  for (int64_t window : {6, 9}) {
    SlidingKVCache cache(window);
    INFO("cache window " << window);
    CHECK(test::max_abs_diff(decode(mha, x, cache, {1, 1, 7, 1, 12, 3, 15}), whole) < 1e-5);
    CHECK(cache.length() == window - 1);
    cache.reset();
    CHECK(cache.position() == 0);
    CHECK(test::max_abs_diff(decode(mha, x, cache, std::vector<int64_t>(40, 1)), whole) < 1e-5);
  }
}

TEST_CASE("sliding kv cache: sink tokens decode as one forward with the StreamingLLM mask",
          "[kv_cache]") {
  // Token by token, query p sees the first `sinks` tokens and the last `window` up to itself.
  torch::manual_seed(93);
  const int64_t t = 30, window = 5, sinks = 2;
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(8, 16, 2));
  const auto x = torch::randn({1, t, 8});
  const auto p = torch::arange(t).unsqueeze(1), j = torch::arange(t).unsqueeze(0);
  const auto hidden = (j >= sinks).logical_and(p - j >= window);  // causal is the module's
  torch::NoGradGuard no_grad;
  const auto whole = mha(x, MultiHeadAttentionForwardOptions().attn_mask(hidden)).output;
  SlidingKVCache cache(window, sinks);
  CHECK(test::max_abs_diff(decode(mha, x, cache, std::vector<int64_t>(t, 1)), whole) < 1e-5);
  CHECK(cache.length() == sinks + window - 1);
}

TEST_CASE("sliding kv cache: training reaches this step's keys, not the held ones", "[kv_cache]") {
  SlidingKVCache cache(3);
  auto k0 = torch::randn({1, 1, 4, 2}, torch::requires_grad());
  cache.append(k0, k0 * 2);
  auto k1 = torch::randn({1, 1, 1, 2}, torch::requires_grad());
  auto [keys, values] = cache.append(k1, k1);
  CHECK(keys.size(2) == 3);  // the two last tokens of the first call, then the new one
  CHECK(torch::equal(keys.narrow(2, 0, 2), k0.detach().narrow(2, 2, 2)));
  keys.sum().backward();
  CHECK(torch::equal(k1.grad(), torch::ones_like(k1)));
  CHECK(!k0.grad().defined());
}

TEST_CASE("sliding kv cache: a refused first append fixes no shape, and no call's memory is held",
          "[kv_cache][bad_input]") {
  SlidingKVCache cache(4);
  // 2^40 tokens of 4 features: the held keys cannot be made (16 TiB).
  const auto huge = torch::zeros({1, 1, 1, 4}).expand({1, 1, int64_t{1} << 40, 4});
  CHECK_THROWS_AS(cache.append(huge, huge), c10::Error);
  CHECK(cache.length() == 0);
  // A first call of another shape is the first call.
  const auto keys = torch::randn({2, 1, 3, 4}), values = torch::randn({2, 1, 3, 4});
  CHECK(cache.append(keys, values).first.sizes() == torch::IntArrayRef({2, 1, 3, 4}));
  // The parts kept are tensors of their own: the call's keys are referred to by nothing else.
  CHECK(keys.storage().use_count() == 1);
  CHECK(values.storage().use_count() == 1);
}
