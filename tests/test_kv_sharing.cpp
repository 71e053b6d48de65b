// Cross-layer KV sharing (SharedKV): a reading layer attends to its producing layer's keys and
// values. Python's numbers for the book's layers are the golden cases kv_sharing_*
// (test_golden.cpp); here what sharing means on the library's own terms: the cache is not copied,
// a reader holding the producer's key and value weights is the producer's attention, positions
// continue under rotary embeddings, gradients reach the producer, and refusals change nothing.

#include <attention/multi_head_attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <vector>

namespace {

using attention::KVCache;
using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;
using attention::SharedKV;
using test::max_abs_diff;

MultiHeadAttentionForwardOptions producing(SharedKV* shared, KVCache* cache = nullptr) {
  return MultiHeadAttentionForwardOptions().share_kv(shared).kv_cache(cache);
}

MultiHeadAttentionForwardOptions reading(const SharedKV* shared) {
  return MultiHeadAttentionForwardOptions().shared_kv(shared);
}

// A producer and a reader with residual connections over x, in chunks through the producer's
// cache (none: one call without a cache).
torch::Tensor two_layers(MultiHeadAttention& producer, MultiHeadAttention& reader,
                         const torch::Tensor& x, const std::vector<int64_t>& chunks = {}) {
  const auto step = [&](torch::Tensor h, KVCache* cache) {
    SharedKV shared;
    h = h + producer(h, producing(&shared, cache)).output;
    return h + reader(h, reading(&shared)).output;
  };
  if (chunks.empty()) return step(x, nullptr);
  KVCache cache(x.size(1));
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (const int64_t n : chunks) {
    outputs.push_back(step(x.narrow(1, start, n), &cache));
    start += n;
  }
  return torch::cat(outputs, 1);
}

}  // namespace

TEST_CASE("KV sharing: the reader reads the producer's cache in place", "[kv_sharing]") {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  MultiHeadAttention producer(MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2));
  MultiHeadAttention reader(MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2));
  KVCache cache(12);
  SharedKV shared;
  const auto x = torch::randn({2, 5, 16});
  producer(x, producing(&shared, &cache));
  REQUIRE(shared.keys.sizes() == torch::IntArrayRef({2, 2, 5, 4}));
  CHECK(shared.keys.data_ptr() == cache.keys().data_ptr());
  CHECK(shared.values.data_ptr() == cache.values().data_ptr());
  // A reader with the producer's key and value weights is the producer's attention.
  reader->W_key->weight.copy_(producer->W_key->weight);
  reader->W_value->weight.copy_(producer->W_value->weight);
  const auto next = torch::randn({2, 1, 16});
  producer(next, producing(&shared, &cache));
  CHECK(shared.keys.size(2) == 6);
  KVCache own(12);
  reader(x, MultiHeadAttentionForwardOptions().kv_cache(&own));
  const auto expected = reader(next, MultiHeadAttentionForwardOptions().kv_cache(&own)).output;
  CHECK(max_abs_diff(reader(next, reading(&shared)).output, expected) < 1e-6);
}

TEST_CASE("KV sharing: decoding in chunks equals one forward, rotary positions included",
          "[kv_sharing]") {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  auto options = MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2).rope(
      attention::functional::RotaryOptions().theta(10000.0));
  MultiHeadAttention producer(options), reader(options);
  producer->to(torch::kDouble);
  reader->to(torch::kDouble);
  const auto x = torch::randn({2, 23, 16}, torch::kDouble);
  const auto whole = two_layers(producer, reader, x);
  CHECK(max_abs_diff(two_layers(producer, reader, x, {1, 9, 1, 12}), whole) < 1e-12);
  CHECK(max_abs_diff(two_layers(producer, reader, x, std::vector<int64_t>(23, 1)), whole) < 1e-12);
}

TEST_CASE("KV sharing: in training the reader's loss reaches the producer's key weights",
          "[kv_sharing]") {
  torch::manual_seed(3);
  MultiHeadAttention producer(MultiHeadAttentionOptions(8, 8, 2));
  MultiHeadAttention reader(MultiHeadAttentionOptions(8, 8, 2));
  SharedKV shared;
  const auto x = torch::randn({2, 6, 8});
  producer(x, producing(&shared));
  reader(x, reading(&shared)).output.sum().backward();
  CHECK(producer->W_key->weight.grad().abs().sum().item<double>() > 0.0);
  CHECK(producer->W_value->weight.grad().abs().sum().item<double>() > 0.0);
  // The reader's own key and value weights take no part.
  CHECK_FALSE(reader->W_key->weight.grad().defined());
  CHECK(reader->W_query->weight.grad().abs().sum().item<double>() > 0.0);
}

TEST_CASE("KV sharing: an 8-bit producer shares what its codes stand for", "[kv_sharing]") {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  MultiHeadAttention producer(MultiHeadAttentionOptions(16, 16, 4));
  MultiHeadAttention reader(MultiHeadAttentionOptions(16, 16, 4));
  const auto x = torch::randn({1, 9, 16});
  KVCache codes(9, torch::kChar), floats(9);
  SharedKV from_codes, from_floats;
  producer(x, producing(&from_codes, &codes));
  producer(x, producing(&from_floats, &floats));
  CHECK(from_codes.keys.scalar_type() == torch::kFloat);
  const auto exact = reader(x, reading(&from_floats)).output;
  const double error = max_abs_diff(reader(x, reading(&from_codes)).output, exact);
  CHECK(error > 0.0);
  CHECK(error < 0.02 * exact.abs().max().item<double>());
}

TEST_CASE("KV sharing: a refused reader or producer changes nothing", "[kv_sharing]") {
  torch::manual_seed(5);
  MultiHeadAttention producer(MultiHeadAttentionOptions(8, 8, 2).context_length(6));
  KVCache cache(8);
  SharedKV shared;
  const auto x = torch::randn({1, 4, 8});
  producer(x, producing(&shared, &cache));
  const auto keys = shared.keys;
  // Past the context length: refused after the append, which is rolled back.
  CHECK_THROWS_C10(producer(torch::randn({1, 3, 8}), producing(&shared, &cache)), c10::ValueError,
                   "expected at most context_length = 6 keys, got 7");
  CHECK(cache.length() == 4);
  CHECK(shared.keys.is_same(keys));
}
