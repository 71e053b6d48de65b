// Shared-prefix (cascade) attention in the paged kernel: sequences of a step whose page tables
// begin with the same pages meet those pages in items of their own, stacked across sequences, and
// each sequence's own pages follow, merged through the log-sum-exp. Every result is checked
// against each sequence alone (scaled_dot_product_attention on Math, float64) and against the
// kernel with sharing off; the route itself is checked by the rows it stacked. Sharers come in
// shuffled order among sequences that share nothing, with every option, split or not, in every
// dtype the paged kernel reads; and find_shared_prefixes' grouping on its own.

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/paged_attention.h>
#include <attention/paged_kv_cache.h>
#include <attention/score_mod.h>

#include "coded_queries.h"
#include "draft_trees.h"
#include "helpers.h"
#include "kernels/paged.h"
#include "kernels/shared_prefix.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace shared_prefix_test {

namespace F = attention::functional;
namespace K = attention::kernels;
using O = F::ScaledDotProductAttentionOptions;

// Sequence s has t_q[s] queries and t_k[s] keys; those of group[s] >= 0 begin with that group's
// pages (prefix_pages[group] of them, or fewer where the sequence is shorter), the rest of their
// pages their own. Pages lie in the pool in shuffled order; the pool's keys and values are
// random (8-bit pools: random codes and scales).
struct SharedCase {
  torch::Tensor query, key_pages, value_pages, key_scales, value_scales, cu_seqlens_q, key_lengths,
      page_table;
  std::vector<torch::Tensor> keys, values;  // each sequence's (Hkv, Tk_s, d), float64
};

SharedCase make_shared_case(const std::vector<int64_t>& t_q, const std::vector<int64_t>& t_k,
                            const std::vector<int64_t>& group,
                            const std::vector<int64_t>& prefix_pages, int64_t heads,
                            int64_t kv_heads, int64_t d, int64_t page_size, torch::Dtype dtype,
                            uint32_t seed) {
  torch::manual_seed(seed);
  const int64_t count = static_cast<int64_t>(t_q.size());
  int64_t pages = 0, widest = 0;
  for (const int64_t n : prefix_pages) pages += n;
  for (const int64_t n : t_k) {
    pages += (n + page_size - 1) / page_size;
    widest = std::max(widest, (n + page_size - 1) / page_size);
  }
  std::vector<int64_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  int64_t next = 0;
  std::vector<std::vector<int64_t>> group_pages;
  for (const int64_t n : prefix_pages) {
    group_pages.emplace_back(order.begin() + next, order.begin() + next + n);
    next += n;
  }
  SharedCase c;
  const bool quantized = dtype == torch::kChar;
  if (quantized) {
    const auto codes = [&] {
      return torch::randint(-127, 128, {pages, kv_heads, page_size, d}).to(torch::kChar);
    };
    c.key_pages = codes();
    c.value_pages = codes();
    c.key_scales = torch::rand({pages, kv_heads, page_size}) * 0.02 + 0.005;
    c.value_scales = torch::rand({pages, kv_heads, page_size}) * 0.02 + 0.005;
  } else {
    c.key_pages = torch::randn({pages, kv_heads, page_size, d}).to(dtype);
    c.value_pages = torch::randn({pages, kv_heads, page_size, d}).to(dtype);
  }
  const auto real = [&](const torch::Tensor& pages_of, const torch::Tensor& scales, int64_t page) {
    auto rows = pages_of[page].to(torch::kDouble);
    return quantized ? rows * scales[page].to(torch::kDouble).unsqueeze(-1) : rows;
  };
  c.page_table = torch::full({count, widest}, -1, torch::kLong);
  std::vector<int64_t> starts{0};
  for (int64_t s = 0; s < count; ++s) {
    std::vector<torch::Tensor> k_rows, v_rows;
    for (int64_t j = 0; j < t_k[s]; j += page_size) {
      const int64_t index = j / page_size;
      const bool shared =
          group[s] >= 0 && index < static_cast<int64_t>(group_pages[group[s]].size());
      const int64_t page = shared ? group_pages[group[s]][index] : order[next++];
      c.page_table[s][index] = page;
      const int64_t n = std::min(page_size, t_k[s] - j);
      k_rows.push_back(real(c.key_pages, c.key_scales, page).narrow(1, 0, n));
      v_rows.push_back(real(c.value_pages, c.value_scales, page).narrow(1, 0, n));
    }
    c.keys.push_back(t_k[s] ? torch::cat(k_rows, 1)
                            : torch::empty({kv_heads, 0, d}, torch::kDouble));
    c.values.push_back(t_k[s] ? torch::cat(v_rows, 1)
                              : torch::empty({kv_heads, 0, d}, torch::kDouble));
    starts.push_back(starts.back() + t_q[s]);
  }
  c.query = torch::randn({starts.back(), heads, d}).to(quantized ? torch::kFloat : dtype);
  c.cu_seqlens_q = torch::tensor(starts, torch::kLong);
  c.key_lengths = torch::tensor(t_k, torch::kLong);
  return c;
}

// Each sequence alone on Math in float64, with `per_sequence(s)` options where given.
torch::Tensor each_alone(const SharedCase& c, const std::function<O(int64_t)>& per_sequence) {
  std::vector<torch::Tensor> parts;
  for (size_t s = 0; s < c.keys.size(); ++s) {
    const int64_t begin = c.cu_seqlens_q[s].item<int64_t>();
    const int64_t n = c.cu_seqlens_q[s + 1].item<int64_t>() - begin;
    if (n == 0) continue;
    auto o = O(per_sequence(static_cast<int64_t>(s))).backend(F::Backend::Math);
    if (o.sinks().defined()) o.sinks(o.sinks().to(torch::kDouble));
    if (o.alibi_slopes().defined()) o.alibi_slopes(o.alibi_slopes().to(torch::kDouble));
    const int64_t d = c.query.size(-1);
    const auto q =
        test::reference_queries(c.query.narrow(0, begin, n), test::softmax_scale(o.scale(), d),
                                c.key_pages.scalar_type(), c.values[s].size(-1))
            .transpose(0, 1);
    parts.push_back(
        F::scaled_dot_product_attention(q, c.keys[s], c.values[s], o).output.transpose(0, 1));
  }
  return torch::cat(parts, 0);
}

// The fused kernel, keys split in `splits` parts (0: as the threads decide), sharing or not.
torch::Tensor fused(const SharedCase& c, const O& options, int64_t splits, bool share) {
  const auto p =
      K::make_paged_problem(c.query, c.key_pages, c.value_pages, c.cu_seqlens_q, c.key_lengths,
                            c.page_table, options, "test", c.key_scales, c.value_scales);
  return K::paged_forward(p, c.query, c.key_pages, c.value_pages, K::paged_table(c.page_table),
                          splits, c.key_scales, c.value_scales, share);
}

// The largest bound of the weights' coding over the case's sequences (test::weight_coding_bound).
double weight_coding_tolerance(const SharedCase& c) {
  double most = 0;
  for (const auto& v : c.values) {
    most = std::max(most, test::weight_coding_bound(
                              v.size(1), v.abs().max().item<double>(), c.key_pages.scalar_type(),
                              c.query.scalar_type(), c.query.size(-1), v.size(-1)));
  }
  return most;
}

double tolerance_of(torch::Dtype dtype) {
  if (dtype == torch::kDouble) return 1e-10;
  if (dtype == torch::kBFloat16) return 2e-2;
  return 3e-5;  // float queries, on float or 8-bit pages
}

}  // namespace shared_prefix_test

using namespace shared_prefix_test;

TEST_CASE("find_shared_prefixes: groups by first page, the common run of whole visible pages",
          "[paged][shared_prefix]") {
  using K::KeyRange;
  // Rows of 4 entries, pages of 10 keys.
  const std::vector<int64_t> table = {
      7, 8, 9,  1,   // 0: shares 7 8 9 with 2, and 7 8 with 4
      3, 4, -1, -1,  // 1: alone with first page 3
      7, 8, 9,  2,   // 2
      5, 6, -1, -1,  // 3: first page 5, as 5's, but its queries see keys from 4 on
      7, 8, 0,  -1,  // 4
      5, 6, 11, 12,  // 5
      5, 6, 10, -1,  // 6: with 5 on pages 5 6, but sees only 15 keys (one whole page)
  };
  const std::vector<KeyRange> keys = {{0, 40}, {0, 20}, {0, 31}, {4, 20},
                                      {0, 25}, {0, 40}, {0, 15}};
  const auto prefixes = K::find_shared_prefixes(table.data(), 7, 4, 10, keys);
  REQUIRE(prefixes.size() == 2);
  CHECK(prefixes[0].sequences == std::vector<int64_t>{0, 2, 4});
  CHECK(prefixes[0].pages == 2);  // 4 departs at its third page
  CHECK(prefixes[1].sequences == std::vector<int64_t>{5, 6});
  CHECK(prefixes[1].pages == 1);  // 6 sees one whole page
  // Without 4, 0 and 2 share three pages (2 sees 31 keys: three whole pages).
  auto without = keys;
  without[4] = {0, 0};
  const auto three = K::find_shared_prefixes(table.data(), 7, 4, 10, without);
  REQUIRE(three.size() == 2);
  CHECK(three[0].sequences == std::vector<int64_t>{0, 2});
  CHECK(three[0].pages == 3);
  // Nothing shared: every first page its own, or no whole page seen.
  const std::vector<KeyRange> short_keys(7, KeyRange{0, 9});
  CHECK(K::find_shared_prefixes(table.data(), 7, 4, 10, short_keys).empty());
  CHECK(K::find_shared_prefixes(table.data(), 2, 4, 10, keys).empty());
  CHECK(K::find_shared_prefixes(table.data(), 0, 4, 10, {}).empty());
}

TEST_CASE("shared prefixes: a step of sharers, in shuffled order, equals each sequence alone",
          "[paged][shared_prefix]") {
  torch::NoGradGuard no_grad;
  // Decoding sharers of group 0 (one of them shorter than the prefix), a prompt chunk after the
  // same prefix, sharers of group 1, and sequences that share nothing, interleaved.
  const std::vector<int64_t> t_q = {1, 1, 40, 1, 0, 3, 1, 1, 2};
  const std::vector<int64_t> t_k = {300, 70, 340, 290, 200, 150, 260, 140, 130};
  const std::vector<int64_t> group = {0, -1, 0, 0, 0, 1, -1, 1, 0};
  const std::vector<int64_t> prefix_pages = {16, 7};
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{16, 1}, {4, 2}}) {
    for (const auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16, torch::kChar}) {
      const auto c =
          make_shared_case(t_q, t_k, group, prefix_pages, heads, kv_heads, 32, 16, dtype, 21);
      for (const bool causal : {true, false}) {
        const auto options = O().is_causal(causal);
        const auto expected = each_alone(c, [&](int64_t) { return options; });
        for (const int64_t splits : {0, 1, 3}) {
          INFO(heads << " heads on " << kv_heads << ", " << c10::toString(dtype) << ", causal "
                     << causal << ", splits " << splits);
          const auto shared = fused(c, options, splits, true);
          const int64_t stacked = K::paged_forward_last_shared_rows();
          // Group 0's rows: its five sequences' queries (1 + 40 + 1 + 0 + 2) x heads; group 1's:
          // 3 + 1 queries.
          CHECK(stacked == (1 + 40 + 1 + 2 + 3 + 1) * heads);
          const auto alone = fused(c, options, splits, false);
          CHECK(K::paged_forward_last_shared_rows() == 0);
          // 8-bit pages: the weights' coding moves each sequence's rows on its own runs of keys.
          const double coding = weight_coding_tolerance(c);
          CHECK(test::max_abs_diff(shared.to(torch::kDouble), expected) <
                tolerance_of(dtype) + coding);
          CHECK(test::max_abs_diff(shared.to(torch::kDouble), alone.to(torch::kDouble)) <
                tolerance_of(dtype) + 2 * coding);
        }
      }
    }
  }
}

TEST_CASE("shared prefixes: every option holds per sequence", "[paged][shared_prefix]") {
  torch::NoGradGuard no_grad;
  // Sharers of a prefix of 16 pages of 16: decoding at 399, a chunk at 310-329, a chunk at
  // 270-299, decoding at 256; and a sequence that shares nothing.
  const std::vector<int64_t> t_q = {1, 20, 30, 1, 1};
  const std::vector<int64_t> t_k = {400, 330, 300, 70, 257};
  const std::vector<int64_t> group = {0, 0, 0, -1, 0};
  const int64_t heads = 16;
  const auto sinks = torch::randn({heads}, torch::kDouble);
  struct Variant {
    std::string name;
    O options;
    int64_t shared_queries;  // the queries of the sequences whose first key some query sees
  };
  const std::vector<Variant> variants = {
      {"causal", O().is_causal(true), 1 + 20 + 30 + 1},
      // The first queries see the first keys: the chunks share their first whole page.
      {"top-left", O().is_causal(true).causal_alignment(F::CausalAlignment::TopLeft), 20 + 30},
      // The chunk at 270 and the step at 256 see key 0 (the chunk's later queries do not); the
      // others' windows begin past it.
      {"window", O().is_causal(true).window_left(275), 30 + 1},
      {"window past the prefix", O().is_causal(true).window_left(20), 0},
      {"window, not causal", O().window_left(300).window_right(3), 30 + 1},
      {"alibi", O().is_causal(true).alibi_slopes(F::alibi_slopes(heads)), 52},
      {"softcap", O().is_causal(true).softcap(1.5), 52},
      {"sinks", O().is_causal(true).sinks(sinks), 52},
      {"scale, not causal", O().scale(0.7), 52},
      {"all",
       O().is_causal(true).window_left(290).softcap(3.0).sinks(sinks).alibi_slopes(
           F::alibi_slopes(heads)),
       30 + 1},
  };
  for (const int64_t kv_heads : {1, 4}) {
    const auto c =
        make_shared_case(t_q, t_k, group, {16}, heads, kv_heads, 16, 16, torch::kDouble, 22);
    for (const auto& v : variants) {
      const auto expected = each_alone(c, [&](int64_t) { return v.options; });
      for (const int64_t splits : {1, 4}) {
        INFO(v.name << ", kv heads " << kv_heads << ", splits " << splits);
        CHECK(test::max_abs_diff(fused(c, v.options, splits, true), expected) < 1e-10);
        CHECK(K::paged_forward_last_shared_rows() == v.shared_queries * heads);
      }
    }
  }
}

TEST_CASE("shared prefixes: a block mask, a relative bias and a score_mod per sequence",
          "[paged][shared_prefix][block_mask][relative_bias][score_mod]") {
  torch::NoGradGuard no_grad;
  // Each sequence's drafts (its last Tq keys) form a tree over the shared prompt, as in
  // speculative decoding of several requests.
  const std::vector<int64_t> t_q = {3, 1, 5, 2}, t_k = {70, 50, 75, 40};
  const std::vector<int64_t> group = {0, 0, 0, -1};
  const auto mask = test::draft_tree_mask(t_q, t_k, 8);
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {16, 1}}) {
    INFO("heads " << heads << ", kv_heads " << kv_heads);
    const auto c =
        make_shared_case(t_q, t_k, group, {4}, heads, kv_heads, 16, 8, torch::kDouble, 23);
    const auto table = torch::randn({16, heads}, torch::kDouble);
    const auto base =
        O().relative_bias(table).relative_buckets(F::RelativeBuckets::t5(16, 32, false));
    const auto expected = each_alone(c, [&](int64_t s) {
      return O(base)
          .block_mask(test::draft_tree_mask({t_q[s]}, {t_k[s]}, 8))
          .score_mod(test::scaled_by_head_and_sequence(s));
    });
    const auto options = O(base).block_mask(mask).score_mod(test::scaled_by_head_and_sequence(-1));
    for (const int64_t splits : {1, 3}) {
      INFO("splits " << splits);
      CHECK(test::max_abs_diff(fused(c, options, splits, true), expected) < 1e-10);
      CHECK(K::paged_forward_last_shared_rows() == (3 + 1 + 5) * heads);
    }
    // Through the public function too (sharing is on unless switched off).
    CHECK(test::max_abs_diff(F::paged_attention(c.query, c.key_pages, c.value_pages, c.cu_seqlens_q,
                                                c.key_lengths, c.page_table, options),
                             expected) < 1e-10);
    CHECK(K::paged_forward_last_shared_rows() == (3 + 1 + 5) * heads);
  }
}

TEST_CASE("shared prefixes: a NaN or inf in a shared page reaches only the rows that see it",
          "[paged][shared_prefix]") {
  torch::NoGradGuard no_grad;
  // Two decoding sharers (at 59 and 65) and a prompt chunk at 64-123, a window of 70: every row
  // but the chunk's last 13 sees key 40, in the shared prefix (three pages of 16: the step at 59
  // holds three whole ones).
  const auto c =
      make_shared_case({1, 1, 60}, {60, 66, 124}, {0, 0, 0}, {4}, 16, 1, 16, 16, torch::kFloat, 24);
  const auto options = O().is_causal(true).window_left(70);
  const int64_t page = c.page_table[0][2].item<int64_t>();
  c.value_pages[page][0][8][0] = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t splits : {1, 3}) {
    INFO("splits " << splits);
    const auto out = fused(c, options, splits, true);
    // The chunk's last item (queries 56-59 at 120-123) sees no key of the shared pages.
    REQUIRE(K::paged_forward_last_shared_rows() == 58 * 16);
    const auto alone = fused(c, options, splits, false);
    const auto nan = out.isnan().any(-1).any(-1);  // per query
    CHECK(torch::equal(nan, alone.isnan().any(-1).any(-1)));
    CHECK(nan.sum().item<int64_t>() == 62 - 13);
    const auto finite = ~nan;
    CHECK(test::max_abs_diff(out.index({finite}), alone.index({finite})) < 3e-5);
    const auto expected = each_alone(c, [&](int64_t) { return options; });
    CHECK(test::max_abs_diff(out.index({finite}), expected.index({finite})) < 3e-5);
  }
}

TEST_CASE("shared prefixes: a cache's shared pages, by prefix caching and by forks",
          "[paged][shared_prefix][paged_kv_cache]") {
  torch::NoGradGuard no_grad;
  // A prompt of 40 tokens in pages of 8: a first request writes it; two later requests with the
  // same prompt find its five pages; a fork of the first shares all of them.
  attention::PagedKVCache cache(attention::PagedKVCacheOptions(64, 8, 2, 16));
  const auto prompt = torch::arange(40, torch::kLong);
  const int64_t first = cache.add_sequence(prompt).sequence;
  auto batch = cache.extend({first}, {40});
  const auto keys = torch::randn({40, 2, 16}), values = torch::randn({40, 2, 16});
  cache.write(0, batch, keys, values);
  const auto hit_a = cache.add_sequence(torch::cat({prompt, torch::tensor({100, 101})}));
  const auto hit_b = cache.add_sequence(torch::cat({prompt, torch::tensor({200})}));
  REQUIRE(hit_a.cached_tokens == 40);
  REQUIRE(hit_b.cached_tokens == 40);
  const int64_t fork = cache.fork_sequence(first);
  // Each writes its own new tokens, then all decode one more together.
  batch = cache.extend({hit_a.sequence, hit_b.sequence, fork}, {2, 1, 3});
  const auto own_k = torch::randn({6, 2, 16}), own_v = torch::randn({6, 2, 16});
  cache.write(0, batch, own_k, own_v);
  batch = cache.extend({first, hit_a.sequence, hit_b.sequence, fork}, {1, 1, 1, 1});
  const auto step_k = torch::randn({4, 2, 16}), step_v = torch::randn({4, 2, 16});
  cache.write(0, batch, step_k, step_v);
  const auto q = torch::randn({4, 8, 16});
  const auto options = O().is_causal(true);
  const auto out = F::paged_attention(q, cache.keys(0), cache.values(0), batch.query_starts(),
                                      batch.key_lengths(), batch.page_table(), options);
  CHECK(K::paged_forward_last_shared_rows() == 4 * 8);
  // Each sequence's keys: the prompt's, its own, the step's.
  const std::vector<std::vector<int64_t>> own_rows = {{}, {0, 1}, {2}, {3, 4, 5}};
  for (int64_t s = 0; s < 4; ++s) {
    std::vector<torch::Tensor> k{keys}, v{values};
    for (const int64_t r : own_rows[s]) {
      k.push_back(own_k[r].unsqueeze(0));
      v.push_back(own_v[r].unsqueeze(0));
    }
    k.push_back(step_k[s].unsqueeze(0));
    v.push_back(step_v[s].unsqueeze(0));
    const auto heads_first = [](const std::vector<torch::Tensor>& rows) {
      return torch::cat(rows).transpose(0, 1).to(torch::kDouble);
    };
    const auto expected =
        F::scaled_dot_product_attention(q[s].unsqueeze(1).to(torch::kDouble), heads_first(k),
                                        heads_first(v), O(options).backend(F::Backend::Math))
            .output;
    INFO("sequence " << s);
    CHECK(test::max_abs_diff(out[s], expected.squeeze(1)) < 3e-5);
  }
}
