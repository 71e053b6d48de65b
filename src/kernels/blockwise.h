#pragma once

// The interface attention::distributed uses from the kernels, and the only internal code a
// shared build exports (ATTENTION_API; scripts/check_exports.sh allows these and nothing else):
// the validated problem (kernels/problem.h: make_problem, Problem::expanded_mask), the Chunked
// backend's two halves without autograd, which merge the results of several key blocks through
// their log-sum-exp, and detail::shape_str (checks.h) for messages.

#include "checks.h"
#include "kernels/problem.h"

#include <torch/types.h>

#include <tuple>
#include <utility>

namespace attention {
namespace kernels {

/// The Chunked forward of `p` (its mask expanded to the scores' shape) without autograd: the fused
/// CPU forward where it applies, else the tiles. Returns the output shaped like the queries with
/// dv features and the log-sum-exp (N, G, Tq), +inf for a query that sees no key.
ATTENTION_API std::pair<torch::Tensor, torch::Tensor> forward_with_lse(const Problem& p,
                                                                       const torch::Tensor& query,
                                                                       const torch::Tensor& key,
                                                                       const torch::Tensor& value);

/// The gradients of query, key and value (shaped like them) of the keys of `p`, given the final
/// output `out` and log-sum-exp `lse` (N, G, Tq) of the queries. When the keys of `p` are one
/// block of a longer sequence, `out` and `lse` are those of the whole sequence, and the results
/// are that block's share of the gradients. The fused CPU backward where it applies, else the
/// tiles.
ATTENTION_API std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward_with_lse(
    const Problem& p, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const torch::Tensor& out, const torch::Tensor& lse,
    const torch::Tensor& grad_out);

}  // namespace kernels
}  // namespace attention
