// DeepSeek sparse attention: the top-k attention (functional::sparse_attention), the lightning
// indexer's choice and the module with its cache. Python's numbers for the book's class are the
// golden cases dsa_* (test_golden.cpp); here the fused kernel against gathered keys in ops, the
// indexer against a sort of its own scores, and decoding against one forward.

#include <attention/deepseek_sparse_attention.h>
#include <attention/functional.h>
#include <attention/sparse_attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <vector>

namespace {

namespace F = attention::functional;
using attention::DeepSeekSparseAttention;
using attention::DeepSeekSparseAttentionOptions;
using attention::SparseAttentionCache;
using test::max_abs_diff;

// Random indices (B, T, K) into S keys: some -1, some repeated, and row 0 of batch 0 all -1.
torch::Tensor random_indices(int64_t b, int64_t t, int64_t k, int64_t s) {
  auto indices = torch::randint(-1, s, {b, t, k}, torch::kLong);
  indices[0][0].fill_(-1);
  return indices;
}

std::vector<torch::Tensor> attend_and_grads(const std::vector<torch::Tensor>& in,
                                            const torch::Tensor& indices, F::Backend backend,
                                            const torch::Tensor& gy) {
  const auto out = F::sparse_attention(in[0], in[1], in[2], indices,
                                       F::SparseAttentionOptions().backend(backend));
  auto grads = torch::autograd::grad({out}, in, {gy});
  grads.insert(grads.begin(), out.detach());
  return grads;
}

}  // namespace

TEST_CASE("Sparse attention: the fused kernel equals gathered keys in ops, with gradients",
          "[dsa]") {
  torch::manual_seed(11);
  // Grouped heads (4 query heads on 2 key/value heads), d != d_v, -1 indices, a repeated index
  // and a query without keys.
  const auto o = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  const std::vector<torch::Tensor> in = {torch::randn({2, 4, 13, 8}, o),
                                         torch::randn({2, 2, 17, 8}, o),
                                         torch::randn({2, 2, 17, 5}, o)};
  const auto indices = random_indices(2, 13, 6, 17);
  const auto gy = torch::randn({2, 4, 13, 5}, torch::kDouble);
  const auto math = attend_and_grads(in, indices, F::Backend::Math, gy);
  const auto fused = attend_and_grads(in, indices, F::Backend::Chunked, gy);
  const char* names[] = {"output", "grad query", "grad key", "grad value"};
  for (size_t i = 0; i < math.size(); ++i) {
    INFO(names[i]);
    CHECK(max_abs_diff(fused[i], math[i]) < 1e-12);
  }
  // The query without keys: zeros, and no gradient through it.
  CHECK(fused[0][0].select(1, 0).abs().max().item<double>() == 0.0);
  CHECK(fused[1][0].select(1, 0).abs().max().item<double>() == 0.0);
}

TEST_CASE("Sparse attention: selecting every earlier key is causal attention", "[dsa]") {
  torch::manual_seed(12);
  const int64_t t = 20;
  const auto q = torch::randn({1, 2, t, 8}), k = torch::randn({1, 2, t, 8}),
             v = torch::randn({1, 2, t, 8});
  // Row i names keys 0..i, then -1.
  const auto keys = torch::arange(t).unsqueeze(0);
  const auto rows = torch::arange(t).unsqueeze(1);
  const auto indices = keys.masked_fill(keys.gt(rows), -1).unsqueeze(0);
  const auto causal = F::scaled_dot_product_attention(
                          q, k, v, F::ScaledDotProductAttentionOptions().is_causal(true))
                          .output;
  for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
    CHECK(max_abs_diff(
              F::sparse_attention(q, k, v, indices, F::SparseAttentionOptions().backend(backend)),
              causal) < 1e-6);
  }
}

TEST_CASE("Sparse attention: bfloat16 is computed in float and rounded once", "[dsa]") {
  torch::manual_seed(13);
  const auto q = torch::randn({1, 2, 9, 16}), k = torch::randn({1, 2, 11, 16}),
             v = torch::randn({1, 2, 11, 16});
  const auto indices = random_indices(1, 9, 4, 11);
  const auto bf = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  const auto f = [](const torch::Tensor& x) { return x.to(torch::kFloat); };
  const auto out = F::sparse_attention(bf(q), bf(k), bf(v), indices);
  REQUIRE(out.scalar_type() == torch::kBFloat16);
  const auto reference = F::sparse_attention(f(bf(q)), f(bf(k)), f(bf(v)), indices);
  const double bound = reference.abs().max().item<double>() * std::pow(2.0, -8);
  CHECK(max_abs_diff(f(out), reference) <= bound);
}

TEST_CASE("LightningIndexer: the top k of its scores, the earlier token first among equal ones",
          "[dsa]") {
  torch::manual_seed(14);
  attention::LightningIndexer indexer(
      attention::LightningIndexerOptions(8).index_n_heads(2).index_head_dim(4));
  indexer->to(torch::kDouble);
  const auto x = torch::randn({2, 30, 8}, torch::kDouble);
  const auto keys = indexer->keys(x);
  const auto scores = indexer->scores(x, keys);
  for (const int64_t topk : {1, 5, 30, 100}) {
    INFO("topk " << topk);
    const auto chosen = indexer(x, keys, topk);
    const int64_t k = std::min<int64_t>(topk, 30);
    REQUIRE(chosen.sizes() == c10::IntArrayRef({2, 30, k}));
    // The reference: a stable sort of each row, the first k, ascending; later tokens become -1.
    const auto order = std::get<1>(scores.sort(/*stable=*/true, -1, /*descending=*/true));
    auto expected = std::get<0>(order.narrow(-1, 0, k).sort(-1));
    expected = expected.masked_fill(expected.gt(torch::arange(30).view({1, 30, 1})), -1);
    // -1 entries first in `expected` (they sorted low): compare as sets of valid positions.
    const auto valid = [](const torch::Tensor& i) {
      return std::get<0>(i.masked_fill(i.lt(0), 1 << 20).sort(-1));
    };
    CHECK(torch::equal(valid(chosen), valid(expected)));
    // No later token is ever chosen, and each query has min(k, its position + 1) keys.
    CHECK(chosen.gt(torch::arange(30).view({1, 30, 1})).sum().item<int64_t>() == 0);
    const auto counts = chosen.ge(0).sum(-1);
    CHECK(torch::equal(counts[0], torch::arange(1, 31).clamp_max(k)));
  }
  // Ties: with no index weights every score is 0, and the earliest tokens win.
  torch::NoGradGuard no_grad;
  indexer->W_q_index->weight.zero_();
  const auto tied = indexer(x, keys, 3);
  CHECK(torch::equal(tied[0][10], torch::tensor({0, 1, 2})));
}

TEST_CASE("LightningIndexer: in bfloat16, chosen in LibTorch ops, by the same rule", "[dsa]") {
  torch::manual_seed(18);
  attention::LightningIndexer indexer(
      attention::LightningIndexerOptions(8).index_n_heads(2).index_head_dim(4));
  indexer->to(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 20, 8}).to(torch::kBFloat16);
  const auto keys = indexer->keys(x);
  const auto chosen = indexer(x, keys, 6);
  // bfloat16 scores tie often: the stable sort of the scores decides as the indexer must.
  const auto order = std::get<1>(indexer->scores(x, keys).sort(/*stable=*/true, -1, true));
  auto expected = std::get<0>(order.narrow(-1, 0, 6).sort(-1));
  const auto position = torch::arange(20).view({1, 20, 1});
  expected = expected.masked_fill(expected.gt(position), -1);
  const auto valid = [](const torch::Tensor& i) {
    return std::get<0>(i.masked_fill(i.lt(0), 1 << 20).sort(-1));
  };
  CHECK(torch::equal(valid(chosen), valid(expected)));
}

TEST_CASE("LightningIndexer: scored a block of queries at a time, the choice is the same",
          "[dsa]") {
  torch::manual_seed(15);
  // 700 queries: forward() scores them in blocks of at most 256.
  attention::LightningIndexer indexer(
      attention::LightningIndexerOptions(4).index_n_heads(1).index_head_dim(2));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 700, 4});
  const auto keys = indexer->keys(x);
  const auto chosen = indexer(x, keys, 7);
  const auto scores = indexer->scores(x, keys);
  // Every chosen key scores at least as high as every visible key not chosen.
  const auto chosen_scores =
      scores.gather(-1, chosen.clamp_min(0)).masked_fill(chosen.lt(0), INFINITY);
  const auto lowest_chosen = std::get<0>(chosen_scores.min(-1));
  auto others = scores.scatter(-1, chosen.clamp_min(0), -INFINITY);
  const auto best_other = std::get<0>(others.max(-1));
  CHECK(best_other.le(lowest_chosen).all().item<bool>());
}

TEST_CASE("DeepSeekSparseAttention: decoding through its cache equals one forward", "[dsa]") {
  torch::manual_seed(16);
  DeepSeekSparseAttention dsa(DeepSeekSparseAttentionOptions(12, 24, 3)
                                  .qkv_bias(true)
                                  .index_n_heads(2)
                                  .index_head_dim(6)
                                  .topk(5));
  dsa->to(torch::kDouble);
  dsa->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 33, 12}, torch::kDouble);
  const auto whole = dsa(x);
  for (const auto& chunks :
       std::vector<std::vector<int64_t>>{{33}, std::vector<int64_t>(33, 1), {4, 1, 28}}) {
    SparseAttentionCache cache(33);
    const auto decoded =
        test::in_chunks(x, chunks, [&](const torch::Tensor& part) { return dsa(part, &cache); });
    CHECK(cache.length() == 33);
    CHECK(max_abs_diff(decoded, whole) < 1e-12);
  }
  // Keys and values of 3 heads of 8 doubles, and an index key of 6.
  SparseAttentionCache cache(40);
  dsa(x, &cache);
  CHECK(cache.bytes_per_token() == (2 * 3 * 8 + 6) * 8);
}

TEST_CASE("DeepSeekSparseAttention: the fused kernel and gathered keys give one module's numbers",
          "[dsa]") {
  torch::manual_seed(17);
  DeepSeekSparseAttention dsa(DeepSeekSparseAttentionOptions(8, 16, 4).index_head_dim(4).topk(6));
  dsa->to(torch::kDouble);
  const auto x = torch::randn({2, 25, 8}, torch::kDouble).requires_grad_(true);
  const auto run = [&](F::Backend backend) {
    dsa->options.backend(backend);
    const auto y = dsa(x);
    return std::vector<torch::Tensor>{
        y.detach(), torch::autograd::grad({y.pow(2).sum()}, {x, dsa->W_key->weight})[0]};
  };
  const auto math = run(F::Backend::Math), fused = run(F::Backend::Chunked);
  CHECK(max_abs_diff(fused[0], math[0]) < 1e-12);
  CHECK(max_abs_diff(fused[1], math[1]) < 1e-12);
}

TEST_CASE("SparseAttentionCache: a refused append leaves it as it was", "[dsa]") {
  SparseAttentionCache cache(6);
  cache.append(torch::randn({1, 2, 4, 3}), torch::randn({1, 2, 4, 3}), torch::randn({1, 4, 5}));
  const auto refuse = [&](torch::Tensor k, torch::Tensor v, torch::Tensor i) {
    CHECK_THROWS(cache.append(k, v, i));
    CHECK(cache.length() == 4);
  };
  refuse(torch::randn({1, 2, 3, 3}), torch::randn({1, 2, 3, 3}),
         torch::randn({1, 3, 5}));  // too long
  refuse(torch::randn({1, 2, 1, 3}), torch::randn({1, 2, 1, 3}),
         torch::randn({1, 2, 5}));  // T differs
  refuse(torch::randn({1, 2, 1, 3}), torch::randn({1, 2, 1, 3}),
         torch::randn({1, 1, 4}));  // features
  refuse(torch::randn({1, 2, 1, 3}), torch::randn({1, 2, 1, 3}),
         torch::randn({1, 1, 5}, torch::kDouble));
  cache.truncate(2);
  CHECK(cache.length() == 2);
  cache.reset();
  CHECK(cache.length() == 0);
}

TEST_CASE("Sparse attention: a double backward through the fused kernel is refused, Math's works",
          "[dsa]") {
  torch::manual_seed(32);
  const auto options = torch::dtype(torch::kDouble).requires_grad(true);
  const auto q = torch::randn({1, 2, 6, 8}, options), k = torch::randn({1, 2, 6, 8}, options),
             v = torch::randn({1, 2, 6, 8}, options);
  const auto indices =
      torch::tensor({{0, -1}, {0, 1}, {1, 2}, {0, 3}, {2, 4}, {4, 5}}).unsqueeze(0);
  const auto first_order = [&](F::Backend backend) {
    const auto out =
        F::sparse_attention(q, k, v, indices, F::SparseAttentionOptions().backend(backend));
    return torch::autograd::grad({out.square().sum()}, {q}, {}, true, /*create_graph=*/true)[0];
  };
  CHECK_THROWS_C10(first_order(F::Backend::Chunked), c10::Error,
                   "attention::functional::sparse_attention: the fused CPU backward gives "
                   "first-order gradients only");
  const auto dq = first_order(F::Backend::Math);
  CHECK(torch::autograd::grad({dq.sum()}, {k})[0].abs().sum().item<double>() > 0.0);
}
