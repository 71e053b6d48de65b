#pragma once

// The lightning indexer's choice on the CPU (LightningIndexer::forward): each row's k highest
// scores among its visible columns, the earlier column first among equal scores, found in place
// with a partial selection per row; no temporaries the size of the scores.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// For rows r < rows of `scores` (row stride ld), whose first visible[r] columns may be chosen:
/// the min(k, visible[r]) highest, ties to the lower column, NaN lowest, written ascending to
/// out[r * width ...], the rest of the row's `width` >= k entries -1.
template <typename T>
void top_k_rows(const T* scores, int64_t rows, int64_t ld, const int64_t* visible, int64_t k,
                int64_t width, int64_t* out);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
