#include "checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

}  // namespace detail
}  // namespace attention
