// Attention over the pages of a cache: functional::paged_attention against each sequence alone
// (scaled_dot_product_attention on Math), for mixed batches of prefilling and decoding sequences,
// with the keys split across threads or not, with a block mask, a relative bias and a score_mod
// per sequence; MultiHeadAttention::forward_paged against forward() on each sequence alone.

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/multi_head_attention.h>
#include <attention/paged_attention.h>
#include <attention/paged_kv_cache.h>
#include <attention/score_mod.h>

#include "draft_trees.h"
#include "helpers.h"
#include "kernels/paged.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace {

namespace F = attention::functional;
using O = F::ScaledDotProductAttentionOptions;

// Sequences of Tq_i queries against Tk_i keys, the keys in pages of a pool in shuffled order.
struct PagedCase {
  torch::Tensor query, key_pages, value_pages, cu_seqlens_q, key_lengths, page_table;
  std::vector<torch::Tensor> keys, values;  // each sequence's (Hkv, Tk_i, d), for the reference
};

PagedCase make_paged_case(const std::vector<int64_t>& t_q, const std::vector<int64_t>& t_k,
                          int64_t heads, int64_t kv_heads, int64_t d, int64_t page_size,
                          torch::Dtype dtype, uint32_t seed) {
  torch::manual_seed(seed);
  PagedCase c;
  const int64_t count = static_cast<int64_t>(t_q.size());
  int64_t pages = 0, widest = 0;
  for (const int64_t n : t_k) {
    pages += (n + page_size - 1) / page_size;
    widest = std::max(widest, (n + page_size - 1) / page_size);
  }
  std::vector<int64_t> order(pages + 3);  // a few pages no sequence holds
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  c.key_pages = torch::randn({pages + 3, kv_heads, page_size, d}).to(dtype);
  c.value_pages = torch::randn({pages + 3, kv_heads, page_size, d}).to(dtype);
  c.page_table = torch::full({count, widest}, -1, torch::kLong);
  std::vector<int64_t> starts{0};
  int64_t next = 0;
  for (int64_t s = 0; s < count; ++s) {
    std::vector<torch::Tensor> k_rows, v_rows;
    for (int64_t j = 0; j < t_k[s]; j += page_size) {
      const int64_t page = order[next++];
      c.page_table[s][j / page_size] = page;
      const int64_t n = std::min(page_size, t_k[s] - j);
      k_rows.push_back(c.key_pages[page].narrow(1, 0, n));
      v_rows.push_back(c.value_pages[page].narrow(1, 0, n));
    }
    c.keys.push_back(t_k[s] ? torch::cat(k_rows, 1) : torch::empty({kv_heads, 0, d}, dtype));
    c.values.push_back(t_k[s] ? torch::cat(v_rows, 1) : torch::empty({kv_heads, 0, d}, dtype));
    starts.push_back(starts.back() + t_q[s]);
  }
  c.query = torch::randn({starts.back(), heads, d}).to(dtype);
  c.cu_seqlens_q = torch::tensor(starts, torch::kLong);
  c.key_lengths = torch::tensor(t_k, torch::kLong);
  return c;
}

// Each sequence alone through scaled_dot_product_attention on Math, in float64: (total_q, H, d).
torch::Tensor paged_reference(const PagedCase& c, const O& options) {
  std::vector<torch::Tensor> parts;
  const auto starts = c.cu_seqlens_q;
  for (size_t s = 0; s < c.keys.size(); ++s) {
    const int64_t begin = starts[s].item<int64_t>(), n = starts[s + 1].item<int64_t>() - begin;
    if (n == 0) continue;
    const auto q = c.query.narrow(0, begin, n).transpose(0, 1).to(torch::kDouble);
    auto o = O(options).backend(F::Backend::Math);
    if (o.sinks().defined()) o.sinks(o.sinks().to(torch::kDouble));
    if (o.alibi_slopes().defined()) o.alibi_slopes(o.alibi_slopes().to(torch::kDouble));
    parts.push_back(F::scaled_dot_product_attention(q, c.keys[s].to(torch::kDouble),
                                                    c.values[s].to(torch::kDouble), o)
                        .output.transpose(0, 1));
  }
  return torch::cat(parts, 0);
}

torch::Tensor paged(const PagedCase& c, const O& options) {
  return F::paged_attention(c.query, c.key_pages, c.value_pages, c.cu_seqlens_q, c.key_lengths,
                            c.page_table, options);
}

// The fused kernel with its keys split in `splits` parts (0: as the threads decide).
torch::Tensor paged_split(const PagedCase& c, const O& options, int64_t splits) {
  namespace K = attention::kernels;
  const auto p = K::make_paged_problem(c.query, c.key_pages, c.value_pages, c.cu_seqlens_q,
                                       c.key_lengths, c.page_table, options, "test");
  return K::paged_forward(p, c.query, c.key_pages, c.value_pages, K::paged_table(c.page_table),
                          splits);
}

}  // namespace

TEST_CASE("paged_attention: a mixed batch equals each sequence alone, in place, split or not",
          "[paged]") {
  torch::NoGradGuard no_grad;
  // Decoding (1 query), short and long prompt chunks, a sequence with no query, one with no key.
  const std::vector<int64_t> t_q = {1, 40, 0, 3, 1, 300, 2};
  const std::vector<int64_t> t_k = {700, 40, 9, 50, 1, 1000, 0};
  for (const int64_t kv_heads : {4, 2, 1}) {
    for (const int64_t page_size : {16, 7}) {
      const auto c = make_paged_case(t_q, t_k, 4, kv_heads, 32, page_size, torch::kFloat, 11);
      for (const bool causal : {true, false}) {
        const auto expected = paged_reference(c, O().is_causal(causal));
        INFO("kv heads " << kv_heads << ", page size " << page_size << ", causal " << causal);
        const auto out = paged(c, O().is_causal(causal));
        CHECK(F::last_path() == F::Path::ChunkedFused);
        CHECK(out.sizes() == c.query.sizes());
        CHECK(test::max_abs_diff(out, expected) < 2e-5);
        for (const int64_t splits : {1, 3}) {
          INFO("splits " << splits);
          CHECK(test::max_abs_diff(paged_split(c, O().is_causal(causal), splits), expected) < 2e-5);
          CHECK(attention::kernels::paged_forward_last_parts() == splits);
        }
        // The reference path gathers the pages and computes on whole matrices.
        CHECK(test::max_abs_diff(paged(c, O().is_causal(causal).backend(F::Backend::Math)),
                                 expected) < 2e-5);
        CHECK(F::last_path() == F::Path::Math);
      }
    }
  }
}

TEST_CASE("paged_attention: every option holds per sequence", "[paged]") {
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> t_q = {1, 30, 2, 70};
  const std::vector<int64_t> t_k = {300, 30, 41, 400};
  const auto c = make_paged_case(t_q, t_k, 6, 2, 16, 16, torch::kDouble, 12);
  const auto sinks = torch::randn({6}, torch::kDouble);
  const std::vector<std::pair<std::string, O>> variants = {
      {"window", O().is_causal(true).window_left(20)},
      {"window, not causal", O().window_left(9).window_right(3)},
      {"alibi", O().is_causal(true).alibi_slopes(F::alibi_slopes(6))},
      {"softcap", O().is_causal(true).softcap(1.5)},
      {"sinks", O().is_causal(true).sinks(sinks)},
      {"top-left", O().is_causal(true).causal_alignment(F::CausalAlignment::TopLeft)},
      {"scale", O().scale(0.7)},
      {"all", O().is_causal(true).window_left(33).softcap(3.0).sinks(sinks).alibi_slopes(
                  F::alibi_slopes(6))},
  };
  for (const auto& [name, options] : variants) {
    const auto expected = paged_reference(c, options);
    for (const int64_t splits : {1, 4}) {
      INFO(name << ", splits " << splits);
      CHECK(test::max_abs_diff(paged_split(c, options, splits), expected) < 1e-10);
    }
    INFO(name << ", Math");
    CHECK(test::max_abs_diff(paged(c, O(options).backend(F::Backend::Math)), expected) < 1e-10);
  }
}

TEST_CASE("paged_attention: a tree of draft tokens over each prefix, a relative bias, a score_mod",
          "[paged][block_mask][relative_bias][score_mod]") {
  torch::NoGradGuard no_grad;
  // Each sequence verifies its draft tokens (the last Tq of its keys): every one sees the cached
  // prefix and the drafts on its own branch of the tree (j's draft index shares i's parity, and
  // is no later).
  const std::vector<int64_t> t_q = {3, 1, 5}, t_k = {40, 17, 25};
  const auto mask = test::draft_tree_mask(t_q, t_k, 8);
  // Scores scaled by head and sequence: a tile's batch is its sequence (or the sequence's index,
  // for the sequence alone).
  const auto scaled = test::scaled_by_head_and_sequence;
  // Items of a few rows (one row at a time), and of 16 query heads per key/value head (matrix
  // products).
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {16, 1}}) {
    INFO("heads " << heads << ", kv_heads " << kv_heads);
    const auto c = make_paged_case(t_q, t_k, heads, kv_heads, 16, 8, torch::kDouble, 13);
    const auto table = torch::randn({16, heads}, torch::kDouble);
    const auto base =
        O().relative_bias(table).relative_buckets(F::RelativeBuckets::t5(16, 32, false));
    std::vector<torch::Tensor> parts;
    int64_t q0 = 0;
    for (size_t s = 0; s < t_q.size(); ++s) {
      const int64_t n = t_q[s];
      const auto own = test::draft_tree_mask({n}, {t_k[s]}, 8);
      parts.push_back(F::scaled_dot_product_attention(
                          c.query.narrow(0, q0, n).transpose(0, 1), c.keys[s], c.values[s],
                          O(base)
                              .backend(F::Backend::Math)
                              .block_mask(own)
                              .score_mod(scaled(static_cast<int64_t>(s))))
                          .output.transpose(0, 1));
      q0 += n;
    }
    const auto expected = torch::cat(parts, 0);
    const auto options = O(base).block_mask(mask).score_mod(scaled(-1));
    for (const auto backend : {F::Backend::Auto, F::Backend::Chunked, F::Backend::Math}) {
      INFO("backend " << static_cast<int>(backend));
      const auto got = paged(c, O(options).backend(backend));
      if (backend == F::Backend::Chunked) CHECK(F::last_path() == F::Path::ChunkedFused);
      CHECK(test::max_abs_diff(got, expected) < 1e-10);
    }
    // The pages read in place, the keys split across threads or not.
    for (const int64_t splits : {1, 3}) {
      INFO("splits " << splits);
      CHECK(test::max_abs_diff(paged_split(c, options, splits), expected) < 1e-10);
      if (kv_heads == 1) CHECK(attention::kernels::paged_forward_last_matrix_tiles() > 0);
    }
    // Each alone makes a difference: the tree, the bias and the modification.
    const auto plain = paged(c, O());
    CHECK(test::max_abs_diff(paged(c, O().block_mask(mask)), plain) > 1e-3);
    CHECK(test::max_abs_diff(paged(c, base), plain) > 1e-3);
    CHECK(test::max_abs_diff(paged(c, O().score_mod(scaled(-1))), plain) > 1e-3);
  }
}

TEST_CASE("paged_attention: bfloat16 pages are read as they are", "[paged]") {
  torch::NoGradGuard no_grad;
  const auto c = make_paged_case({1, 1, 17}, {900, 33, 200}, 8, 2, 64, 32, torch::kBFloat16, 13);
  const auto expected = paged_reference(c, O().is_causal(true));
  for (const int64_t splits : {1, 3}) {
    const auto out = paged_split(c, O().is_causal(true), splits);
    CHECK(out.scalar_type() == torch::kBFloat16);
    CHECK(test::max_abs_diff(out, expected) < 1e-2);
  }
}

TEST_CASE("paged_attention: one sequence's decoding is split across two threads", "[paged]") {
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto c = make_paged_case({1}, {5000}, 8, 1, 64, 64, torch::kFloat, 14);
  const auto out = paged(c, O().is_causal(true));
  CHECK(attention::kernels::paged_forward_last_parts() == 2);
  CHECK(test::max_abs_diff(out, paged_reference(c, O().is_causal(true))) < 2e-5);
  at::set_num_threads(threads);
}

TEST_CASE("paged_attention: items of many rows meet their keys in matrix products", "[paged]") {
  torch::NoGradGuard no_grad;
  namespace K = attention::kernels;
  // 32 query heads on one key/value head (a multi-query step: one item of 32 rows) and on two
  // (16 rows each), and a prompt chunk of one head per key/value head (16 query rows an item),
  // each with every option; the tiles every row sees whole take the products.
  const auto sinks = torch::randn({32}, torch::kDouble);
  const std::vector<std::pair<std::string, O>> variants = {
      {"causal", O().is_causal(true)},
      {"window", O().is_causal(true).window_left(300)},
      {"alibi, softcap, sinks",
       O().is_causal(true).alibi_slopes(F::alibi_slopes(32)).softcap(2.0).sinks(sinks)},
      {"not causal", O().scale(0.3)},
  };
  struct Shape {
    std::vector<int64_t> t_q, t_k;
    int64_t heads, kv_heads;
  };
  const std::vector<Shape> shapes = {
      {{1, 1}, {1500, 700}, 32, 1}, {{1}, {900}, 32, 2}, {{200, 1}, {600, 333}, 2, 2}};
  for (const auto& shape : shapes) {
    for (const auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
      const auto c =
          make_paged_case(shape.t_q, shape.t_k, shape.heads, shape.kv_heads, 32, 16, dtype, 17);
      for (const auto& [name, options] : variants) {
        if (options.alibi_slopes().defined() && shape.heads != 32) continue;
        auto typed = options;
        if (typed.sinks().defined()) typed.sinks(typed.sinks().to(dtype));
        if (typed.alibi_slopes().defined()) typed.alibi_slopes(typed.alibi_slopes().to(dtype));
        const auto expected = paged_reference(c, options);
        const double tolerance =
            dtype == torch::kDouble ? 1e-10 : (dtype == torch::kFloat ? 2e-5 : 2e-2);
        for (const int64_t splits : {1, 3}) {
          INFO(shape.heads << " heads on " << shape.kv_heads << ", " << c10::toString(dtype) << ", "
                           << name << ", splits " << splits);
          CHECK(test::max_abs_diff(paged_split(c, typed, splits), expected) < tolerance);
          CHECK(K::paged_forward_last_matrix_tiles() > 0);
        }
      }
    }
  }
  // Fewer rows than the products' granule keep the one-row products.
  const auto few = make_paged_case({1}, {900}, 8, 1, 32, 16, torch::kFloat, 18);
  CHECK(test::max_abs_diff(paged(few, O().is_causal(true)),
                           paged_reference(few, O().is_causal(true))) < 2e-5);
  CHECK(K::paged_forward_last_matrix_tiles() == 0);
}

TEST_CASE("paged_attention: a value only later queries see stays out of a prompt chunk's rows",
          "[paged]") {
  torch::NoGradGuard no_grad;
  // Items of 16 rows (the matrix route) over a chunk of 40 queries: only the last query sees the
  // last key, whose value is NaN, and only the first sees none of the keys past its diagonal.
  for (const int64_t kv_heads : {4, 1}) {
    auto c = make_paged_case({40}, {400}, 4, kv_heads, 32, 16, torch::kFloat, 19);
    const int64_t page = c.page_table[0][399 / 16].item<int64_t>();
    c.value_pages[page][0][399 % 16][5] = std::numeric_limits<float>::quiet_NaN();
    for (const int64_t splits : {1, 2}) {
      INFO(kv_heads << " key/value heads, splits " << splits);
      const auto out = paged_split(c, O().is_causal(true), splits);
      CHECK(attention::kernels::paged_forward_last_matrix_tiles() > 0);
      const auto head0 = out.select(1, 0);
      CHECK(torch::isfinite(head0.narrow(0, 0, 39)).all().item<bool>());
      CHECK(torch::isnan(head0[39]).any().item<bool>());
      // Heads of other key/value heads read other values: finite.
      if (kv_heads == 4) CHECK(torch::isfinite(out.narrow(1, 1, 3)).all().item<bool>());
    }
  }
}

TEST_CASE("paged_attention: the contract's classes", "[paged]") {
  torch::NoGradGuard no_grad;
  auto c = make_paged_case({2, 1}, {400, 300}, 2, 2, 8, 16, torch::kFloat, 15);
  // A NaN key that the first sequence's queries see: their rows are NaN, the other sequence's not.
  const int64_t page = c.page_table[0][10].item<int64_t>();
  c.key_pages[page][1][3][0] = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t splits : {1, 5}) {
    const auto out = paged_split(c, O().is_causal(true), splits);
    CHECK(torch::isnan(out.narrow(0, 0, 2).select(1, 1)).all().item<bool>());
    CHECK(torch::isfinite(out.narrow(0, 0, 2).select(1, 0)).all().item<bool>());
    CHECK(torch::isfinite(out.narrow(0, 2, 1)).all().item<bool>());
  }
  // Queries of a sequence without keys see nothing: zeros.
  const auto none = make_paged_case({3}, {0}, 2, 1, 8, 4, torch::kFloat, 16);
  CHECK(paged(none, O().is_causal(true)).abs().max().item<float>() == 0.0f);
}

TEST_CASE("forward_paged: each sequence gets what forward() gives it with a KVCache", "[paged]") {
  torch::NoGradGuard no_grad;
  using attention::MultiHeadAttentionOptions;
  const std::vector<std::pair<std::string, MultiHeadAttentionOptions>> modules = {
      {"mha", MultiHeadAttentionOptions(16, 32, 4)},
      {"gqa, rope", MultiHeadAttentionOptions(16, 32, 4).num_kv_heads(2).rope(
                        F::RotaryOptions().theta(10000.0))},
      {"mqa, window, alibi, sinks",
       MultiHeadAttentionOptions(16, 32, 4).num_kv_heads(1).sliding_window(6).alibi(true).sinks(
           true)},
  };
  for (const auto& [name, options] : modules) {
    INFO(name);
    torch::manual_seed(17);
    attention::MultiHeadAttention mha(options);
    const std::vector<int64_t> lengths = {23, 5, 40};
    auto cache_options =
        attention::PagedKVCacheOptions(64, 4, mha->options.num_kv_heads(), mha->head_dim());
    if (options.sliding_window()) cache_options.sliding_window(*options.sliding_window());
    attention::PagedKVCache cache(cache_options);
    std::vector<torch::Tensor> x, outputs(3);
    std::vector<int64_t> ids, done(3, 0);
    for (const int64_t n : lengths) {
      x.push_back(torch::randn({n, 16}));
      ids.push_back(cache.add_sequence());
    }
    // Steps of chunks and single tokens until every sequence is through.
    const std::vector<int64_t> chunks = {7, 1, 1, 9, 1, 3};
    std::vector<std::vector<torch::Tensor>> pieces(3);
    for (size_t step = 0; done != lengths; ++step) {
      std::vector<int64_t> sequences, counts;
      std::vector<torch::Tensor> rows;
      for (int64_t s = 0; s < 3; ++s) {
        const int64_t n = std::min(chunks[(step + s) % chunks.size()], lengths[s] - done[s]);
        if (n == 0) continue;
        sequences.push_back(ids[s]);
        counts.push_back(n);
        rows.push_back(x[s].narrow(0, done[s], n));
      }
      const auto batch = cache.extend(sequences, counts);
      const auto y = mha->forward_paged(torch::cat(rows), cache, batch);
      CHECK(F::last_path() == F::Path::ChunkedFused);
      int64_t row = 0;
      for (size_t b = 0; b < sequences.size(); ++b) {
        const int64_t s = std::find(ids.begin(), ids.end(), sequences[b]) - ids.begin();
        pieces[s].push_back(y.narrow(0, row, counts[b]));
        row += counts[b];
        done[s] += counts[b];
      }
    }
    for (int64_t s = 0; s < 3; ++s) {
      INFO("sequence " << s);
      CHECK(test::max_abs_diff(torch::cat(pieces[s]), mha(x[s]).output) < 2e-5);
    }
  }
}

TEST_CASE(
    "forward_paged: draft tokens under a tree mask and a score_mod, as forward() with a "
    "KVCache gives them",
    "[paged][block_mask][score_mod]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(18);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(16, 32, 4).num_kv_heads(2).rope(
          F::RotaryOptions().theta(10000.0)));
  attention::PagedKVCache cache(attention::PagedKVCacheOptions(64, 4, 2, mha->head_dim()));
  const std::vector<int64_t> prompts = {20, 11}, drafts = {4, 3};
  // Each draft sees the prompt and the drafts on its own branch (same parity, no later).
  const auto tree = [&](int64_t s, int64_t i, int64_t j) {
    const int64_t draft = j - prompts[s];
    return draft < 0 || (draft <= i && (i - draft) % 2 == 0);
  };
  const auto mask = attention::BlockMask::from_function(
      [&](int64_t s, int64_t, int64_t i, int64_t j) { return tree(s, i, j); }, 2, 1, 4, 24, 4);
  const auto scaled = [](int64_t fixed) {
    return attention::ScoreMod([fixed](const torch::Tensor& x, const attention::ScoreTile& t) {
      return x.mul(1 + 0.3 * static_cast<double>(fixed >= 0 ? fixed : t.batch));
    });
  };
  std::vector<torch::Tensor> prompt_x, draft_x;
  std::vector<int64_t> ids;
  for (size_t s = 0; s < 2; ++s) {
    prompt_x.push_back(torch::randn({prompts[s], 16}));
    draft_x.push_back(torch::randn({drafts[s], 16}));
    ids.push_back(cache.add_sequence());
  }
  mha->forward_paged(torch::cat(prompt_x), cache, cache.extend(ids, prompts));
  const auto batch = cache.extend(ids, drafts);
  // A mask made for fewer keys than the longest sequence: refused before the cache is written.
  const auto before = cache.keys(0).clone();
  CHECK_THROWS_C10(
      mha->forward_paged(
          torch::cat(draft_x), cache, batch,
          attention::PagedForwardOptions().block_mask(attention::BlockMask::from_function(
              [](int64_t, int64_t, int64_t, int64_t) { return true; }, 2, 1, 4, 23))),
      c10::ValueError,
      "attention::MultiHeadAttention::forward_paged: expected a block_mask made for at least 4 "
      "queries and 24 keys (the step's most new tokens of a sequence, its longest sequence), got "
      "one made for 4 and 23");
  // Bit for bit: the pool's unwritten slots may hold NaN, which equal() finds unequal to itself.
  CHECK(torch::equal(cache.keys(0).view(torch::kInt), before.view(torch::kInt)));
  const auto y =
      mha->forward_paged(torch::cat(draft_x), cache, batch,
                         attention::PagedForwardOptions().block_mask(mask).score_mod(scaled(-1)));
  int64_t row = 0;
  for (int64_t s = 0; s < 2; ++s) {
    INFO("sequence " << s);
    attention::KVCache alone(64);
    mha->forward(prompt_x[s].unsqueeze(0),
                 attention::MultiHeadAttentionForwardOptions().kv_cache(&alone));
    const auto own = attention::BlockMask::from_function(
        [&, s](int64_t, int64_t, int64_t i, int64_t j) { return tree(s, i, j); }, 1, 1, drafts[s],
        prompts[s] + drafts[s], 4);
    const auto expected =
        mha->forward(draft_x[s].unsqueeze(0), attention::MultiHeadAttentionForwardOptions()
                                                  .kv_cache(&alone)
                                                  .block_mask(own)
                                                  .score_mod(scaled(s)))
            .output[0];
    CHECK(test::max_abs_diff(y.narrow(0, row, drafts[s]), expected) < 2e-5);
    row += drafts[s];
  }
}

TEST_CASE("scaled_dot_product_attention: a decoding step reads the cache as pages, split",
          "[paged]") {
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto sinks = torch::randn({8}, torch::kDouble);
  const std::vector<std::pair<std::string, O>> variants = {
      {"causal", O().is_causal(true)},
      {"top-left", O().is_causal(true).causal_alignment(F::CausalAlignment::TopLeft)},
      {"window, not causal", O().window_left(90).window_right(2)},
      {"alibi, softcap, sinks",
       O().is_causal(true).alibi_slopes(F::alibi_slopes(8)).softcap(2.0).sinks(sinks)},
      {"scale", O().scale(0.3)},
  };
  for (const auto& [name, options] : variants) {
    for (const int64_t kv_heads : {int64_t{8}, int64_t{2}, int64_t{1}}) {
      for (const int64_t t_q : {int64_t{1}, int64_t{2}}) {
        for (const int64_t batch : {int64_t{1}, int64_t{3}}) {
          torch::manual_seed(31);
          const auto q = torch::randn({batch, 8, t_q, 32}, torch::kDouble);
          const auto k = torch::randn({batch, kv_heads, 700, 32}, torch::kDouble);
          const auto v = torch::randn({batch, kv_heads, 700, 16}, torch::kDouble);
          const auto expected =
              F::scaled_dot_product_attention(q, k, v, O(options).backend(F::Backend::Math)).output;
          INFO(name << ", kv heads " << kv_heads << ", Tq " << t_q << ", batch " << batch);
          const auto got =
              F::scaled_dot_product_attention(q, k, v, O(options).backend(F::Backend::Chunked));
          CHECK(F::last_path() == F::Path::ChunkedFused);
          CHECK(test::max_abs_diff(got.output, expected) < 1e-10);
          // One sequence on one key/value head, seeing all of its keys: split across the two
          // threads (a top-left query or a window sees too few keys to split).
          const bool sees_all = name != "top-left" && name != "window, not causal";
          const int64_t expected_parts = batch == 1 && kv_heads == 1 && sees_all ? 2 : 1;
          CHECK(attention::kernels::paged_forward_last_parts() == expected_parts);
          // The same through the float route, read in place from a cache's strided view.
          const auto cache = torch::randn({batch, kv_heads, 1000, 32}).narrow(2, 0, 700);
          const auto q32 = q.to(torch::kFloat);
          const auto reference = F::scaled_dot_product_attention(
                                     q32.to(torch::kDouble), cache.to(torch::kDouble),
                                     cache.to(torch::kDouble), O(options).backend(F::Backend::Math))
                                     .output;
          auto float_options = O(options).backend(F::Backend::Chunked);
          if (options.sinks().defined()) float_options.sinks(options.sinks().to(torch::kFloat));
          const auto fast =
              F::scaled_dot_product_attention(q32, cache, cache, float_options).output;
          CHECK(test::max_abs_diff(fast, reference) < 2e-5);
        }
      }
    }
  }
  at::set_num_threads(threads);
}

TEST_CASE("scaled_dot_product_attention: Auto decodes through the paged kernel at any length",
          "[paged]") {
  torch::NoGradGuard no_grad;
  const auto q = torch::randn({1, 4, 1, 16});
  for (const int64_t keys : {int64_t{1}, F::kAutoDecodeKeys - 1, F::kAutoDecodeKeys}) {
    const auto k = torch::randn({1, 2, keys, 16});
    const auto out = F::scaled_dot_product_attention(q, k, k, O().is_causal(true)).output;
    CHECK(F::last_path() == F::Path::ChunkedFused);
    const auto expected =
        F::scaled_dot_product_attention(q, k, k, O().is_causal(true).backend(F::Backend::Math))
            .output;
    CHECK(test::max_abs_diff(out, expected) < 1e-5);
  }
  // One query on each of 32 heads that share a key/value head: one item of 32 rows.
  const auto q32 = torch::randn({1, 32, 1, 16});
  const auto k1 = torch::randn({1, 1, 600, 16});
  const auto out = F::scaled_dot_product_attention(q32, k1, k1, O().is_causal(true)).output;
  CHECK(F::last_path() == F::Path::ChunkedFused);
  CHECK(attention::kernels::paged_forward_last_matrix_tiles() > 0);
  CHECK(test::max_abs_diff(out, F::scaled_dot_product_attention(
                                    q32, k1, k1, O().is_causal(true).backend(F::Backend::Math))
                                    .output) < 1e-5);
  // Weights, or a prompt chunk of more rows than an item holds, keep Auto's other rules.
  const auto k = torch::randn({1, 2, 300, 16});
  F::scaled_dot_product_attention(q, k, k, O().need_weights(true));
  CHECK(F::last_path() == F::Path::Math);
  F::scaled_dot_product_attention(torch::randn({1, 4, 9, 16}), k, k, O().is_causal(true));
  CHECK(F::last_path() == F::Path::ChunkedFused);  // Chunked's tiles: 2 x 9 rows per key/value head
}
