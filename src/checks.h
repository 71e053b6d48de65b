#pragma once

// Small checks every layer shares (the functional layer, the kernels, the modules, the readers,
// attention::distributed): shapes in messages, broadcasting, whether autograd records.

#include <attention/export.h>

#include <c10/core/GradMode.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

namespace attention {
namespace detail {

/// "(6, 4)"
/// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
ATTENTION_API std::string shape_str(c10::IntArrayRef sizes);

/// True when a tensor of shape `from` broadcasts to `to` without changing `to`.
bool broadcastable_to(c10::IntArrayRef from, c10::IntArrayRef to);

/// Whether a tensor of `sizes` (each >= 0) with elements of `element_size` bytes holds at most
/// 2^63 - 1 bytes, computed without overflow.
bool fits_in_bytes(c10::IntArrayRef sizes, int64_t element_size);

/// Whether autograd records an op on these tensors: grad mode is on and a defined one of them
/// requires a gradient. By reference: no reference count changes on the article-sized path.
template <typename... Tensors>
bool records_grad(const Tensors&... tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  return ((tensors.defined() && tensors.requires_grad()) || ...);
}

/// Refuses a second-order gradient through a fused CPU backward. Its gradients come from raw
/// memory and carry no autograd record, so a double backward would take them as constants and
/// give a wrong result without a word. Called first in those backward functions, where grad mode
/// is on exactly when the caller asked for create_graph.
inline void refuse_double_backward(const char* caller) {
  TORCH_CHECK(!c10::GradMode::is_enabled(), caller,
              ": the fused CPU backward gives first-order gradients only; a double backward "
              "(create_graph=True) needs the backend in LibTorch's ops (Backend::Math)");
}

}  // namespace detail
}  // namespace attention
