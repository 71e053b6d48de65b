#pragma once

// The queries as the paged kernel's integer products take them against 8-bit keys
// (kernels/cpu/query_codes.h): each row times the softmax scale in float, coded in 16 bits, then
// divided by the scale again in double, so that a reference's scores (the scale times these
// queries' products with the keys) are the integer products the kernel sums, times their scales.
// A reference made of them checks everything but the coding itself at the float route's
// tolerance; the coding's own error is bounded in test_int8_cache.cpp.

#include "kernels/cpu/query_codes.h"
#include "kernels/paged.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace test {

/// q (..., d), float or bfloat16, as coded with the softmax scale `scale`, in double. A row the
/// kernel does not code (a value that is not finite) stays as it is.
inline torch::Tensor as_coded_queries(const torch::Tensor& q, double scale) {
  const int64_t d = q.size(-1);
  const auto rows = q.to(torch::kFloat).contiguous().view({-1, d});
  auto out = rows.to(torch::kDouble);
  const float s = static_cast<float>(scale);
  std::vector<float> scaled(static_cast<size_t>(d));
  std::vector<int16_t> codes(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows.size(0); ++r) {
    const float* row = rows[r].data_ptr<float>();
    for (int64_t c = 0; c < d; ++c) scaled[c] = row[c] * s;
    float code_scale = 0;
    if (!attention::kernels::cpu::code_query_row(scaled.data(), d, codes.data(), &code_scale)) {
      continue;
    }
    double* to = out[r].data_ptr<double>();
    for (int64_t c = 0; c < d; ++c) to[c] = codes[c] * static_cast<double>(code_scale) / scale;
  }
  return out.view(q.sizes());
}

/// The softmax scale `scale` names, or 1 / sqrt(d).
inline double softmax_scale(const c10::optional<double>& scale, int64_t d) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
}

/// The queries a float64 reference of the paged kernel takes: coded where the kernel codes them
/// (8-bit pages, float or bfloat16 queries, paged_codes_int8_queries), else q in double.
inline torch::Tensor reference_queries(const torch::Tensor& q, double scale, torch::Dtype pages,
                                       int64_t dv) {
  const bool coded = pages == torch::kChar && q.scalar_type() != torch::kDouble &&
                     attention::kernels::paged_codes_int8_queries(q.size(-1), dv);
  return coded ? as_coded_queries(q, scale) : q.to(torch::kDouble);
}

/// The most the kernel's coding of each row's weights in 16 bits (paged_codes_int8_weights for
/// 8-bit pages) can move an output feature, over `keys` keys whose values are at most
/// `largest_value` in magnitude (a page row's largest is 127 times its scale): each weight within
/// 1/65534 of the largest of its run, which is at most the row's largest weight, and the output
/// divided by the weights' sum, at least that largest: keys * largest_value / 65534. 0 where
/// the kernel keeps float weights.
inline double weight_coding_bound(int64_t keys, double largest_value, torch::Dtype pages,
                                  torch::Dtype query, int64_t d, int64_t dv) {
  const bool coded = pages == torch::kChar && query != torch::kDouble &&
                     attention::kernels::paged_codes_int8_weights(d, dv);
  return coded ? static_cast<double>(keys) * largest_value / 65534.0 : 0.0;
}

}  // namespace test
