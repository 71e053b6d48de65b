#pragma once

// Shared by the two halves of the chunked backend: the device-generic tiles made of LibTorch
// ops (chunked.cpp, forward and backward) and the fused CPU forward (chunked_cpu.cpp).

#include "kernels/problem.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace attention {
namespace kernels {

/// Whether the fused CPU forward takes these queries: CPU, float or double.
bool cpu_forward_applies(const torch::Tensor& query);

/// The fused CPU forward of `p`, whose mask (if any) is expanded to the scores' shape. Inputs
/// keep their shapes (..., H, T, d) (rank 3 at least) and may be strided views.
/// Returns the output, shaped like the queries with dv features and laid out in memory like them
/// (so that a module's transpose back to (B, T, H, dv) is a view), and the log-sum-exp of every
/// query's scaled scores (N, G, Tq), +inf for a query whose keys are all masked.
std::pair<torch::Tensor, torch::Tensor> cpu_forward(const Problem& p, const torch::Tensor& query,
                                                    const torch::Tensor& key,
                                                    const torch::Tensor& value);

}  // namespace kernels
}  // namespace attention
