#pragma once

// The refusals of paged_attention, checked before a module writes a step's keys into its cache,
// so that a refused step leaves the cache as it was.

#include <attention/functional.h>

#include <torch/types.h>

namespace attention {
namespace detail {

/// Throws, naming `caller`, what paged_attention would throw for these arguments once the step's
/// keys `new_keys` (total_q, Hkv, d) are in the pages, and checks nothing else: the pages need
/// not hold them yet.
void check_paged_step(const torch::Tensor& query, const torch::Tensor& key_pages,
                      const torch::Tensor& key_scales, const torch::Tensor& value_pages,
                      const torch::Tensor& value_scales, const torch::Tensor& cu_seqlens_q,
                      const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                      const functional::ScaledDotProductAttentionOptions& options,
                      const torch::Tensor& new_keys, const char* caller);

}  // namespace detail
}  // namespace attention
