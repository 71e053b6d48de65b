// PagedKVCache: where tokens go, forks sharing pages until they diverge, freeing, sliding
// windows giving pages back, and refusals that leave the cache as it was.

#include <attention/paged_kv_cache.h>

#include "helpers.h"
#include "paged_cache_state.h"

#include <torch/torch.h>

#include <limits>
#include <map>

namespace {

using attention::PagedBatch;
using attention::PagedKVCache;
using attention::PagedKVCacheOptions;

// The keys (or values) of a sequence's tokens [from, length), read through its page table:
// (num_kv_heads, length - from, head_dim).
torch::Tensor gathered_rows(const PagedKVCache& cache, const torch::Tensor& pool, int64_t sequence,
                            int64_t from = 0) {
  const int64_t page_size = cache.options().page_size();
  const auto pages = cache.pages(sequence);
  std::vector<torch::Tensor> rows;
  for (int64_t t = from; t < cache.length(sequence); ++t) {
    rows.push_back(pool[pages[t / page_size]].select(1, t % page_size));
  }
  return torch::stack(rows, 1);
}

using CacheSnapshot = test::PagedCacheState;

// Appends `counts[i]` random tokens to sequences[i] in one step, layer 0; returns the keys and
// values written, (total, heads, dim).
std::pair<torch::Tensor, torch::Tensor> write_step(PagedKVCache& cache,
                                                   const std::vector<int64_t>& sequences,
                                                   const std::vector<int64_t>& counts) {
  const auto batch = cache.extend(sequences, counts);
  const auto& o = cache.options();
  auto k = torch::randn({batch.total_tokens(), o.num_kv_heads(), o.head_dim()});
  auto v = torch::randn({batch.total_tokens(), o.num_kv_heads(), o.head_dim()});
  cache.write(0, batch, k, v);
  return {k, v};
}

}  // namespace

TEST_CASE("PagedKVCache: tokens of several sequences, different counts per step, in their slots",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(/*num_pages=*/16, /*page_size=*/4, 2, 3));
  const int64_t a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
  CHECK(std::vector<int64_t>{a, b, c} == cache.sequences());
  std::map<int64_t, std::vector<torch::Tensor>> keys, values;
  const std::vector<std::vector<int64_t>> steps = {{5, 1, 0}, {1, 1, 9}, {3, 0, 1}, {1, 7, 1}};
  for (const auto& counts : steps) {
    const auto batch = cache.extend({a, b, c}, counts);
    CHECK(batch.total_tokens() == counts[0] + counts[1] + counts[2]);
    auto k = torch::randn({batch.total_tokens(), 2, 3}), v = torch::randn_like(k);
    cache.write(0, batch, k, v);
    const auto starts = batch.query_starts();
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t s = batch.sequences()[i];
      const int64_t begin = starts[i].item<int64_t>(), n = counts[i];
      CHECK(starts[i + 1].item<int64_t>() == begin + n);
      CHECK(batch.key_lengths()[i].item<int64_t>() == cache.length(s));
      // Positions continue the sequence's.
      for (int64_t t = 0; t < n; ++t) {
        CHECK(batch.positions()[begin + t].item<int64_t>() == cache.length(s) - n + t);
      }
      keys[s].push_back(k.narrow(0, begin, n));
      values[s].push_back(v.narrow(0, begin, n));
      // The batch's page table is the sequence's.
      const auto pages = cache.pages(s);
      for (size_t p = 0; p < pages.size(); ++p) {
        CHECK(batch.page_table()[i][p].item<int64_t>() == pages[p]);
      }
    }
  }
  for (const int64_t s : {a, b, c}) {
    CHECK(
        torch::equal(gathered_rows(cache, cache.keys(0), s), torch::cat(keys[s]).transpose(0, 1)));
    CHECK(torch::equal(gathered_rows(cache, cache.values(0), s),
                       torch::cat(values[s]).transpose(0, 1)));
  }
  // 10, 9 and 11 tokens in pages of 4: 3 + 3 + 3 pages.
  CHECK(cache.free_pages() == 16 - 9);
  CHECK(cache.memory_bytes() == 2 * 16 * 4 * 2 * 3 * 4);
}

TEST_CASE("PagedKVCache: a fork shares every page and copies the partly filled one it writes",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(12, 4, 1, 2));
  const int64_t parent = cache.add_sequence();
  write_step(cache, {parent}, {10});  // pages: full, full, half
  const int64_t free_before = cache.free_pages();
  const int64_t child = cache.fork_sequence(parent);
  CHECK(cache.free_pages() == free_before);  // nothing copied yet
  CHECK(cache.pages(child) == cache.pages(parent));
  for (const int64_t page : cache.pages(parent)) CHECK(cache.page_references(page) == 2);
  const auto prefix = gathered_rows(cache, cache.keys(0), parent);
  // Both write: the first to write the shared half page copies it, the second writes in place.
  CHECK(cache.pages_needed({parent, child}, {1, 1}) == 1);
  const auto [k, v] = write_step(cache, {parent, child}, {1, 1});
  CHECK(cache.free_pages() == free_before - 1);
  const auto p = cache.pages(parent), c = cache.pages(child);
  CHECK(p[0] == c[0]);
  CHECK(p[1] == c[1]);
  CHECK(p[2] != c[2]);
  CHECK(cache.page_references(p[0]) == 2);
  CHECK(cache.page_references(p[2]) == 1);
  CHECK(cache.page_references(c[2]) == 1);
  // Each sees the common prefix, then its own token.
  CHECK(torch::equal(gathered_rows(cache, cache.keys(0), parent),
                     torch::cat({prefix, k.narrow(0, 0, 1).transpose(0, 1)}, 1)));
  CHECK(torch::equal(gathered_rows(cache, cache.keys(0), child),
                     torch::cat({prefix, k.narrow(0, 1, 1).transpose(0, 1)}, 1)));
  // Freeing the parent keeps the shared pages for the child.
  cache.free_sequence(parent);
  CHECK(cache.page_references(c[0]) == 1);
  CHECK(cache.page_references(p[2]) == 0);
  CHECK(torch::equal(gathered_rows(cache, cache.keys(0), child),
                     torch::cat({prefix, k.narrow(0, 1, 1).transpose(0, 1)}, 1)));
  cache.free_sequence(child);
  CHECK(cache.free_pages() == 12);
}

TEST_CASE("PagedKVCache: a fork at a page boundary copies nothing; forks of forks",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(8, 4, 1, 2).num_layers(3));
  const int64_t a = cache.add_sequence();
  const auto batch = cache.extend({a}, {8});
  for (int64_t layer = 0; layer < 3; ++layer) {
    cache.write(layer, batch, torch::full({8, 1, 2}, float(layer)), torch::zeros({8, 1, 2}));
  }
  const int64_t b = cache.fork_sequence(a), c = cache.fork_sequence(b);
  CHECK(cache.page_references(cache.pages(a)[0]) == 3);
  CHECK(cache.pages_needed({a, b, c}, {1, 1, 1}) == 3);  // one new page each, no copies
  cache.extend({a, b, c}, {1, 1, 1});
  CHECK(cache.free_pages() == 8 - 2 - 3);
  // A copy copies every layer: truncate a back into the shared page, then write to it.
  const int64_t d = cache.fork_sequence(c);
  cache.truncate(d, 6);
  const auto copied = cache.extend({d}, {1});
  const int64_t own = cache.pages(d)[1];
  CHECK(own != cache.pages(a)[1]);
  for (int64_t layer = 0; layer < 3; ++layer) {
    CHECK(
        torch::equal(cache.keys(layer)[own].narrow(1, 0, 2), torch::full({1, 2, 2}, float(layer))));
  }
  (void)copied;
}

TEST_CASE("PagedKVCache: out of pages is refused, naming the need, and changes nothing",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(4, 4, 1, 2));
  const int64_t a = cache.add_sequence(), b = cache.add_sequence();
  write_step(cache, {a, b}, {6, 3});  // 2 + 1 pages
  const int64_t child = cache.fork_sequence(a);
  const auto batch = cache.extend({}, {});  // a batch of the cache as it is
  const CacheSnapshot before(cache);
  // a needs nothing new (its last page has room: but it is shared, so one copy), b one page.
  CHECK(cache.pages_needed({a, b}, {1, 2}) == 2);
  CHECK_THROWS_C10(cache.extend({a, b}, {1, 2}), c10::ValueError,
                   "attention::PagedKVCache::extend: out of pages: the step needs 2 new page(s) "
                   "and 1 of 4 are free (free finished sequences or make a larger pool); nothing "
                   "was changed");
  CHECK(CacheSnapshot(cache) == before);
  CHECK(cache.holds(batch));  // a refused step is no change
  CHECK_THROWS_C10(cache.extend({child}, {std::numeric_limits<int64_t>::max()}), c10::ValueError,
                   "out of pages: the step needs more pages than the pool has and 1 of 4 are free");
  CHECK(cache.pages_needed({child}, {std::numeric_limits<int64_t>::max()}) ==
        std::numeric_limits<int64_t>::max());
  CHECK(CacheSnapshot(cache) == before);
  // What fits still goes.
  cache.extend({a}, {1});
  CHECK(cache.free_pages() == 0);
}

TEST_CASE("PagedKVCache: freed pages are taken again; memory stays bounded over many requests",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(6, 4, 1, 1));
  for (int round = 0; round < 50; ++round) {
    const int64_t a = cache.add_sequence(), b = cache.add_sequence();
    write_step(cache, {a, b}, {1 + round % 9, 3});
    write_step(cache, {a, b}, {1, 1});
    cache.free_sequence(a);
    cache.free_sequence(b);
    CHECK(cache.free_pages() == 6);
  }
}

TEST_CASE("PagedKVCache: with a sliding window, pages every later query has left go back",
          "[paged_kv_cache]") {
  // A window of 6 keys in pages of 4: a sequence holds at most ceil((6 - 1 + 1) / 4) + 1 pages
  // however long it grows.
  PagedKVCache cache(PagedKVCacheOptions(3, 4, 1, 2).sliding_window(6));
  const int64_t a = cache.add_sequence();
  std::vector<torch::Tensor> keys;
  for (int64_t t = 0; t < 40; ++t) {
    keys.push_back(write_step(cache, {a}, {1}).first);
    const auto pages = cache.pages(a);
    int64_t held = 0;
    for (const int64_t p : pages) held += p >= 0;
    CHECK(held <= 3);
    // The next query (at position t + 1) sees keys from t + 1 - 5: those are still held.
    const int64_t from = std::max<int64_t>(0, t + 1 - 5);
    CHECK(pages[from / 4] >= 0);
    CHECK(torch::equal(gathered_rows(cache, cache.keys(0), a, from),
                       torch::cat(keys).narrow(0, from, t + 1 - from).transpose(0, 1)));
  }
  // A fork keeps the pages its parent lets go: at 40 tokens it shares the two pages held.
  const int64_t child = cache.fork_sequence(a);
  write_step(cache, {a}, {4});  // positions 40 to 43: the last free page
  CHECK(cache.free_pages() == 0);
  // Position 44 lets a's first held page go, but the fork still holds it: no page for it.
  const CacheSnapshot before(cache);
  CHECK_THROWS_C10(write_step(cache, {a}, {1}), c10::ValueError, "out of pages");
  CHECK(CacheSnapshot(cache) == before);
  cache.free_sequence(child);
  CHECK(cache.free_pages() == 0);  // a holds both pages still
  write_step(cache, {a}, {1});     // now a's release frees the page it takes
  // Truncating into what was let go is refused.
  CHECK_THROWS_C10(cache.truncate(a, 2), c10::ValueError,
                   "attention::PagedKVCache::truncate: cannot truncate sequence 0 to 2 tokens: a "
                   "query there sees keys from position -3, and the window let positions before");
}

TEST_CASE("PagedKVCache: a batch is refused once the cache has changed", "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(8, 4, 1, 2));
  const int64_t a = cache.add_sequence();
  const auto batch = cache.extend({a}, {3});
  CHECK(cache.holds(batch));
  const auto k = torch::randn({3, 1, 2});
  cache.write(0, batch, k, k);
  cache.free_sequence(a);  // its pages may now go to another sequence
  CHECK_FALSE(cache.holds(batch));
  CHECK_THROWS_C10(cache.write(0, batch, k, k), c10::ValueError,
                   "attention::PagedKVCache::write: the batch does not describe this cache as it "
                   "is now (it was made before the cache last changed, or by another cache): "
                   "extend() again");
  PagedKVCache other(PagedKVCacheOptions(8, 4, 1, 2));
  other.add_sequence();
  const auto mine = other.extend({0}, {3});
  CHECK_FALSE(cache.holds(mine));
}

TEST_CASE("PagedKVCache: truncate rolls tokens back and gives their pages back",
          "[paged_kv_cache]") {
  PagedKVCache cache(PagedKVCacheOptions(8, 4, 1, 2));
  const int64_t a = cache.add_sequence();
  const auto k = write_step(cache, {a}, {10}).first;
  cache.truncate(a, 5);
  CHECK(cache.length(a) == 5);
  CHECK(cache.pages(a).size() == 2);
  CHECK(cache.free_pages() == 6);
  const auto k2 = write_step(cache, {a}, {2}).first;
  CHECK(torch::equal(gathered_rows(cache, cache.keys(0), a),
                     torch::cat({k.narrow(0, 0, 5), k2}).transpose(0, 1)));
  cache.truncate(a, 0);
  CHECK(cache.free_pages() == 8);
  CHECK(cache.pages(a).empty());
}

TEST_CASE("PagedKVCache: bfloat16 and double pools", "[paged_kv_cache]") {
  for (const auto dtype : {torch::kBFloat16, torch::kDouble}) {
    PagedKVCache cache(PagedKVCacheOptions(4, 2, 2, 3).dtype(dtype));
    const int64_t a = cache.add_sequence();
    const auto batch = cache.extend({a}, {3});
    auto k = torch::randn({3, 2, 3}).to(dtype);
    cache.write(0, batch, k, k);
    CHECK(cache.keys(0).scalar_type() == dtype);
    CHECK(torch::equal(gathered_rows(cache, cache.keys(0), a), k.transpose(0, 1)));
    CHECK(cache.memory_bytes() == 2 * 4 * 2 * 2 * 3 * int64_t(c10::elementSize(dtype)));
  }
}
