#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>

#include "helpers.h"

#include <torch/torch.h>

using attention::KVCache;
using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;

namespace {

// Feeds x through the cache in chunks of `chunk` tokens and concatenates the outputs.
torch::Tensor incremental(MultiHeadAttention& mha, const torch::Tensor& x, int64_t chunk,
                          KVCache& cache) {
  std::vector<torch::Tensor> outputs;
  for (int64_t start = 0; start < x.size(1); start += chunk) {
    const int64_t n = std::min(chunk, x.size(1) - start);
    outputs.push_back(
        mha(x.narrow(1, start, n), MultiHeadAttentionForwardOptions().kv_cache(&cache)).output);
  }
  return torch::cat(outputs, 1);
}

}  // namespace

TEST_CASE("KVCache: token by token and in chunks equals one causal forward", "[kv_cache]") {
  torch::NoGradGuard no_grad;
  for (int64_t kv_heads : {4, 2, 1}) {
    MultiHeadAttention mha(
        MultiHeadAttentionOptions(12, 16, 4).num_kv_heads(kv_heads).qkv_bias(true));
    auto x = torch::randn({3, 11, 12});
    auto full = mha(x).output;
    for (int64_t chunk : {1, 3, 4, 11}) {
      INFO("num_kv_heads " << kv_heads << ", chunk " << chunk);
      KVCache cache(16);
      CHECK(test::max_abs_diff(incremental(mha, x, chunk, cache), full) < 1e-5);
      CHECK(cache.length() == 11);
    }
  }
}

TEST_CASE("KVCache: reset empties it and keeps working, with length and storage", "[kv_cache]") {
  torch::NoGradGuard no_grad;
  MultiHeadAttention mha(8, 8, 2);
  KVCache cache(8);
  CHECK(cache.length() == 0);
  CHECK_FALSE(cache.keys().defined());
  auto x = torch::randn({2, 5, 8});
  incremental(mha, x, 2, cache);
  CHECK(cache.length() == 5);
  CHECK(cache.keys().sizes() == torch::IntArrayRef({2, 2, 5, 4}));
  const void* storage = cache.keys().data_ptr();
  cache.reset();
  CHECK(cache.length() == 0);
  auto again = incremental(mha, x, 5, cache);
  CHECK(cache.keys().data_ptr() == storage);
  CHECK(test::max_abs_diff(again, mha(x).output) < 1e-5);
}

TEST_CASE("KVCache: refuses to overflow and to mix shapes, with a clear error",
          "[kv_cache][errors]") {
  KVCache cache(4);
  auto k = torch::randn({1, 2, 3, 4});
  cache.append(k, k);
  CHECK_THROWS_C10(cache.append(k, k), c10::ValueError,
                   "attention::KVCache: cannot append 3 token(s) to the 3 cached: max_length is 4");
  CHECK(cache.length() == 3);
  CHECK_THROWS_C10(cache.append(torch::randn({2, 2, 1, 4}), torch::randn({2, 2, 1, 4})),
                   c10::ValueError,
                   "expected keys (1, 2, T, 4) like the cached ones, got (2, 2, 1, 4)");
  CHECK_THROWS_C10(cache.append(k.narrow(2, 0, 1), torch::randn({1, 2, 2, 4})), c10::ValueError,
                   "expected keys and values of one shape");
  auto d = torch::randn({1, 2, 1, 4}, torch::kDouble);
  CHECK_THROWS_C10(cache.append(d, d), c10::TypeError, "expected keys and values of dtype Float");
  CHECK_THROWS_C10(KVCache(0), c10::ValueError, "expected max_length > 0, got 0");
  CHECK_THROWS_C10(cache.truncate(4), c10::ValueError, "cannot truncate to 4 tokens: 3 are cached");
  cache.truncate(1);
  CHECK(cache.length() == 1);
  CHECK(torch::equal(cache.keys(), k.narrow(2, 0, 1)));

  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).context_length(6));
  KVCache long_cache(10);
  torch::NoGradGuard no_grad;
  mha(torch::randn({1, 4, 8}), MultiHeadAttentionForwardOptions().kv_cache(&long_cache));
  CHECK_THROWS_C10(
      mha(torch::randn({1, 3, 8}), MultiHeadAttentionForwardOptions().kv_cache(&long_cache)),
      c10::ValueError, "expected at most context_length = 6 keys, got 7");
}

TEST_CASE("KVCache: a refused first append leaves the cache empty and free for another shape",
          "[kv_cache][errors]") {
  KVCache cache(4);
  auto too_long = torch::randn({1, 2, 5, 4});
  CHECK_THROWS_C10(cache.append(too_long, too_long), c10::ValueError,
                   "cannot append 5 token(s) to the 0 cached: max_length is 4");
  CHECK_FALSE(cache.keys().defined());
  CHECK(cache.length() == 0);
  // Nothing was fixed by the refused call: another batch size and head size are accepted.
  auto fits = torch::randn({3, 1, 2, 8});
  cache.append(fits, fits);
  CHECK(cache.keys().sizes() == torch::IntArrayRef({3, 1, 2, 8}));
}

TEST_CASE("KVCache: views handed out show later writes after truncate and reset, clones do not",
          "[kv_cache]") {
  KVCache cache(6);
  const auto ones = torch::ones({1, 1, 4, 2}), twos = torch::full({1, 1, 2, 2}, 2.0);
  const auto view = cache.append(ones, ones).first;  // positions 0-3
  const auto snapshot = view.clone();
  cache.truncate(2);
  cache.append(twos, twos);  // writes positions 2-3 again
  CHECK(torch::equal(view.narrow(2, 0, 2), ones.narrow(2, 0, 2)));
  CHECK(torch::equal(view.narrow(2, 2, 2), twos));  // as the header says: not a snapshot
  CHECK(torch::equal(snapshot, ones));
  cache.reset();
  cache.append(twos, twos);
  CHECK(torch::equal(view.narrow(2, 0, 2), twos));
  const auto outlives = cache.keys();
  { KVCache gone = std::move(cache); }
  CHECK(torch::equal(outlives, twos));  // the storage lives as long as a view of it
}

TEST_CASE("KVCache: in training the gradient reaches the new keys and values, not the cached",
          "[kv_cache]") {
  torch::manual_seed(5);
  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).num_kv_heads(1));
  const auto x = torch::randn({2, 5, 8});
  const auto upstream = torch::randn({2, 5, 8});

  // From an empty cache, the same gradients as without a cache.
  mha(x).output.backward(upstream);
  const auto key_grad = mha->W_key->weight.grad().clone();
  const auto value_grad = mha->W_value->weight.grad().clone();
  mha->zero_grad();
  KVCache cache(10);
  mha(x, MultiHeadAttentionForwardOptions().kv_cache(&cache)).output.backward(upstream);
  CHECK(torch::allclose(mha->W_key->weight.grad(), key_grad, 1e-5, 1e-6));
  CHECK(torch::allclose(mha->W_value->weight.grad(), value_grad, 1e-5, 1e-6));

  // A second step: its own keys and values get a gradient; the cached five are constants. The
  // same as attending over [cached, new] with the cached part detached, written out here with
  // the module's own projections.
  mha->zero_grad();
  const auto next = torch::randn({2, 1, 8});
  const auto out = mha(next, MultiHeadAttentionForwardOptions().kv_cache(&cache)).output;
  out.sum().backward();
  const auto step_key_grad = mha->W_key->weight.grad().clone();
  CHECK(cache.length() == 6);
  mha->zero_grad();
  {
    const auto past_k = mha->W_key(x).detach(), past_v = mha->W_value(x).detach();
    const auto k = torch::cat({past_k, mha->W_key(next)}, 1).view({2, 6, 1, 4}).transpose(1, 2);
    const auto v = torch::cat({past_v, mha->W_value(next)}, 1).view({2, 6, 1, 4}).transpose(1, 2);
    const auto q = mha->W_query(next).view({2, 1, 2, 4}).transpose(1, 2);
    const auto weights = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / 2.0, -1);
    const auto context = torch::matmul(weights, v).transpose(1, 2).reshape({2, 1, 8});
    mha->out_proj(context).sum().backward();
  }
  CHECK(torch::allclose(step_key_grad, mha->W_key->weight.grad(), 1e-5, 1e-6));
}
