// The 8-bit cache: PagedKVCache of dtype Char keeps each token's row of each head as int8 codes
// and a float scale; paged_attention reads the codes in place. Checked: the codes against the
// rows they stand for (the format's bound, half a scale), the fused kernel against the Math
// backend on the keys the codes stand for (every route and item shape, split or not, float and
// bfloat16 queries), the attention against the float cache's (the error quantization brings),
// forks copying scales with their pages, non-finite rows, and every refusal by name.

#include <attention/functional.h>
#include <attention/multi_head_attention.h>
#include <attention/paged_attention.h>
#include <attention/paged_kv_cache.h>

#include "coded_queries.h"
#include "helpers.h"
#include "kernels/paged.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace {

namespace F = attention::functional;
using O = F::ScaledDotProductAttentionOptions;
using attention::PagedBatch;
using attention::PagedKVCache;
using attention::PagedKVCacheOptions;

// An 8-bit cache and a float cache written with the same tokens: `lengths[s]` tokens for each
// sequence, in steps of up to 37 tokens so that pages interleave between sequences.
struct TwoCaches {
  PagedKVCache int8, float32;
  std::vector<int64_t> ids;
  std::vector<torch::Tensor> keys, values;  // each sequence's (T, Hkv, d), as written
};

TwoCaches make_caches(const std::vector<int64_t>& lengths, int64_t kv_heads, int64_t d,
                      int64_t page_size, uint32_t seed) {
  torch::manual_seed(seed);
  int64_t pages = 0;
  for (const int64_t n : lengths) pages += (n + page_size - 1) / page_size;
  const auto options = PagedKVCacheOptions(pages + 2, page_size, kv_heads, d);
  TwoCaches c{PagedKVCache(PagedKVCacheOptions(options).dtype(torch::kChar)),
              PagedKVCache(options),
              {},
              {},
              {}};
  for (const int64_t n : lengths) {
    c.ids.push_back(c.int8.add_sequence());
    c.float32.add_sequence();
    // Keys with a few large channels, as trained models' keys have.
    auto k = torch::randn({n, kv_heads, d});
    k.narrow(2, 0, 2).mul_(8.0);
    c.keys.push_back(k);
    c.values.push_back(torch::randn({n, kv_heads, d}));
  }
  std::vector<int64_t> done(lengths.size(), 0);
  while (done != lengths) {
    std::vector<int64_t> sequences, counts;
    std::vector<torch::Tensor> k, v;
    for (size_t s = 0; s < lengths.size(); ++s) {
      const int64_t n = std::min<int64_t>(37, lengths[s] - done[s]);
      if (n == 0) continue;
      sequences.push_back(c.ids[s]);
      counts.push_back(n);
      k.push_back(c.keys[s].narrow(0, done[s], n));
      v.push_back(c.values[s].narrow(0, done[s], n));
      done[s] += n;
    }
    for (PagedKVCache* cache : {&c.int8, &c.float32}) {
      const PagedBatch step = cache->extend(sequences, counts);
      cache->write(0, step, torch::cat(k), torch::cat(v));
    }
  }
  return c;
}

// The step that reads every sequence with `queries[s]` new queries (already written: the batch's
// lengths are the sequences' own).
struct Reading {
  torch::Tensor cu_seqlens_q, key_lengths, page_table;
};

Reading reading(const PagedKVCache& cache, const std::vector<int64_t>& ids,
                const std::vector<int64_t>& queries) {
  Reading r;
  std::vector<int64_t> starts{0}, lengths;
  int64_t widest = 0;
  for (const int64_t id : ids) widest = std::max<int64_t>(widest, cache.pages(id).size());
  r.page_table = torch::full({static_cast<int64_t>(ids.size()), std::max<int64_t>(widest, 1)}, -1,
                             torch::kLong);
  for (size_t s = 0; s < ids.size(); ++s) {
    const auto pages = cache.pages(ids[s]);
    for (size_t j = 0; j < pages.size(); ++j) r.page_table[s][j] = pages[j];
    lengths.push_back(cache.length(ids[s]));
    starts.push_back(starts.back() + queries[s]);
  }
  r.cu_seqlens_q = torch::tensor(starts, torch::kLong);
  r.key_lengths = torch::tensor(lengths, torch::kLong);
  return r;
}

torch::Tensor int8_attention(const PagedKVCache& cache, const torch::Tensor& q, const Reading& r,
                             const O& options) {
  return F::paged_attention(q, cache.keys(0), cache.key_scales(0), cache.values(0),
                            cache.value_scales(0), r.cu_seqlens_q, r.key_lengths, r.page_table,
                            options);
}

torch::Tensor dequantized(const torch::Tensor& codes, const torch::Tensor& scales) {
  return codes.to(torch::kDouble) * scales.to(torch::kDouble).unsqueeze(-1);
}

// The fused kernel with its keys split in `splits` parts.
torch::Tensor int8_split(const PagedKVCache& cache, const torch::Tensor& q, const Reading& r,
                         const O& options, int64_t splits) {
  namespace K = attention::kernels;
  const char* caller = "test";
  const auto p = K::make_paged_problem(q, cache.keys(0), cache.values(0), r.cu_seqlens_q,
                                       r.key_lengths, r.page_table, options, caller,
                                       cache.key_scales(0), cache.value_scales(0));
  return K::paged_forward(p, q, cache.keys(0), cache.values(0), K::paged_table(r.page_table),
                          splits, cache.key_scales(0), cache.value_scales(0));
}

}  // namespace

TEST_CASE("int8 cache: each row's codes stand for it within half its scale", "[int8_cache]") {
  torch::NoGradGuard no_grad;
  const auto c = make_caches({70, 5}, 2, 40, 16, 1);
  CHECK(c.int8.quantized());
  CHECK_FALSE(c.float32.quantized());
  CHECK_FALSE(c.float32.key_scales(0).defined());
  for (size_t s = 0; s < c.ids.size(); ++s) {
    const auto pages = c.int8.pages(c.ids[s]);
    for (const auto& [codes, scales, rows] :
         {std::tuple{c.int8.keys(0), c.int8.key_scales(0), c.keys[s]},
          {c.int8.values(0), c.int8.value_scales(0), c.values[s]}}) {
      for (int64_t t = 0; t < rows.size(0); ++t) {
        const int64_t page = pages[t / 16], slot = t % 16;
        const auto row_codes = codes[page].select(1, slot);    // (Hkv, d)
        const auto row_scales = scales[page].select(1, slot);  // (Hkv,)
        const auto expected_scales = rows[t].abs().amax(-1) / 127.0;
        CHECK(test::max_abs_diff(row_scales, expected_scales) <=
              1e-7 * expected_scales.max().item<double>());
        const auto error = (dequantized(row_codes, row_scales) - rows[t].to(torch::kDouble)).abs();
        CHECK(
            (error <= row_scales.to(torch::kDouble).unsqueeze(-1) * 0.5000001).all().item<bool>());
        // The largest feature of each row takes the code +-127.
        CHECK(row_codes.abs().amax(-1).eq(127).all().item<bool>());
      }
    }
  }
  // Memory: head_dim bytes and a 4-byte scale per row, keys and values.
  const auto& o = c.int8.options();
  CHECK(c.int8.memory_bytes() == 2 * o.num_pages() * o.page_size() * o.num_kv_heads() * (40 + 4));
  CHECK(c.float32.memory_bytes() == 2 * o.num_pages() * o.page_size() * o.num_kv_heads() * 40 * 4);
}

TEST_CASE("int8 cache: the fused kernel reads the codes as Math reads the keys they stand for",
          "[int8_cache][paged]") {
  torch::NoGradGuard no_grad;
  namespace K = attention::kernels;
  // Decoding (one query), a multi-query step (16 and 32 rows an item: matrix products), a
  // prompt chunk (matrix products and the diagonal one row at a time), a sequence without keys'
  // queries... every item shape of the kernel.
  struct Shape {
    std::vector<int64_t> lengths, queries;
    int64_t heads, kv_heads, d;
  };
  const std::vector<Shape> shapes = {{{700, 1, 90}, {1, 1, 3}, 4, 2, 32},
                                     {{900}, {1}, 32, 1, 32},
                                     {{300, 40}, {200, 1}, 2, 2, 48},
                                     {{33}, {2}, 3, 1, 24}};
  const std::vector<std::pair<std::string, O>> variants = {
      {"causal", O().is_causal(true)},
      {"window", O().is_causal(true).window_left(100)},
      {"softcap, not causal", O().softcap(3.0).scale(0.2)},
  };
  for (const auto& shape : shapes) {
    const auto c = make_caches(shape.lengths, shape.kv_heads, shape.d, 16, 3);
    const auto r = reading(c.int8, c.ids, shape.queries);
    const int64_t total = std::accumulate(shape.queries.begin(), shape.queries.end(), int64_t{0});
    const auto q = torch::randn({total, shape.heads, shape.d});
    const auto keys = dequantized(c.int8.keys(0), c.int8.key_scales(0));
    const auto values = dequantized(c.int8.values(0), c.int8.value_scales(0));
    for (const auto& [name, options] : variants) {
      // The queries as the kernel codes them for its integer products, where it does.
      const auto reference_q = test::reference_queries(
          q, test::softmax_scale(options.scale(), shape.d), torch::kChar, shape.d);
      const auto coded_expected =
          F::paged_attention(reference_q, keys, values, r.cu_seqlens_q, r.key_lengths, r.page_table,
                             O(options).backend(F::Backend::Math));
      const auto expected =
          F::paged_attention(q.to(torch::kDouble), keys, values, r.cu_seqlens_q, r.key_lengths,
                             r.page_table, O(options).backend(F::Backend::Math));
      INFO(shape.heads << " heads on " << shape.kv_heads << ", d " << shape.d << ", " << name);
      const auto out = int8_attention(c.int8, q, r, options);
      CHECK(F::last_path() == F::Path::ChunkedFused);
      CHECK(out.scalar_type() == torch::kFloat);
      // And the weights' coding, over the longest sequence's keys.
      const double coding = test::weight_coding_bound(
          *std::max_element(shape.lengths.begin(), shape.lengths.end()),
          torch::nan_to_num(values, 0.0, 0.0, 0.0).abs().max().item<double>(), torch::kChar,
          torch::kFloat, shape.d, shape.d);
      CHECK(test::max_abs_diff(out, coded_expected) < 2e-5 + coding);
      for (const int64_t splits : {1, 3}) {
        CHECK(test::max_abs_diff(int8_split(c.int8, q, r, options, splits), coded_expected) <
              2e-5 + coding);
      }
      // bfloat16 queries: the products in float, the output rounded once.
      const auto q16 = q.to(torch::kBFloat16);
      const auto expected16 = F::paged_attention(
          test::reference_queries(q16, test::softmax_scale(options.scale(), shape.d), torch::kChar,
                                  shape.d),
          keys, values, r.cu_seqlens_q, r.key_lengths, r.page_table,
          O(options).backend(F::Backend::Math));
      const auto out16 = int8_attention(c.int8, q16, r, options);
      CHECK(out16.scalar_type() == torch::kBFloat16);
      CHECK(test::max_abs_diff(out16, expected16) < 2e-2);
      // Other backends and double queries compute on the keys the codes stand for.
      CHECK(test::max_abs_diff(int8_attention(c.int8, q.to(torch::kDouble), r, options), expected) <
            1e-12);
      CHECK(test::max_abs_diff(int8_attention(c.int8, q, r, O(options).backend(F::Backend::Math)),
                               expected) < 2e-5);
    }
  }
  // The multi-query step's items take the matrix products.
  const auto c = make_caches({900}, 1, 32, 16, 4);
  const auto r = reading(c.int8, c.ids, {1});
  int8_attention(c.int8, torch::randn({1, 32, 32}), r, O().is_causal(true));
  CHECK(K::paged_forward_last_matrix_tiles() > 0);
}

TEST_CASE("int8 cache: attention within quantization's error of the float cache's",
          "[int8_cache]") {
  torch::NoGradGuard no_grad;
  const auto c = make_caches({2000, 300}, 2, 64, 16, 5);
  const auto r = reading(c.int8, c.ids, {1, 4});
  const auto q = torch::randn({5, 8, 64});
  const auto options = O().is_causal(true);
  const auto exact =
      F::paged_attention(q.to(torch::kDouble), c.float32.keys(0).to(torch::kDouble),
                         c.float32.values(0).to(torch::kDouble), r.cu_seqlens_q, r.key_lengths,
                         r.page_table, O(options).backend(F::Backend::Math));
  const auto out = int8_attention(c.int8, q, r, options);
  // Each value feature is off by at most half a scale (max|v| / 254 of its row); each score by
  // at most half a scale per key feature times |q|_1 / sqrt(d), which moves the weights; the keys'
  // large channels make every feature's scale large. Measured here: 0.0095 of the largest value;
  // the float cache is within 2e-5.
  const double largest = c.values[0].abs().max().item<double>();
  const double error = test::max_abs_diff(out, exact);
  INFO("error " << error << " of the largest value " << largest);
  CHECK(error < 0.02 * largest);
  CHECK(error > 1e-5);  // quantized: not the float cache read by mistake
  CHECK(test::max_abs_diff(F::paged_attention(q, c.float32.keys(0), c.float32.values(0),
                                              r.cu_seqlens_q, r.key_lengths, r.page_table, options),
                           exact) < 2e-5);
}

// The codings' stated bounds (kernels/cpu/query_codes.h): each score off by at most half the
// row's code scale times the sum of |k| over the key's features, so each weight by a factor within
// exp(+-2 eps) and each output feature by at most 2 (exp(2 eps) - 1) max |v|; and the weights'
// coding's (test::weight_coding_bound).
TEST_CASE("int8 cache: the 16-bit codes of queries and weights move the output within their bounds",
          "[int8_cache][int8_products]") {
  torch::NoGradGuard no_grad;
  namespace K = attention::kernels;
  const int64_t d = 64;
  if (!K::paged_codes_int8_queries(d, d)) {
    WARN("skipped: 8-bit keys take the widened float products on this route");
    return;
  }
  const auto c = make_caches({2000, 300}, 2, d, 16, 6);
  const auto r = reading(c.int8, c.ids, {1, 4});
  const auto q = torch::randn({5, 8, d}) * 3.0;
  const auto options = O().is_causal(true);
  const auto keys = dequantized(c.int8.keys(0), c.int8.key_scales(0));
  const auto values = dequantized(c.int8.values(0), c.int8.value_scales(0));
  const auto exact =
      F::paged_attention(q.to(torch::kDouble), keys, values, r.cu_seqlens_q, r.key_lengths,
                         r.page_table, O(options).backend(F::Backend::Math));
  const auto out = int8_attention(c.int8, q, r, options);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double largest_code_scale =
      (q.to(torch::kDouble) * scale).abs().max().item<double>() /
      static_cast<double>(attention::kernels::cpu::query_code_limit(d));
  // Over the pool's written rows: a page no sequence wrote has NaN scales.
  const auto written = [](const torch::Tensor& t) { return torch::nan_to_num(t, 0.0, 0.0, 0.0); };
  const double eps = largest_code_scale / 2 * written(keys).abs().sum(-1).max().item<double>();
  const double largest = written(values).abs().max().item<double>();
  const double bound = 2 * std::expm1(2 * eps) * largest + 2e-5 +
                       test::weight_coding_bound(2000, largest, torch::kChar, torch::kFloat, d, d);
  const double error = test::max_abs_diff(out, exact);
  INFO("error " << error << ", bound " << bound << ", eps " << eps << ", largest value "
                << largest);
  CHECK(error <= bound);
}

TEST_CASE("int8 cache: a fork copies the scales with the page it writes to", "[int8_cache]") {
  torch::NoGradGuard no_grad;
  PagedKVCache cache(PagedKVCacheOptions(8, 4, 1, 16).dtype(torch::kChar));
  const int64_t a = cache.add_sequence();
  auto k = torch::randn({6, 1, 16}), v = torch::randn({6, 1, 16});
  cache.write(0, cache.extend({a}, {6}), k, v);  // a: a full page and half of another
  const int64_t b = cache.fork_sequence(a);
  const auto more_a = torch::randn({1, 1, 16}) * 100.0, more_b = torch::randn({1, 1, 16}) * 0.01;
  const auto step = cache.extend({a, b}, {1, 1});
  cache.write(0, step, torch::cat({more_a, more_b}), torch::cat({more_a, more_b}));
  CHECK(cache.pages(a)[1] != cache.pages(b)[1]);
  // Both sequences' keys as written, their shared tokens included, through their own scales.
  for (const auto& [id, last] : {std::pair{a, more_a}, {b, more_b}}) {
    const auto pages = cache.pages(id);
    std::vector<torch::Tensor> rows;
    for (int64_t t = 0; t < 7; ++t) {
      rows.push_back(dequantized(cache.keys(0)[pages[t / 4]].select(1, t % 4),
                                 cache.key_scales(0)[pages[t / 4]].select(1, t % 4)));
    }
    const auto written = torch::cat({k, last}).to(torch::kDouble);
    const auto got = torch::stack(rows);
    CHECK(((got - written).abs() <= written.abs().amax(-1, true) / 254.0 * 1.0000001)
              .all()
              .item<bool>());
  }
}

TEST_CASE("int8 cache: rows of zeros, tiny rows, and rows with NaN or infinity", "[int8_cache]") {
  torch::NoGradGuard no_grad;
  PagedKVCache cache(PagedKVCacheOptions(4, 8, 1, 16).dtype(torch::kChar));
  const int64_t a = cache.add_sequence();
  auto k = torch::randn({5, 1, 16});
  k[1].zero_();                         // scale 0, codes 0
  k[2] = torch::full({1, 16}, 1e-40f);  // subnormal: so is its scale
  k[3][0][5] = std::numeric_limits<float>::quiet_NaN();
  k[4][0][0] = std::numeric_limits<float>::infinity();
  cache.write(0, cache.extend({a}, {5}), k, k);
  const int64_t page = cache.pages(a)[0];
  const auto scales = cache.key_scales(0)[page][0];
  CHECK(scales[1].item<float>() == 0.0f);
  CHECK(scales[2].item<float>() > 0.0f);
  CHECK(std::isnan(scales[3].item<float>()));
  CHECK(std::isnan(scales[4].item<float>()));
  const auto codes = cache.keys(0)[page][0];  // (page_size, d)
  for (const int64_t row : {1, 3, 4}) CHECK(codes[row].eq(0).all().item<bool>());
  CHECK(codes[2].ge(126).all().item<bool>());
  // A query that sees a NaN row is NaN, as with the float cache; one that sees only the finite
  // rows before it is finite.
  const auto q = torch::randn({2, 1, 16});
  const auto table = torch::tensor({page}, torch::kLong).view({1, 1});
  const auto see = [&](int64_t keys) {
    return F::paged_attention(q.narrow(0, 0, 1), cache.keys(0), cache.key_scales(0),
                              cache.values(0), cache.value_scales(0), torch::tensor({0, 1}),
                              torch::tensor({keys}), table, O());
  };
  CHECK(torch::isfinite(see(3)).all().item<bool>());
  CHECK(torch::isnan(see(4)).all().item<bool>());
  CHECK(torch::isnan(see(5)).all().item<bool>());
}

TEST_CASE("int8 cache: forward_paged on an 8-bit cache stays near the float cache",
          "[int8_cache]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(32, 64, 4).num_kv_heads(2));
  PagedKVCache int8(PagedKVCacheOptions(32, 16, 2, 16).dtype(torch::kChar));
  PagedKVCache float32(PagedKVCacheOptions(32, 16, 2, 16));
  const auto x = torch::randn({60, 32});
  torch::Tensor y8, y32;
  for (PagedKVCache* cache : {&int8, &float32}) {
    const int64_t s = cache->add_sequence();
    auto& y = cache == &int8 ? y8 : y32;
    std::vector<torch::Tensor> parts;
    parts.push_back(mha->forward_paged(x.narrow(0, 0, 50), *cache, cache->extend({s}, {50})));
    for (int64_t t = 50; t < 60; ++t) {
      parts.push_back(mha->forward_paged(x.narrow(0, t, 1), *cache, cache->extend({s}, {1})));
    }
    y = torch::cat(parts);
  }
  CHECK(test::max_abs_diff(y32, mha(x).output) < 2e-5);
  const double error = test::max_abs_diff(y8, y32);
  CHECK(error < 0.02 * y32.abs().max().item<double>());
  CHECK(error > 0.0);
}

TEST_CASE("int8 cache: bad input is refused by name", "[int8_cache]") {
  torch::NoGradGuard no_grad;
  const char* paged = "attention::functional::paged_attention: ";
  PagedKVCache cache(PagedKVCacheOptions(4, 8, 2, 16).dtype(torch::kChar));
  const int64_t a = cache.add_sequence();
  const auto step = cache.extend({a}, {3});
  // Keys that are already codes, or of an integer dtype, are refused before anything is written.
  CHECK_THROWS_C10(cache.write(0, step, torch::zeros({3, 2, 16}, torch::kChar),
                               torch::zeros({3, 2, 16}, torch::kChar)),
                   c10::TypeError,
                   "attention::PagedKVCache::write: expected keys and values of dtype Float, "
                   "Double or BFloat16 (the 8-bit cache quantizes them), got Char and Char");
  cache.write(0, step, torch::randn({3, 2, 16}), torch::randn({3, 2, 16}));
  const auto q = torch::randn({1, 2, 16});
  const auto starts = torch::tensor({0, 1}), lengths = torch::tensor({3});
  const auto table = torch::tensor({cache.pages(a)[0]}, torch::kLong).view({1, 1});
  const auto k = cache.keys(0), v = cache.values(0);
  const auto ks = cache.key_scales(0), vs = cache.value_scales(0);
  // 8-bit pages without scales, through either overload.
  CHECK_THROWS_C10(F::paged_attention(q, k, v, starts, lengths, table), c10::ValueError,
                   std::string(paged) +
                       "expected key_scales with 8-bit pages (a float scale per row: a key is its "
                       "codes times its scale)");
  CHECK_THROWS_C10(F::paged_attention(q, k, ks, v, torch::Tensor(), starts, lengths, table),
                   c10::ValueError, std::string(paged) + "expected value_scales with 8-bit pages");
  // Scales of another shape or dtype.
  CHECK_THROWS_C10(
      F::paged_attention(q, k, ks.narrow(2, 0, 7), v, vs, starts, lengths, table), c10::ValueError,
      std::string(paged) +
          "expected key_scales of shape (4, 2, 8) (num_pages, Hkv, page_size), got (4, 2, 7)");
  CHECK_THROWS_C10(F::paged_attention(q, k, ks, v, vs.to(torch::kDouble), starts, lengths, table),
                   c10::TypeError,
                   std::string(paged) + "expected value_scales of dtype Float, got Double");
  // Scales with pages of the query's dtype; 8-bit keys with float values.
  const auto kf = torch::randn({4, 2, 8, 16});
  CHECK_THROWS_C10(F::paged_attention(q, kf, ks, kf, vs, starts, lengths, table), c10::ValueError,
                   std::string(paged) +
                       "takes key_scales and value_scales only with 8-bit pages (dtype Char), got "
                       "pages of dtype Float");
  CHECK_THROWS_C10(F::paged_attention(q, k, ks, kf, vs, starts, lengths, table), c10::TypeError,
                   std::string(paged) +
                       "expected key_pages and value_pages both of dtype Char (8-bit) or both of "
                       "the query's dtype, got Char and Float");
  // Integer queries are refused as before.
  CHECK_THROWS_AS(F::paged_attention(q.to(torch::kChar), k, ks, v, vs, starts, lengths, table),
                  c10::TypeError);
  // Sizes whose pool with scales would not fit in int64 bytes.
  CHECK_THROWS_C10(
      PagedKVCache(
          PagedKVCacheOptions(1, 1, 1, std::numeric_limits<int64_t>::max()).dtype(torch::kChar)),
      c10::ValueError, "needs more than 2^63 bytes");
  CHECK_THROWS_C10(
      PagedKVCache(
          PagedKVCacheOptions(int64_t{1} << 31, int64_t{1} << 31, 1, 1).dtype(torch::kChar)),
      c10::ValueError, "needs more than 2^63 bytes");
  CHECK_THROWS_C10(PagedKVCache(PagedKVCacheOptions(1, 1, 1, 1).dtype(torch::kInt)), c10::TypeError,
                   "attention::PagedKVCache: expected dtype Float, Double, BFloat16 or Char "
                   "(8-bit), got Int");
  // key_scales of a layer the cache lacks.
  CHECK_THROWS_C10(cache.key_scales(1), c10::ValueError,
                   "attention::PagedKVCache::key_scales: expected a layer in [0, 1), got 1");
}

TEST_CASE("int8 KVCache: a module decodes from the codes in place, as from what they stand for",
          "[int8_cache]") {
  using attention::KVCache;
  using attention::MultiHeadAttentionForwardOptions;
  torch::NoGradGuard no_grad;
  const std::vector<std::pair<std::string, attention::MultiHeadAttentionOptions>> modules = {
      {"gqa, rope", attention::MultiHeadAttentionOptions(32, 64, 4).num_kv_heads(2).rope(
                        F::RotaryOptions().theta(10000.0))},
      {"mqa, window, alibi, sinks", attention::MultiHeadAttentionOptions(32, 64, 4)
                                        .num_kv_heads(1)
                                        .sliding_window(9)
                                        .alibi(true)
                                        .sinks(true)},
  };
  for (const auto& [name, options] : modules) {
    INFO(name);
    torch::manual_seed(21);
    attention::MultiHeadAttention mha(options);
    const auto x = torch::randn({2, 40, 32});
    // In place; through append()'s keys and values (weights asked for: the fallback); float.
    KVCache in_place(64, torch::kChar), through_append(64, torch::kChar), float32(64);
    double in_place_vs_append = 0, int8_vs_float = 0;
    for (int64_t t = 0; t < 40; t += t < 30 ? 30 : 1) {  // a prompt of 30, then one at a time
      const auto step = x.narrow(1, t, t < 30 ? 30 : 1);
      const auto a = mha(step, MultiHeadAttentionForwardOptions().kv_cache(&in_place)).output;
      CHECK(F::last_path() == F::Path::ChunkedFused);
      const auto b =
          mha(step, MultiHeadAttentionForwardOptions().kv_cache(&through_append).need_weights(true))
              .output;
      const auto c = mha(step, MultiHeadAttentionForwardOptions().kv_cache(&float32)).output;
      in_place_vs_append = std::max(in_place_vs_append, test::max_abs_diff(a, b));
      int8_vs_float =
          std::max(int8_vs_float, test::max_abs_diff(a, c) / c.abs().max().item<double>());
    }
    CHECK(in_place_vs_append < 2e-5);
    CHECK(int8_vs_float < 0.02);
    CHECK(int8_vs_float > 0.0);
    CHECK(in_place.length() == 40);
    CHECK(in_place.keys().scalar_type() == torch::kChar);
    CHECK(in_place.key_scales().sizes() == torch::IntArrayRef({2, options.num_kv_heads(), 40}));
  }
}

TEST_CASE("int8 KVCache: append returns what the codes stand for; refusals change nothing",
          "[int8_cache]") {
  using attention::KVCache;
  torch::NoGradGuard no_grad;
  KVCache cache(8, torch::kChar);
  CHECK(cache.quantized());
  CHECK_FALSE(cache.key_scales().defined());
  const auto k = torch::randn({1, 2, 3, 16}), v = torch::randn({1, 2, 3, 16});
  const auto [keys, values] = cache.append(k, v);
  CHECK(keys.scalar_type() == torch::kFloat);
  // Codes times scales rounded once to float (the exact product has 8 + 24 bits).
  CHECK(torch::equal(keys, dequantized(cache.keys(), cache.key_scales()).to(torch::kFloat)));
  CHECK(torch::equal(values, dequantized(cache.values(), cache.value_scales()).to(torch::kFloat)));
  CHECK(((keys - k).abs() <= cache.key_scales().unsqueeze(-1) * 0.5000001).all().item<bool>());
  // Refused: too many tokens, another dtype, codes; the cache is as it was.
  const auto codes = cache.keys().clone();
  CHECK_THROWS_C10(cache.append(torch::randn({1, 2, 6, 16}), torch::randn({1, 2, 6, 16})),
                   c10::ValueError,
                   "attention::KVCache: cannot append 6 token(s) to the 3 cached: max_length is 8");
  CHECK_THROWS_C10(cache.write(k.to(torch::kDouble), v.to(torch::kDouble)), c10::TypeError,
                   "attention::KVCache: expected keys and values of dtype Float, got Double and "
                   "Double");
  CHECK_THROWS_C10(cache.write(k.to(torch::kChar), v.to(torch::kChar)), c10::TypeError,
                   "attention::KVCache: expected floating keys and values of one dtype, got Char "
                   "and Char");
  CHECK(cache.length() == 3);
  CHECK(torch::equal(cache.keys(), codes));
  CHECK_THROWS_C10(KVCache(8, torch::kFloat), c10::TypeError,
                   "attention::KVCache: expected storage Char (8-bit codes and scales), got Float "
                   "(a cache in the appended dtype takes no storage argument)");
  CHECK_THROWS_C10(KVCache(0, torch::kChar), c10::ValueError,
                   "attention::KVCache: expected max_length > 0, got 0");
  CHECK_THROWS_C10(KVCache(std::numeric_limits<int64_t>::max(), torch::kChar)
                       .append(torch::randn({1, 2, 1, 16}), torch::randn({1, 2, 1, 16})),
                   c10::ValueError, "would exceed 2^63 - 1 bytes");
}
