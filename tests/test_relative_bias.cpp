// Relative position biases: the buckets against their definitions; the fused CPU forward and
// backward (which never form a Tq x Tk bias) against Math given the dense bias that this file
// builds from the table, with the table's gradient, under every option and a block mask;
// MultiHeadAttention's table decoding through a cache as in one forward; bad input refused by
// name. T5's buckets against Python's are in the goldens (blockmask_relative_bias_*).

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>

#include "helpers.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace relative_bias_test {

namespace F = attention::functional;
using Options = F::ScaledDotProductAttentionOptions;
using F::RelativeBuckets;

// The dense bias of a one-bucket-per-distance table, (H, Tq, Tk), written out: head h, query i
// at position i + offset, key j: table[clamp(j - pos, -m, m) + m, h].
torch::Tensor dense_distance_bias(const torch::Tensor& table, int64_t max_distance, int64_t t_q,
                                  int64_t t_k, int64_t offset) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < t_q; ++i) {
    for (int64_t j = 0; j < t_k; ++j) {
      rows.push_back(std::clamp<int64_t>(j - (i + offset), -max_distance, max_distance) +
                     max_distance);
    }
  }
  return table.index_select(0, torch::tensor(rows, torch::kLong))
      .view({t_q, t_k, table.size(1)})
      .permute({2, 0, 1});
}

// Output and the gradients of query, key, value and the table (and the sinks when given).
std::vector<torch::Tensor> run(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& table,
                               const Options& options, const torch::Tensor& upstream,
                               bool dense_bias, int64_t max_distance) {
  auto q1 = q.detach().clone().requires_grad_(), k1 = k.detach().clone().requires_grad_(),
       v1 = v.detach().clone().requires_grad_(), t1 = table.detach().clone().requires_grad_();
  Options own = options;
  torch::Tensor sinks;
  if (options.sinks().defined()) {
    sinks = options.sinks().detach().clone().requires_grad_();
    own.sinks(sinks);
  }
  if (dense_bias) {
    const int64_t offset =
        options.causal_alignment() == F::CausalAlignment::TopLeft ? 0 : k.size(-2) - q.size(-2);
    auto bias = dense_distance_bias(t1, max_distance, q.size(-2), k.size(-2), offset);
    const auto& mask = options.attn_mask();
    if (mask.defined() && mask.scalar_type() == torch::kBool) {
      bias = bias.masked_fill(mask, -std::numeric_limits<double>::infinity());
    } else if (mask.defined()) {
      bias = bias + mask;
    }
    own.attn_mask(bias);
  } else {
    own.relative_bias(t1).relative_buckets(RelativeBuckets::distance(max_distance));
  }
  auto out = F::scaled_dot_product_attention(q1, k1, v1, own).output;
  out.backward(upstream);
  std::vector<torch::Tensor> r{out.detach(), q1.grad(), k1.grad(), v1.grad(), t1.grad()};
  if (sinks.defined()) r.push_back(sinks.grad());
  return r;
}

// The largest difference over the output and the gradients (infinite across shapes).
using test::max_abs_diff;

}  // namespace relative_bias_test

using namespace relative_bias_test;

TEST_CASE("relative bias: buckets against their definitions", "[relative_bias]") {
  const auto r = torch::arange(-300, 301, torch::kLong);
  const auto distance = RelativeBuckets::distance(5);
  CHECK(distance.num_buckets() == 11);
  CHECK(torch::equal(distance.bucket(r), r.clamp(-5, 5) + 5));
  CHECK(torch::equal(RelativeBuckets::distance(0).bucket(r), torch::zeros_like(r)));
  // T5, bidirectional: 16 buckets a side, exact below 8, the last bucket from max_distance on.
  const auto t5 = RelativeBuckets::t5(32, 128, true);
  const auto b = t5.bucket(r);
  const auto at = [&](int64_t rel) { return b[rel + 300].item<int64_t>(); };
  for (int64_t d = 0; d < 8; ++d) {
    CHECK(at(-d) == d);                 // keys before (or at) the query: the first half
    if (d > 0) CHECK(at(d) == 16 + d);  // keys after it: the second half
  }
  CHECK(at(-128) == 15);
  CHECK(at(-300) == 15);
  CHECK(at(300) == 31);
  CHECK(at(-8) == 8);  // the first logarithmic bucket
  // Nondecreasing with the distance on each side.
  for (int64_t d = 1; d <= 300; ++d) {
    CHECK(at(-d) >= at(-(d - 1)));
    CHECK(at(d) >= at(d - 1));
  }
  // Unidirectional: every key after the query shares bucket 0.
  const auto causal = RelativeBuckets::t5(32, 128, false).bucket(r);
  CHECK(causal.slice(0, 0, 300).max().item<int64_t>() == 31);  // r = -300
  CHECK(causal.slice(0, 0, 300).min().item<int64_t>() == 1);   // r = -1
  CHECK(causal.slice(0, 300, 601).abs().max().item<int64_t>() == 0);
  // Positions at the int64 limits and 2^31 take the end buckets.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const auto far = torch::tensor(
      {std::numeric_limits<int64_t>::min(), -(int64_t{1} << 31), int64_t{1} << 31, kMax},
      torch::kLong);
  CHECK(torch::equal(t5.bucket(far), torch::tensor({15, 15, 31, 31}, torch::kLong)));
  CHECK(torch::equal(RelativeBuckets::t5(32, 128, false).bucket(far),
                     torch::tensor({31, 31, 0, 0}, torch::kLong)));
  CHECK(torch::equal(distance.bucket(far), torch::tensor({0, 0, 10, 10}, torch::kLong)));
  const auto widest = RelativeBuckets::distance(int64_t{1} << 30);
  CHECK(widest.num_buckets() == (int64_t{1} << 31) + 1);
  CHECK(torch::equal(
      widest.bucket(far),
      torch::tensor({int64_t{0}, int64_t{0}, int64_t{1} << 31, int64_t{1} << 31}, torch::kLong)));
}

TEST_CASE("relative bias: the fused kernels equal Math on the dense bias, with every option",
          "[relative_bias][chunked]") {
  std::mt19937 rng(777);
  torch::manual_seed(777);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  for (int threads : {1, 2}) {
    test::with_threads(threads, [&] {
      for (int trial = 0; trial < 24; ++trial) {
        const auto [batch, kv_heads, heads, t_q, t_k, d, dv] = test::random_sizes(rng);
        const int64_t max_distance = pick({0, 3, 50, 1000});
        const auto dtype = trial % 4 == 3 ? torch::kFloat : torch::kDouble;
        const auto opts = torch::TensorOptions().dtype(dtype);
        const auto q = torch::randn({batch, heads, t_q, d}, opts);
        const auto k = torch::randn({batch, kv_heads, t_k, d}, opts);
        const auto v = torch::randn({batch, kv_heads, t_k, dv}, opts);
        const auto table = torch::randn({2 * max_distance + 1, heads}, opts);
        Options options;
        options.block_size(pick({16, 32, 64}));
        const int option = trial % 7;
        test::add_option(options, option, batch, heads, t_k, dtype, pick);
        if (trial % 3 == 0) options.causal_alignment(F::CausalAlignment::TopLeft);
        INFO("threads " << threads << ", trial " << trial << ": q " << q.sizes() << ", k "
                        << k.sizes() << ", max_distance " << max_distance << ", option " << option);
        const auto upstream = torch::randn({batch, heads, t_q, dv}, opts);
        const auto expected = run(q, k, v, table, Options(options).backend(F::Backend::Math),
                                  upstream, true, max_distance);
        const auto got = run(q, k, v, table, Options(options).backend(F::Backend::Chunked),
                             upstream, false, max_distance);
        CHECK(F::last_path() == F::Path::ChunkedFused);
        CHECK(max_abs_diff(got, expected) < (dtype == torch::kDouble ? 1e-10 : 1e-4));
        // Math's own route expands the table itself.
        CHECK(max_abs_diff(run(q, k, v, table, Options(options).backend(F::Backend::Math), upstream,
                               false, max_distance),
                           expected) < 1e-10);
      }
    });
  }
}

TEST_CASE("relative bias: under a block mask, in bfloat16 at T = 1100", "[relative_bias]") {
  torch::manual_seed(5);
  const int64_t t = 1100, max_distance = 200;
  std::vector<int64_t> ids(t);
  for (int64_t i = 0; i < t; ++i) ids[i] = i < 500 ? 0 : 1;
  const auto mask =
      attention::BlockMask::document(torch::tensor(ids)) & attention::BlockMask::causal(t, t);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO(dtype);
    const auto opts = torch::TensorOptions().dtype(dtype);
    const auto q = torch::randn({1, 4, t, 32}, opts), k = torch::randn({1, 2, t, 32}, opts),
               v = torch::randn({1, 2, t, 32}, opts), upstream = torch::randn({1, 4, t, 32}, opts);
    const auto table = torch::randn({2 * max_distance + 1, 4}, opts);
    const auto wide = [](const torch::Tensor& x) { return x.to(torch::kDouble); };
    const auto truth = run(wide(q), wide(k), wide(v), wide(table),
                           Options().backend(F::Backend::Math).attn_mask(mask.to_attn_mask()[0][0]),
                           wide(upstream), true, max_distance);
    const auto got = run(q, k, v, table, Options().backend(F::Backend::Chunked).block_mask(mask),
                         upstream, false, max_distance);
    // The table's gradient sums over up to T pairs a bucket: bfloat16's rounding of the
    // inputs' products shows most there.
    CHECK(max_abs_diff(got, truth) < (dtype == torch::kFloat ? 2e-3 : 0.5));
    CHECK(test::max_abs_diff(got[0].to(torch::kDouble), truth[0]) <
          (dtype == torch::kFloat ? 1e-4 : 0.05));
  }
}

TEST_CASE("relative bias: a key a block mask hides stays hidden whatever its bias",
          "[relative_bias][block_mask]") {
  torch::manual_seed(21);
  const auto q = torch::randn({1, 2, 50, 8}, torch::kDouble), k = torch::randn_like(q);
  // Keys after the query (bucket 2) get +inf, which the causal block mask hides.
  auto table = torch::randn({3, 2}, torch::kDouble);
  table[2] = std::numeric_limits<double>::infinity();
  const auto mask = attention::BlockMask::causal(50, 50, 16);
  const auto expected =
      F::scaled_dot_product_attention(q, k, k,
                                      Options()
                                          .backend(F::Backend::Math)
                                          .is_causal(true)
                                          .relative_bias(table)
                                          .relative_buckets(RelativeBuckets::distance(1)))
          .output;
  REQUIRE(torch::isfinite(expected).all().item<bool>());
  for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
    const auto got =
        F::scaled_dot_product_attention(
            q, k, k,
            Options().backend(backend).block_mask(mask).relative_bias(table).relative_buckets(
                RelativeBuckets::distance(1)))
            .output;
    CHECK(test::max_abs_diff(got, expected) < 1e-12);
  }
}

TEST_CASE("relative bias: MultiHeadAttention decodes through a cache as in one forward",
          "[relative_bias][multi_head_attention]") {
  torch::manual_seed(9);
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(32, 32, 4)
                                        .num_kv_heads(2)
                                        .context_length(80)
                                        .relative_bias(RelativeBuckets::t5(32, 128, false)));
  CHECK(mha->named_parameters().contains("relative_attention_bias"));
  CHECK(mha->relative_attention_bias.sizes() == torch::IntArrayRef({32, 4}));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 80, 32});
  const auto whole = mha->forward(x).output;
  attention::KVCache cache(80);
  std::vector<torch::Tensor> steps;
  for (const auto& [start, n] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 70}, {70, 1}, {71, 9}}) {
    steps.push_back(mha->forward(x.narrow(1, start, n),
                                 attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
                        .output);
  }
  CHECK(test::max_abs_diff(torch::cat(steps, 1), whole) < 1e-5);
}

TEST_CASE("relative bias: bad input is refused by name", "[relative_bias][bad_input]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_C10(RelativeBuckets::t5(3, 128, true), c10::ValueError,
                   "attention::functional::RelativeBuckets::t5: expected 4 <= num_buckets <= 2^30 "
                   "(bidirectional), got 3");
  CHECK_THROWS_C10(RelativeBuckets::t5(kMax, 128, false), c10::ValueError,
                   "expected 2 <= num_buckets <= 2^30 (unidirectional), got 9223372036854775807");
  CHECK_THROWS_C10(RelativeBuckets::t5(32, 8, true), c10::ValueError,
                   "expected max_distance above the exact range (8 positions) and at most 2^30, "
                   "got 8");
  CHECK_THROWS_C10(RelativeBuckets::t5(32, kMax, true), c10::ValueError,
                   "at most 2^30, got 9223372036854775807");
  CHECK_THROWS_C10(RelativeBuckets::distance(-1), c10::ValueError,
                   "attention::functional::RelativeBuckets::distance: expected 0 <= max_distance "
                   "<= 2^30, got -1");
  CHECK_THROWS_C10(RelativeBuckets::distance((int64_t{1} << 30) + 1), c10::ValueError,
                   "got 1073741825");
  const auto q = torch::randn({1, 4, 10, 8}), k = torch::randn({1, 2, 12, 8});
  const auto sdpa = [&](const torch::Tensor& table) {
    return F::scaled_dot_product_attention(
        q, k, k, Options().relative_bias(table).relative_buckets(RelativeBuckets::distance(3)));
  };
  CHECK_THROWS_C10(sdpa(torch::zeros({7, 4}, torch::kDouble)), c10::TypeError,
                   "attention::functional::scaled_dot_product_attention: expected relative_bias "
                   "of the queries' dtype Float, got Double");
  CHECK_THROWS_C10(sdpa(torch::zeros({7, 2})), c10::ValueError,
                   "attention::functional::scaled_dot_product_attention: expected relative_bias "
                   "of shape (7, 4): one row per bucket of relative_buckets, one column per query "
                   "head, got (7, 2)");
  CHECK_THROWS_C10(sdpa(torch::zeros({32, 4})), c10::ValueError, "got (32, 4)");
  // Packed calls check the table as well.
  const auto packed = torch::randn({10, 2, 8});
  const auto offsets = torch::tensor({0, 4, 10}, torch::kLong);
  CHECK_THROWS_C10(F::varlen_attention(packed, packed, packed, offsets, offsets,
                                       Options()
                                           .relative_bias(torch::zeros({7, 3}))
                                           .relative_buckets(RelativeBuckets::distance(3))),
                   c10::ValueError,
                   "attention::functional::varlen_attention: expected relative_bias of shape (7, "
                   "2)");
  // The tiles of other devices do not differentiate the table.
  if (!torch::cuda::is_available()) {
    WARN("relative bias on CUDA: skipped, no CUDA device");
    return;
  }
  const auto cuda = [](const torch::Tensor& x) { return x.to(torch::kCUDA); };
  const auto table = torch::zeros({7, 4}, torch::kCUDA).requires_grad_();
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(cuda(q), cuda(k), cuda(k),
                                      Options()
                                          .backend(F::Backend::Chunked)
                                          .relative_bias(table)
                                          .relative_buckets(RelativeBuckets::distance(3))),
      c10::Error,
      "attention::functional::scaled_dot_product_attention: the Chunked backend "
      "differentiates relative_bias on the fused CPU kernels only");
  // Math differentiates it there, and without a gradient the tiles add the dense bias.
  CHECK_NOTHROW(F::scaled_dot_product_attention(
      cuda(q), cuda(k), cuda(k),
      Options().relative_bias(table).relative_buckets(RelativeBuckets::distance(3))));
}
