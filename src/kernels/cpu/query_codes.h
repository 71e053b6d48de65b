#pragma once

// Query rows as 16-bit integer codes with a scale per row, for scores against 8-bit keys on
// integer products (kernels/cpu/decode_products.h): q[c] is taken as scale * codes[c], with scale
// = max_c |q[c]| / limit and codes[c] = q[c] / scale rounded to nearest. Each feature then differs
// from the query by at most scale / 2, 1/65534 of the row's largest value where limit is 32767 (d
// up to 512), and a score by at most scale / 2 * key_scale * sum_c |key code|: error of the order
// of float32's own rounding of the products, far below the 8-bit keys' own.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// The largest code a query of d features takes: 32767, or less where d products of a code and an
/// 8-bit key code (|code| <= 128) could pass a 32-bit integer's range (d > 512).
int64_t query_code_limit(int64_t d);

/// The codes (d of them) and scale of the query row q; false, with nothing written, where the row
/// holds a value that is not finite or its largest is too small for a scale (subnormal): such a
/// row keeps the float products. A row of zeros has scale 0 and codes 0.
bool code_query_row(const float* q, int64_t d, int16_t* codes, float* scale);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
