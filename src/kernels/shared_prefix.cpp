#include "kernels/shared_prefix.h"

#include <algorithm>
#include <unordered_map>

namespace attention {
namespace kernels {

std::vector<SharedPrefix> find_shared_prefixes(const int64_t* table, int64_t count,
                                               int64_t table_ld, int64_t page_size,
                                               const std::vector<KeyRange>& keys) {
  // The whole pages each sequence can share: from its first key, all seen by its queries.
  std::vector<int64_t> whole(static_cast<size_t>(count), 0);
  std::unordered_map<int64_t, std::vector<int64_t>> by_first_page;
  std::vector<int64_t> first_pages;  // in the order first met, so that groups come out in order
  for (int64_t s = 0; s < count; ++s) {
    const KeyRange& r = keys[static_cast<size_t>(s)];
    if (r.begin != 0) continue;
    whole[static_cast<size_t>(s)] = std::min(table_ld, r.end / page_size);
    if (whole[static_cast<size_t>(s)] == 0) continue;
    auto& members = by_first_page[table[s * table_ld]];
    if (members.empty()) first_pages.push_back(table[s * table_ld]);
    members.push_back(s);
  }
  std::vector<SharedPrefix> prefixes;
  for (const int64_t first : first_pages) {
    const std::vector<int64_t>& members = by_first_page[first];
    if (members.size() < 2) continue;
    const int64_t* lead = table + members[0] * table_ld;
    int64_t pages = whole[static_cast<size_t>(members[0])];
    for (const int64_t s : members) {
      const int64_t* row = table + s * table_ld;
      int64_t common = 0;
      const int64_t most = std::min(pages, whole[static_cast<size_t>(s)]);
      while (common < most && row[common] == lead[common]) ++common;
      pages = common;
    }
    if (pages > 0) prefixes.push_back({members, pages});
  }
  return prefixes;
}

}  // namespace kernels
}  // namespace attention
