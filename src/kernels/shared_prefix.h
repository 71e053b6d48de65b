#pragma once

// Which sequences of a paged step begin with the same pages (by prefix caching or by forks), so
// that the paged kernel reads those pages once for all of them (cascade attention: the shared
// prefix meets every sharer's queries in one matrix product, each sequence's own pages follow,
// and the two are merged through their log-sum-exp).

#include <cstdint>
#include <vector>

namespace attention {
namespace kernels {

/// Sequences whose page tables agree on their first `pages` entries.
struct SharedPrefix {
  std::vector<int64_t> sequences;  // two or more, in increasing order
  int64_t pages = 0;               // at least 1
};

/// The keys [begin, end) that some query of a sequence sees (end <= begin: none).
struct KeyRange {
  int64_t begin = 0, end = 0;
};

/// The shared prefixes of a step's page table (`count` rows of `table_ld` entries, row s
/// sequence s's pages): sequences whose queries see their first key are grouped by their first
/// page, and a group's prefix is the longest run of leading entries every member has in common,
/// of whole pages within every member's visible keys (so that every page of it is one
/// make_paged_problem checked for each member). Groups left with one member or no page are
/// dropped. One level: a member that departs early shortens its group's prefix for all of it.
std::vector<SharedPrefix> find_shared_prefixes(const int64_t* table, int64_t count,
                                               int64_t table_ld, int64_t page_size,
                                               const std::vector<KeyRange>& keys);

}  // namespace kernels
}  // namespace attention
