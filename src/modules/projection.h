#pragma once

// The modules' projections: into a workspace in inference; in training an autograd function
// whose output and input gradient come from empty_large; both through gemm/large_gemm.h where
// that is this machine's route and takes the shapes.

#include <attention/workspace.h>

#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <array>

namespace attention {
namespace detail {

/// linear(x) for a contiguous CPU x that records a gradient, with its output and the input's
/// gradient from empty_large (higher-order gradients are taken with ordinary ops).
torch::Tensor linear_large(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias);

/// linear(x) with its output from empty_large, or from `slot` of `workspace` when one is given,
/// when no gradient is recorded (LibTorch's out= products do not record one); with a gradient,
/// linear_large for a contiguous CPU x, linear(x) itself otherwise.
torch::Tensor project(const torch::nn::Linear& linear, const torch::Tensor& x,
                      Workspace* workspace = nullptr, int slot = 0);

/// The queries, keys and values: project() of x by `query` and of `source` by `key` and `value`,
/// into slots 0, 1 and 2 of `workspace`. With a gradient recorded on a contiguous CPU x that is
/// also the source (self-attention), one autograd node makes all three and, in its backward,
/// one gradient of x with the three products summed into it.
std::array<torch::Tensor, 3> project_qkv(const torch::nn::Linear& query,
                                         const torch::nn::Linear& key,
                                         const torch::nn::Linear& value, const torch::Tensor& x,
                                         const torch::Tensor& source, Workspace* workspace);

}  // namespace detail
}  // namespace attention
