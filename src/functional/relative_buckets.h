#pragma once

// The check of a RelativeBuckets whose public fields a caller may have set after t5() or
// distance() made it.

#include <attention/relative_bias.h>

namespace attention {
namespace detail {

/// Throws c10::ValueError, naming `caller` and calling the buckets `what`, unless `buckets` is
/// what RelativeBuckets::t5() or distance() makes of its fields.
void check_relative_buckets(const functional::RelativeBuckets& buckets, const char* what,
                            const char* caller);

}  // namespace detail
}  // namespace attention
