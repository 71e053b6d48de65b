#pragma once

// Everything a refused call must leave as it was in a PagedKVCache: its sequences, their lengths
// and pages, every page's references, the free count, and which pages prefix caching offers.

#include <attention/paged_kv_cache.h>

#include <cstdint>
#include <vector>

namespace test {

struct PagedCacheState {
  std::vector<int64_t> sequences, lengths, references;
  std::vector<bool> cached;
  std::vector<std::vector<int64_t>> pages;
  int64_t free_pages, cached_pages;
  explicit PagedCacheState(const attention::PagedKVCache& c)
      : sequences(c.sequences()), free_pages(c.free_pages()), cached_pages(c.cached_pages()) {
    for (const int64_t s : sequences) {
      lengths.push_back(c.length(s));
      pages.push_back(c.pages(s));
    }
    for (int64_t p = 0; p < c.options().num_pages(); ++p) {
      references.push_back(c.page_references(p));
      cached.push_back(c.page_cached(p));
    }
  }
  bool operator==(const PagedCacheState& o) const {
    return sequences == o.sequences && lengths == o.lengths && references == o.references &&
           pages == o.pages && free_pages == o.free_pages && cached == o.cached &&
           cached_pages == o.cached_pages;
  }
};

}  // namespace test
