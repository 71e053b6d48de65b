#pragma once

// 8-bit rows with a scale each, the format of the 8-bit caches (PagedKVCache of dtype Char):
// a row x of n features is kept as codes c = round(x / s), |c| <= 127, with s = max|x| / 127, and
// stands for c * s. Symmetric (no zero point), so that a score is the row's scale times an integer
// combination of the query, and each element is off by at most s / 2.

#include <torch/types.h>

namespace attention {
namespace detail {

/// The codes and scales of rows: `rows` (..., n) floating; codes (..., n) int8 and scales (...)
/// float, on rows' device. A row of zeros has scale 0 and codes 0. A row holding a NaN or an
/// infinity has scale NaN (and codes 0), so that every score and output it enters is NaN, as the
/// unquantized row makes it, rather than a finite number that no longer says the input was bad.
struct Int8Rows {
  torch::Tensor codes, scales;
};
Int8Rows quantize_rows(const torch::Tensor& rows);

/// What 8-bit rows stand for, codes * scales, in `dtype`.
torch::Tensor dequantize_rows(const torch::Tensor& codes, const torch::Tensor& scales,
                              torch::Dtype dtype);

}  // namespace detail
}  // namespace attention
