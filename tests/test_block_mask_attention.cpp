// Attention with a block mask: the fused CPU forward and backward, which skip empty blocks and
// mask nothing in full ones, against Math given the dense mask that this file builds from the
// same definition (never from the block mask under test). Random masks of every class, with
// every option, mask blocks larger and smaller than the kernel's, float64, float32 and bfloat16;
// queries that see no key; MultiHeadAttention's forward option; bad input refused by name.

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>
#include <attention/paged_attention.h>
#include <attention/sliding_kv_cache.h>

#include "helpers.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace block_mask_attention_test {

using attention::BlockMask;
namespace F = attention::functional;
using Options = F::ScaledDotProductAttentionOptions;

// Which pairs are visible, (batch, heads, t_q, t_k) bool: square patches of `patch` pairs, each
// all visible, all hidden, or visible at random, so that a mask block can be of every class.
torch::Tensor random_visibility(std::mt19937& rng, int64_t batch, int64_t heads, int64_t t_q,
                                int64_t t_k, int64_t patch) {
  auto visible = torch::empty({batch, heads, t_q, t_k}, torch::kBool);
  auto a = visible.accessor<bool, 4>();
  const int64_t patches_q = (t_q + patch - 1) / patch, patches_k = (t_k + patch - 1) / patch;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t pq = 0; pq < patches_q; ++pq) {
        for (int64_t pk = 0; pk < patches_k; ++pk) {
          const int kind = static_cast<int>(rng() % 3);  // 0 hidden, 1 visible, 2 random
          for (int64_t q = pq * patch; q < std::min(t_q, (pq + 1) * patch); ++q) {
            for (int64_t kv = pk * patch; kv < std::min(t_k, (pk + 1) * patch); ++kv) {
              a[b][h][q][kv] = kind == 2 ? rng() % 2 == 0 : kind == 1;
            }
          }
        }
      }
    }
  }
  return visible;
}

// The block mask of a visibility tensor, through its mask function.
BlockMask mask_of(const torch::Tensor& visible, int64_t block) {
  auto table = std::make_shared<torch::Tensor>(visible.contiguous());
  const int64_t heads = visible.size(1), t_q = visible.size(2), t_k = visible.size(3);
  const bool* at = table->data_ptr<bool>();
  return BlockMask::from_function(
      [table, at, heads, t_q, t_k](int64_t b, int64_t h, int64_t q, int64_t kv) {
        return at[((b * heads + h) * t_q + q) * t_k + kv];
      },
      visible.size(0), heads, t_q, t_k, block);
}

// Output and the gradients of query, key, value (and sinks when given) for `upstream`.
std::vector<torch::Tensor> run(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const Options& options,
                               const torch::Tensor& upstream, bool train) {
  auto q1 = q.detach().clone().requires_grad_(train), k1 = k.detach().clone().requires_grad_(train),
       v1 = v.detach().clone().requires_grad_(train);
  Options own = options;
  torch::Tensor sinks;
  if (options.sinks().defined()) {
    sinks = options.sinks().detach().clone().requires_grad_(train);
    own.sinks(sinks);
  }
  auto out = F::scaled_dot_product_attention(q1, k1, v1, own).output;
  std::vector<torch::Tensor> r{out.detach()};
  if (!train) return r;
  out.backward(upstream);
  for (const auto& t : {q1, k1, v1}) r.push_back(t.grad());
  if (sinks.defined()) r.push_back(sinks.grad());
  return r;
}

// The largest difference over the output and the gradients (infinite across shapes).
using test::max_abs_diff;

}  // namespace block_mask_attention_test

using namespace block_mask_attention_test;

TEST_CASE("block mask attention: the fused kernels equal Math on the dense mask, every option",
          "[block_mask][chunked]") {
  std::mt19937 rng(4242);
  torch::manual_seed(4242);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  for (int threads : {1, 2}) {
    test::with_threads(threads, [&] {
      for (int trial = 0; trial < 40; ++trial) {
        const int64_t batch = pick({1, 2}), kv_heads = pick({1, 2}), group = pick({1, 2});
        const int64_t heads = kv_heads * group;
        const int64_t t_q = pick({1, 37, 96, 130}), t_k = pick({1, 50, 96, 141});
        const int64_t d = pick({8, 16}), dv = pick({4, 8});
        // Kernel blocks equal to the mask's, larger and smaller; patches across mask blocks.
        const int64_t mask_block = pick({16, 32}), kernel_block = pick({16, 32, 64, 24});
        const int64_t patch = pick({8, 16, 48});
        const int64_t mask_batch = pick({1, batch}), mask_heads = pick({1, heads});
        const auto visible = random_visibility(rng, mask_batch, mask_heads, t_q, t_k, patch);
        const BlockMask mask = mask_of(visible, mask_block);
        const auto dtype = trial % 5 == 4 ? torch::kFloat : torch::kDouble;
        const auto opts = torch::TensorOptions().dtype(dtype);
        auto q = torch::randn({batch, t_q, heads, d}, opts).transpose(1, 2);  // strided heads
        auto k = torch::randn({batch, kv_heads, t_k, d}, opts);
        auto v = torch::randn({batch, kv_heads, t_k, dv}, opts);
        Options options;
        options.block_size(kernel_block);
        const int option = trial % 8;
        if (option == 1) options.is_causal(true);
        if (option == 2) options.is_causal(true).window_left(pick({0, 5, 40}));
        if (option == 3) options.softcap(2.5).scale(0.7);
        if (option == 4) options.alibi_slopes(F::alibi_slopes(heads).to(dtype));
        if (option == 5) options.sinks(torch::randn({heads}, opts));
        if (option == 6) options.attn_mask(torch::rand({batch, 1, 1, t_k}) < 0.2);
        if (option == 7) options.attn_mask(torch::randn({1, heads, t_q, t_k}, opts));
        if (trial % 3 == 0) options.causal_alignment(F::CausalAlignment::TopLeft);
        INFO("threads " << threads << ", trial " << trial << ": q " << q.sizes() << ", k "
                        << k.sizes() << ", mask (" << mask_batch << ", " << mask_heads
                        << ") blocks " << mask_block << ", kernel blocks " << kernel_block
                        << ", option " << option << ", " << mask);
        // Math's dense mask: this file's visibility merged with the option's own mask.
        Options math = options;
        math.backend(F::Backend::Math);
        const auto hidden = visible.logical_not();
        if (!options.attn_mask().defined()) {
          math.attn_mask(hidden);
        } else if (options.attn_mask().scalar_type() == torch::kBool) {
          math.attn_mask(options.attn_mask().logical_or(hidden));
        } else {
          math.attn_mask(
              options.attn_mask().masked_fill(hidden, -std::numeric_limits<double>::infinity()));
        }
        Options fused = options;
        fused.backend(F::Backend::Chunked).block_mask(mask);
        const auto upstream = torch::randn({batch, heads, t_q, dv}, opts);
        const double tolerance = dtype == torch::kDouble ? 1e-10 : 2e-5;
        const auto expected = run(q, k, v, math, upstream, true);
        const auto got = run(q, k, v, fused, upstream, true);
        CHECK(F::last_path() == F::Path::ChunkedFused);
        CHECK(max_abs_diff(got, expected) < tolerance);
        // Inference takes the forward without its log-sum-exp; Math's own route reads the block
        // mask as its dense mask.
        CHECK(max_abs_diff(run(q, k, v, fused, upstream, false),
                           run(q, k, v, math, upstream, false)) < tolerance);
        Options math_with_blocks = options;
        math_with_blocks.backend(F::Backend::Math).block_mask(mask);
        CHECK(max_abs_diff(run(q, k, v, math_with_blocks, upstream, true), expected) < tolerance);
      }
    });
  }
}

TEST_CASE(
    "block mask attention: builders at T >= 1024 in float32 and bfloat16, and queries that "
    "see no key",
    "[block_mask][chunked][long]") {
  torch::manual_seed(7);
  const int64_t t = 1100;
  std::vector<int64_t> ids(t);
  for (int64_t i = 0; i < t; ++i) ids[i] = i < 300 ? 0 : (i < 310 ? 1 : (i < 900 ? 2 : 3));
  const auto documents = BlockMask::document(torch::tensor(ids)) & BlockMask::causal(t, t);
  const auto prefix = BlockMask::prefix_lm(t, 200);
  // Queries 0-99 see no key at all: their outputs and gradients are 0, as Math gives.
  const auto blind = BlockMask::from_function(
      [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 100 && kv < q; }, 1, 1, t, t);
  for (const BlockMask* mask : {&documents, &prefix, &blind}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      INFO(*mask << ", " << dtype);
      const auto opts = torch::TensorOptions().dtype(dtype);
      const auto q = torch::randn({1, 4, t, 32}, opts), k = torch::randn({1, 2, t, 32}, opts),
                 v = torch::randn({1, 2, t, 32}, opts);
      const auto upstream = torch::randn({1, 4, t, 32}, opts);
      // The truth in float64 on the same inputs.
      const auto wide = [](const torch::Tensor& x) { return x.to(torch::kDouble); };
      const auto truth = run(wide(q), wide(k), wide(v),
                             Options().backend(F::Backend::Math).attn_mask(mask->to_attn_mask()),
                             wide(upstream), true);
      const auto got =
          run(q, k, v, Options().backend(F::Backend::Chunked).block_mask(*mask), upstream, true);
      CHECK(max_abs_diff(got, truth) < (dtype == torch::kFloat ? 1e-4 : 0.1));
      if (mask == &blind) {
        CHECK(got[0].narrow(2, 0, 100).abs().max().item<double>() == 0.0);
        CHECK(got[1].narrow(2, 0, 100).abs().max().item<double>() == 0.0);
      }
    }
  }
}

TEST_CASE("block mask attention: one head (T, d) and heads without a batch (H, T, d)",
          "[block_mask][chunked]") {
  torch::manual_seed(13);
  std::mt19937 rng(13);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const int64_t heads : {int64_t{0}, int64_t{3}}) {  // 0: rank 2
    const auto visible = random_visibility(rng, 1, std::max<int64_t>(heads, 1), 70, 90, 16);
    const auto mask = mask_of(visible, 32);
    const auto lead = heads == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{heads};
    const auto with = [&](std::vector<int64_t> tail) {
      auto shape = lead;
      shape.insert(shape.end(), tail.begin(), tail.end());
      return torch::randn(shape, opts);
    };
    const auto q = with({70, 16}), k = with({90, 16}), v = with({90, 8});
    const auto hidden = heads == 0 ? visible[0][0].logical_not() : visible[0].logical_not();
    const auto upstream = with({70, 8});
    INFO("heads " << heads);
    const auto expected =
        run(q, k, v, Options().backend(F::Backend::Math).attn_mask(hidden), upstream, true);
    CHECK(max_abs_diff(
              run(q, k, v, Options().backend(F::Backend::Chunked).block_mask(mask), upstream, true),
              expected) < 1e-10);
    // Math reads the dense mask shaped as the scores (a mask of higher rank would give the
    // output its rank).
    CHECK(max_abs_diff(
              run(q, k, v, Options().backend(F::Backend::Math).block_mask(mask), upstream, true),
              expected) < 1e-10);
  }
}

TEST_CASE("block mask attention: MultiHeadAttention takes one in its forward options",
          "[block_mask][multi_head_attention]") {
  torch::manual_seed(11);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(32, 32, 4).context_length(600).causal(false));
  const auto x = torch::randn({2, 600, 32});
  std::vector<int64_t> ids(600);
  for (int64_t i = 0; i < 600; ++i) ids[i] = i / 150;
  const auto mask = BlockMask::document(torch::tensor(ids), 64);
  const auto expected = mha->forward(x, attention::MultiHeadAttentionForwardOptions()
                                            .attn_mask(mask.to_attn_mask()[0][0])
                                            .backend(F::Backend::Math))
                            .output;
  const auto got =
      mha->forward(x, attention::MultiHeadAttentionForwardOptions().block_mask(mask)).output;
  CHECK(F::last_path() == F::Path::ChunkedFused);
  CHECK(test::max_abs_diff(got, expected) < 1e-5);
}

TEST_CASE(
    "block mask attention: a tree of draft tokens over a cached prefix (speculative decoding)",
    "[block_mask][kv_cache]") {
  torch::manual_seed(17);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(32, 32, 4).num_kv_heads(2).context_length(64).causal(
          false));
  attention::KVCache cache(64);
  using Options = attention::MultiHeadAttentionForwardOptions;
  const int64_t prefix = 40;
  mha->forward(torch::randn({1, prefix, 32}),
               Options().kv_cache(&cache).block_mask(BlockMask::causal(prefix, prefix)));
  // Six drafts: 0 follows the prefix, 1 and 2 follow 0, 3 and 4 follow 1, 5 follows 2. A draft
  // sees the prefix, its ancestors and itself.
  const std::vector<int64_t> parent{-1, 0, 0, 1, 1, 2};
  const int64_t drafts = 6, t_k = prefix + drafts;
  const auto sees = [parent, prefix](int64_t, int64_t, int64_t q, int64_t kv) {
    if (kv < prefix) return true;
    for (int64_t a = q; a >= 0; a = parent[static_cast<size_t>(a)]) {
      if (kv - prefix == a) return true;
    }
    return false;
  };
  auto hidden = torch::zeros({drafts, t_k}, torch::kBool);
  for (int64_t q = 0; q < drafts; ++q) {
    for (int64_t kv = 0; kv < t_k; ++kv) hidden[q][kv] = !sees(0, 0, q, kv);
  }
  const auto tree = BlockMask::from_function(sees, 1, 1, drafts, t_k, 16);
  const auto x = torch::randn({1, drafts, 32});
  const auto got =
      mha->forward(x, Options().kv_cache(&cache).block_mask(tree).backend(F::Backend::Chunked))
          .output;
  CHECK(F::last_path() == F::Path::ChunkedFused);
  CHECK(cache.length() == t_k);
  cache.truncate(prefix);  // the drafts rejected: their keys leave the cache
  const auto expected =
      mha->forward(x, Options().kv_cache(&cache).attn_mask(hidden).backend(F::Backend::Math))
          .output;
  CHECK(test::max_abs_diff(got, expected) < 1e-5);
  // A mask that forgets the prefix is refused by the module, and the cache is as it was.
  cache.truncate(prefix);
  CHECK_THROWS_C10(
      mha->forward(x, Options().kv_cache(&cache).block_mask(
                          BlockMask::from_function(sees, 1, 1, drafts, drafts))),
      c10::ValueError,
      "attention::MultiHeadAttention: expected a block_mask made for 6 queries and 46 keys (with a "
      "kv_cache, its keys and this call's), got one made for 6 and 6");
  CHECK(cache.length() == prefix);
  attention::SlidingKVCache sliding(64);
  CHECK_THROWS_C10(mha->forward(x, Options().sliding_kv_cache(&sliding).block_mask(tree)),
                   c10::ValueError, "takes no block_mask with a sliding_kv_cache");
  CHECK(sliding.length() == 0);
}

TEST_CASE("block mask attention: bad input is refused by name", "[block_mask][bad_input]") {
  const auto q = torch::randn({2, 4, 10, 8}), k = torch::randn({2, 4, 12, 8});
  const auto sdpa = [&](const BlockMask& mask) {
    return F::scaled_dot_product_attention(q, k, k, Options().block_mask(mask));
  };
  CHECK_THROWS_C10(sdpa(BlockMask::causal(12, 12)), c10::ValueError,
                   "attention::functional::scaled_dot_product_attention: expected a block_mask "
                   "made for Tq = 10 queries and Tk = 12 keys, got one made for 12 and 12");
  const auto all = [](int64_t, int64_t, int64_t, int64_t) { return true; };
  CHECK_THROWS_C10(sdpa(BlockMask::from_function(all, 3, 1, 10, 12)), c10::ValueError,
                   "attention::functional::scaled_dot_product_attention: expected a block_mask "
                   "whose batch and heads broadcast to the scores (2, 4, 10, 12) as a dense mask "
                   "(3, 1, 10, 12) would, got batch 3 and heads 1");
  CHECK_THROWS_C10(sdpa(BlockMask::from_function(all, 1, 2, 10, 12)), c10::ValueError,
                   "got batch 1 and heads 2");
  // One head without a batch (rank 2): only a mask of one batch row and one head.
  const auto q2 = torch::randn({10, 8}), k2 = torch::randn({12, 8});
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(
          q2, k2, k2, Options().block_mask(BlockMask::from_function(all, 2, 1, 10, 12))),
      c10::ValueError, "to the scores (10, 12) as a dense mask (2, 1, 10, 12)");
  // Packed and paged calls: made for at least the longest sequence (test_packed_visibility.cpp
  // has the rest).
  const auto packed = torch::randn({2, 2, 8});
  const auto pages = torch::randn({2, 2, 8, 8});
  CHECK_THROWS_C10(F::paged_attention(packed, pages, pages, torch::tensor({0, 1, 2}, torch::kLong),
                                      torch::tensor({3, 5}, torch::kLong),
                                      torch::tensor({{0}, {1}}, torch::kLong),
                                      Options().block_mask(BlockMask::causal(1, 4))),
                   c10::ValueError,
                   "attention::functional::paged_attention: expected a block_mask made for at "
                   "least the longest sequence's 1 queries and 5 keys (each sequence reads its "
                   "top-left corner), got one made for 1 and 4");
}
