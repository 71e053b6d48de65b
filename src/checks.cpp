#include "checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

namespace attention {
namespace detail {

std::string shape_str(c10::IntArrayRef sizes) {
  if (sizes.size() == 1) return fmt::format("({},)", sizes[0]);
  return fmt::format("({})", fmt::join(sizes, ", "));
}

bool broadcastable_to(c10::IntArrayRef from, c10::IntArrayRef to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i) {
    const int64_t f = from[from.size() - i], t = to[to.size() - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

bool fits_in_bytes(c10::IntArrayRef sizes, int64_t element_size) {
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return true;
  int64_t bytes = element_size;
  for (const int64_t size : sizes) {
    if (bytes > std::numeric_limits<int64_t>::max() / size) return false;
    bytes *= size;
  }
  return true;
}

}  // namespace detail
}  // namespace attention
