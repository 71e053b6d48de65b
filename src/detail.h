#pragma once

// What the modules share besides the functional layer: input validation (every message names
// the caller, what it expected and what it got) and the article's query/key/value parameters.

#include <attention/workspace.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <c10/core/GradMode.h>
#include <array>
#include <string>

namespace attention {
namespace detail {

/// "(6, 4)"
/// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
ATTENTION_API std::string shape_str(c10::IntArrayRef sizes);

/// Checks a module input of shape (T, d_in) or (B, T, d_in) against the module's parameters:
/// rank, feature size, dtype and device. `what` names the argument in messages ("input", "x_2").
void check_module_input(const torch::Tensor& x, int64_t d_in, const torch::Tensor& parameter,
                        const char* module, const char* what);

/// True when a tensor of shape `from` broadcasts to `to` without changing `to`.
bool broadcastable_to(c10::IntArrayRef from, c10::IntArrayRef to);

/// Checks that two module inputs have the same rank and batch size; `names` is how messages call
/// them ("x_1 and x_2").
void check_same_batch(const torch::Tensor& a, const torch::Tensor& b, const char* module,
                      const char* name_a, const char* name_b);

/// Checks that a constructor argument is positive.
void check_positive(int64_t value, const char* name, const char* module);

/// Whether a tensor of `sizes` (each >= 0) with elements of `element_size` bytes holds at most
/// 2^63 - 1 bytes, computed without overflow.
bool fits_in_bytes(c10::IntArrayRef sizes, int64_t element_size);

/// A cache's append: keys and values of one shape (B, Hkv, T, head_dim), floating, of one dtype
/// and device, and, once the cache holds tokens (`cached` defined), like those.
void check_cache_append(const torch::Tensor& keys, const torch::Tensor& values,
                        const torch::Tensor& cached, const char* cache);

/// The article's projection matrices, registered as `W_query` (d_in, d_out_kq), `W_key`
/// (d_in_kv, d_out_kq), `W_value` (d_in_kv, d_out_v) and drawn with torch::rand in that order, so
/// that a seed gives the same weights as the Python classes.
struct QKVWeights {
  torch::Tensor W_query, W_key, W_value;
};
QKVWeights register_qkv(torch::nn::Module& module, int64_t d_in, int64_t d_in_kv, int64_t d_out_kq,
                        int64_t d_out_v, const char* name);

/// Whether autograd records an op on these tensors: grad mode is on and a defined one of them
/// requires a gradient. By reference: no reference count changes on the article-sized path.
template <typename... Tensors>
bool records_grad(const Tensors&... tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  return ((tensors.defined() && tensors.requires_grad()) || ...);
}

/// An uninitialized tensor for a large temporary. CPU tensors of 8 MiB and more come from the
/// large-buffer cache (large_buffer_cache.h): memory kept from an earlier tensor of the same size
/// when there is one, else memory advised for transparent huge pages, where first touch faults
/// once per 2 MiB instead of once per 4 KiB. Its storage cannot be resized. Anything else (and
/// everything on systems without posix_memalign) comes from torch::empty.
torch::Tensor empty_large(c10::IntArrayRef sizes, const torch::TensorOptions& options);

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
