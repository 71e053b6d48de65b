// PagedKVCache's prefix caching: a sequence added with its tokens starts with the cached pages of
// the longest prefix of them; a page is offered only once full, its tokens known and every layer
// written; a match needs the same tokens and the same pages before (a hash is only a first look);
// pages no sequence holds stay cached and are given back least recently used first, never one a
// sequence holds; a cached page is never written again; and every refusal leaves the cache as it
// was. Float, bfloat16 and 8-bit pools.

#include <attention/paged_kv_cache.h>

#include "helpers.h"
#include "paged_cache_state.h"

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace {

using attention::PagedBatch;
using attention::PagedKVCache;
using attention::PagedKVCacheOptions;
using CacheSnapshot = test::PagedCacheState;

torch::Tensor ids(std::vector<int64_t> tokens) {
  return torch::tensor(tokens, torch::kLong);
}

// Tokens first, first + 1, ...
torch::Tensor run_of(int64_t first, int64_t count) {
  return torch::arange(first, first + count, torch::kLong);
}

PagedKVCacheOptions options(int64_t pages, int64_t page_size, int64_t layers = 2,
                            torch::Dtype dtype = torch::kFloat) {
  return PagedKVCacheOptions(pages, page_size, /*num_kv_heads=*/2, /*head_dim=*/4)
      .num_layers(layers)
      .dtype(dtype);
}

// Extends `sequence` by `count` tokens and writes random keys and values into `layers` of its
// layers (all when -1); returns the batch.
PagedBatch step(PagedKVCache& cache, int64_t sequence, int64_t count, int64_t layers = -1) {
  const auto batch = cache.extend({sequence}, {count});
  const auto& o = cache.options();
  const auto dtype = cache.quantized() ? torch::kFloat : o.dtype();
  const int64_t written = layers < 0 ? o.num_layers() : layers;
  for (int64_t layer = 0; layer < written; ++layer) {
    cache.write(layer, batch, torch::randn({count, o.num_kv_heads(), o.head_dim()}).to(dtype),
                torch::randn({count, o.num_kv_heads(), o.head_dim()}).to(dtype));
  }
  return batch;
}

}  // namespace

TEST_CASE("prefix caching: a later sequence with the same first pages shares them",
          "[paged_kv_cache]") {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kChar}) {
    INFO(dtype);
    PagedKVCache cache(options(16, 4, 2, dtype));
    const auto first = cache.add_sequence(run_of(100, 10));
    CHECK(first.cached_tokens == 0);
    CHECK(cache.length(first.sequence) == 0);
    step(cache, first.sequence, 10);
    const auto a = cache.pages(first.sequence);
    // Tokens 100..107 fill two pages; 108 and 109 the third, partly. Another request with the
    // same first 9 tokens and then others finds the two full pages.
    auto tokens = run_of(100, 12);
    tokens[9] = 7;
    const auto second = cache.add_sequence(tokens);
    CHECK(second.cached_tokens == 8);
    CHECK(cache.length(second.sequence) == 8);
    const auto b = cache.pages(second.sequence);
    REQUIRE(b.size() == 2);
    CHECK(b[0] == a[0]);
    CHECK(b[1] == a[1]);
    CHECK(cache.page_references(a[0]) == 2);
    CHECK(cache.page_references(a[2]) == 1);
    CHECK(cache.page_cached(a[0]));
    CHECK(cache.page_cached(a[1]));
    CHECK_FALSE(cache.page_cached(a[2]));  // partly filled
    // Its next step writes to pages of its own, and the shared ones keep their keys.
    const auto keys_before = cache.keys(1).clone();
    step(cache, second.sequence, 4);
    const auto after = cache.pages(second.sequence);
    CHECK(after.size() == 3);
    CHECK(after[2] != a[2]);
    CHECK(torch::equal(cache.keys(1)[a[0]], keys_before[a[0]]));
    CHECK(torch::equal(cache.keys(1)[a[1]], keys_before[a[1]]));
    if (cache.quantized()) {
      CHECK(cache.key_scales(1)[a[0]].isfinite().all().item<bool>());
    }
  }
}

TEST_CASE("prefix caching: the last token is always computed, and integer dtypes of every width",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4));
  const auto first = cache.add_sequence(run_of(0, 8));
  step(cache, first.sequence, 8);
  // Exactly the two cached pages' tokens: the first page is reused, the last token's page not.
  CHECK(cache.add_sequence(run_of(0, 8)).cached_tokens == 4);
  CHECK(cache.add_sequence(run_of(0, 9)).cached_tokens == 8);
  CHECK(cache.add_sequence(run_of(0, 9).to(torch::kInt)).cached_tokens == 8);
  CHECK(cache.add_sequence(run_of(0, 9).to(torch::kShort)).cached_tokens == 8);
  CHECK(cache.add_sequence(run_of(0, 9).to(torch::kByte)).cached_tokens == 8);
  CHECK(cache.add_sequence(run_of(0, 9).to(torch::kChar)).cached_tokens == 8);
  // A strided view is read as its values.
  CHECK(cache.add_sequence(run_of(0, 18).view({9, 2}).select(1, 0).div(2, "floor")).cached_tokens ==
        8);
  CHECK(cache.add_sequence(run_of(0, 1)).cached_tokens == 0);
  CHECK(cache.add_sequence(torch::empty({0}, torch::kLong)).cached_tokens == 0);
}

TEST_CASE("prefix caching: a page is offered only once every layer has written it",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4, /*layers=*/3));
  const auto first = cache.add_sequence(run_of(0, 9));
  step(cache, first.sequence, 9, /*layers=*/2);  // a prefill that failed before layer 2
  CHECK(cache.add_sequence(run_of(0, 9)).cached_tokens == 0);
  CHECK_FALSE(cache.page_cached(cache.pages(first.sequence)[0]));
  // Rolled back (which forgets the token ids past the new length) and computed again, every
  // layer: offered.
  cache.truncate(first.sequence, 0);
  cache.add_tokens(first.sequence, run_of(0, 9));
  step(cache, first.sequence, 9);
  CHECK(cache.add_sequence(run_of(0, 9)).cached_tokens == 8);
}

TEST_CASE("prefix caching: a page written after a gap is not offered", "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 12));
  cache.extend({first.sequence}, {4});  // its keys never written
  step(cache, first.sequence, 8);       // written, but after the gap
  CHECK(cache.add_sequence(run_of(0, 12)).cached_tokens == 0);
  for (const int64_t page : cache.pages(first.sequence)) CHECK_FALSE(cache.page_cached(page));
}

TEST_CASE("prefix caching: a match needs the same tokens after the same pages",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(32, 4));
  const auto first = cache.add_sequence(ids({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  step(cache, first.sequence, 9);
  // The second page's tokens alone, or after another first page, are another prefix.
  CHECK(cache.add_sequence(ids({5, 6, 7, 8, 9})).cached_tokens == 0);
  CHECK(cache.add_sequence(ids({0, 2, 3, 4, 5, 6, 7, 8, 9})).cached_tokens == 0);
  CHECK(cache.add_sequence(ids({1, 2, 3, 4, 5, 6, 7, 0, 9})).cached_tokens == 4);
  // Ids beyond 32 bits are compared whole.
  const int64_t big = std::numeric_limits<int64_t>::max();
  const auto wide = cache.add_sequence(ids({big, big - 1, 1LL << 32, -1, 0}));
  step(cache, wide.sequence, 5);
  CHECK(cache.add_sequence(ids({big, big - 1, 1LL << 32, -1, 0})).cached_tokens == 4);
  CHECK(cache.add_sequence(ids({big, big - 1, 0, -1, 0})).cached_tokens == 0);
}

TEST_CASE("prefix caching: pages no sequence holds stay cached, and go least recently used first",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(4, 2, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 5));
  step(cache, first.sequence, 5);  // pages 0, 1 full, page 2 partly
  const auto pages = cache.pages(first.sequence);
  cache.free_sequence(first.sequence);
  CHECK(cache.free_pages() == 4);
  CHECK(cache.cached_pages() == 2);
  CHECK(cache.page_cached(pages[0]));
  CHECK(cache.page_cached(pages[1]));
  CHECK_FALSE(cache.page_cached(pages[2]));
  // Found again after its request ended.
  const auto again = cache.add_sequence(run_of(0, 5));
  CHECK(again.cached_tokens == 4);
  CHECK(cache.cached_pages() == 0);  // held again
  cache.free_sequence(again.sequence);
  // A request of 6 tokens takes the page never cached, the one never used, then the least
  // recently used cached page (the first, freed first), which is then no longer found.
  const int64_t other = cache.add_sequence();
  cache.extend({other}, {6});
  CHECK(cache.cached_pages() == 1);
  CHECK_FALSE(cache.page_cached(pages[0]));
  CHECK(cache.page_cached(pages[1]));
  CHECK(cache.add_sequence(run_of(0, 5)).cached_tokens == 0);
}

TEST_CASE("prefix caching: a page given back and cached again under other tokens leads nowhere old",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(3, 2, /*layers=*/1));
  const auto first = cache.add_sequence(ids({0, 1, 2, 3}));
  step(cache, first.sequence, 4);
  const auto pages = cache.pages(first.sequence);
  cache.extend({cache.add_sequence()}, {2});  // holds the third page
  cache.free_sequence(first.sequence);        // both pages cached: [0, 1], then [2, 3] after it
  // Another request takes the first page back from the cache and writes 9, 9 in it.
  const auto second = cache.add_sequence(ids({9, 9, 2, 3, 5}));
  CHECK(second.cached_tokens == 0);
  step(cache, second.sequence, 2);
  CHECK(cache.pages(second.sequence)[0] == pages[0]);
  CHECK(cache.page_cached(pages[1]));  // still cached, after the old first page
  // 9, 9 then 2, 3: the first page is found under its new tokens, and the old second page (whose
  // keys followed 0, 1) is not found after it.
  const auto third = cache.add_sequence(ids({9, 9, 2, 3, 5}));
  CHECK(third.cached_tokens == 2);
  CHECK(cache.add_sequence(ids({0, 1, 2, 3, 5})).cached_tokens == 0);
}

TEST_CASE("prefix caching: a page a sequence holds is never given back", "[paged_kv_cache]") {
  PagedKVCache cache(options(4, 2, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 5));
  step(cache, first.sequence, 5);
  const auto held = cache.add_sequence(run_of(0, 5));  // holds the two cached pages
  CHECK(held.cached_tokens == 4);
  cache.free_sequence(first.sequence);  // its third page goes back; the first two stay held
  CHECK(cache.free_pages() == 2);
  const int64_t other = cache.add_sequence();
  const CacheSnapshot before(cache);
  CHECK_THROWS_C10(cache.extend({other}, {6}), c10::ValueError, "out of pages");
  CHECK(CacheSnapshot(cache) == before);
  CHECK(cache.pages_needed({other}, {6}) == 3);
  cache.extend({other}, {4});
  for (const int64_t page : cache.pages(held.sequence)) {
    CHECK(cache.page_cached(page));
    CHECK(cache.page_references(page) == 1);
  }
}

TEST_CASE("prefix caching: a cached page is never written again, even after truncate",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 9));
  step(cache, first.sequence, 9);
  const int64_t page = cache.pages(first.sequence)[1];
  const auto second = cache.add_sequence(run_of(0, 9));  // offers pages 0 and 1
  CHECK(second.cached_tokens == 8);
  cache.free_sequence(second.sequence);
  CHECK(cache.page_references(page) == 1);  // the first sequence's alone, and cached
  const auto kept = cache.keys(0)[page].clone();
  // Rolled back into the cached second page, then other tokens written there: to a copy.
  cache.truncate(first.sequence, 6);
  cache.add_tokens(first.sequence, ids({50, 51}));
  step(cache, first.sequence, 2);
  CHECK(cache.pages(first.sequence)[1] != page);
  CHECK(torch::equal(cache.keys(0)[page], kept));
  CHECK(cache.page_cached(page));
  // The copy, with tokens 4, 5, 50, 51, is offered as a prefix of its own.
  CHECK(cache.add_sequence(ids({0, 1, 2, 3, 4, 5, 50, 51, 9})).cached_tokens == 8);
  CHECK(cache.add_sequence(run_of(0, 9)).cached_tokens == 8);
}

TEST_CASE("prefix caching: decoded tokens and the next turn are offered through add_tokens",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4, /*layers=*/1));
  const auto turn = cache.add_sequence(ids({1, 2, 3}));
  step(cache, turn.sequence, 3);
  // Two decoded tokens: their ids told as they come.
  cache.add_tokens(turn.sequence, ids({4}));
  step(cache, turn.sequence, 1);
  cache.add_tokens(turn.sequence, ids({5}));
  step(cache, turn.sequence, 1);
  // The next turn repeats the conversation so far and adds to it.
  CHECK(cache.add_sequence(ids({1, 2, 3, 4, 5, 6})).cached_tokens == 4);
  // Tokens known but not yet written are not offered.
  cache.add_tokens(turn.sequence, ids({6, 7, 8}));
  CHECK(cache.add_sequence(ids({1, 2, 3, 4, 5, 6, 7, 8, 9})).cached_tokens == 4);
  step(cache, turn.sequence, 3);
  CHECK(cache.add_sequence(ids({1, 2, 3, 4, 5, 6, 7, 8, 9})).cached_tokens == 8);
}

TEST_CASE("prefix caching: forks share what was offered, and a window ends the offered run",
          "[paged_kv_cache]") {
  {
    PagedKVCache cache(options(16, 4, /*layers=*/1));
    const auto first = cache.add_sequence(run_of(0, 9));
    step(cache, first.sequence, 9);
    const int64_t fork = cache.fork_sequence(first.sequence);
    cache.free_sequence(first.sequence);
    CHECK(cache.add_sequence(run_of(0, 9)).cached_tokens == 8);
    CHECK(cache.length(fork) == 9);
  }
  {
    // Pages the window let go stay cached where they were offered first...
    PagedKVCache cache(options(16, 4, /*layers=*/1).sliding_window(4));
    const auto first = cache.add_sequence(run_of(0, 16));
    step(cache, first.sequence, 8);
    step(cache, first.sequence, 8);  // offers pages 0 and 1, then lets page 0 go
    CHECK(cache.pages(first.sequence)[0] == -1);
    CHECK(cache.add_sequence(run_of(0, 17)).cached_tokens == 16);
  }
  {
    // ...but the run of offered pages ends at one let go before its tokens were known.
    PagedKVCache cache(options(16, 4, /*layers=*/1).sliding_window(4));
    const int64_t first = cache.add_sequence();
    step(cache, first, 8);
    step(cache, first, 8);
    cache.add_tokens(first, run_of(0, 16));
    CHECK(cache.add_sequence(run_of(0, 17)).cached_tokens == 0);
  }
}

TEST_CASE("prefix caching: a batch made before add_sequence(tokens) or add_tokens is refused",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(16, 4, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 4));
  const auto batch = cache.extend({first.sequence}, {4});
  cache.add_sequence(run_of(0, 4));
  CHECK_THROWS_C10(cache.write(0, batch, torch::randn({4, 2, 4}), torch::randn({4, 2, 4})),
                   c10::ValueError, "extend() again");
  const auto again = cache.extend({first.sequence}, {0});
  cache.add_tokens(first.sequence, ids({9}));
  CHECK_FALSE(cache.holds(again));
}

TEST_CASE("prefix caching: bad token ids are refused by name and change nothing",
          "[paged_kv_cache]") {
  PagedKVCache cache(options(4, 2, /*layers=*/1));
  const auto first = cache.add_sequence(run_of(0, 3));
  step(cache, first.sequence, 3);
  const CacheSnapshot before(cache);
  const char* add = "attention::PagedKVCache::add_sequence";
  CHECK_THROWS_C10(cache.add_sequence(torch::Tensor()), c10::ValueError, add);
  CHECK_THROWS_C10(cache.add_sequence(torch::zeros({3})), c10::TypeError,
                   "expected token ids of an integer dtype, got Float");
  CHECK_THROWS_C10(cache.add_sequence(torch::zeros({3}, torch::kBool)), c10::TypeError,
                   "integer dtype, got Bool");
  CHECK_THROWS_C10(cache.add_sequence(torch::zeros({1, 3}, torch::kLong)), c10::ValueError,
                   "expected a 1-D tensor of token ids, got 2 dimensions");
  CHECK_THROWS_C10(cache.add_sequence(
                       torch::zeros({3}, torch::TensorOptions(torch::kLong).device(torch::kMeta))),
                   c10::ValueError, "expected token ids on the CPU, got meta");
  // The pool holds 8 tokens.
  CHECK_THROWS_C10(cache.add_sequence(run_of(0, 9)), c10::ValueError,
                   "9 tokens are more than the pool holds (8)");
  const char* tokens = "attention::PagedKVCache::add_tokens";
  CHECK_THROWS_C10(cache.add_tokens(99, ids({1})), c10::ValueError, "unknown sequence 99");
  CHECK_THROWS_C10(cache.add_tokens(first.sequence, torch::zeros({1}, torch::kDouble)),
                   c10::TypeError, tokens);
  CHECK_THROWS_C10(cache.add_tokens(first.sequence, run_of(0, 6)), c10::ValueError,
                   "would know 9 tokens, more than the pool holds (8)");
  CHECK(CacheSnapshot(cache) == before);
  CHECK_THROWS_C10(cache.page_cached(-1), c10::ValueError, "expected a page in [0, 4), got -1");
  CHECK_THROWS_C10(cache.page_cached(std::numeric_limits<int64_t>::max()), c10::ValueError,
                   "page_cached");
}
