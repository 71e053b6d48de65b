#pragma once

/// \file
/// Buffers a module keeps between calls for its large temporaries.

#include <attention/export.h>
#include <torch/types.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace attention {

/// A few buffers, one per named temporary ("slot"), that a module reuses from call to call
/// instead of taking fresh memory each time. On these machines a fresh buffer of several MiB is
/// faulted in page by page and zeroed by the kernel, which costs as much as a good part of the
/// arithmetic; a reused one costs nothing.
///
/// A slot's buffer is handed out again only when the workspace holds the only reference to its
/// memory: a tensor that still uses it (kept by the caller, by autograd, by a cache) is never
/// overwritten; the slot then gets a new buffer and the old one lives on with its users. A slot
/// keeps the largest buffer it was asked for, so the memory held is at most the sum over slots of
/// their largest request; release() gives it back (to the allocator, once no tensor uses it).
/// Calls from several threads are safe. A copy (as clone() makes) starts empty.
///
/// Example:
/// \code
/// attention::Workspace workspace;
/// torch::Tensor a = workspace.take(/*slot=*/0, {4, 64}, torch::kFloat);
/// a.zero_();
/// a = torch::Tensor();  // let go of it: the next take() of slot 0 hands the same memory out
/// torch::Tensor b = workspace.take(0, {2, 64}, torch::kFloat);
/// workspace.release();  // b stays valid; the workspace no longer holds memory
/// \endcode
class ATTENTION_API Workspace {
 public:
  /// An empty workspace.
  Workspace() = default;
  /// An empty workspace: buffers are never shared between copies.
  Workspace(const Workspace&) : Workspace() {}
  /// Keeps this workspace's own buffers: buffers are never shared between copies.
  Workspace& operator=(const Workspace&) { return *this; }

  /// An uninitialized contiguous tensor of `sizes` for temporary `slot` (0 <= slot < 16): a view
  /// of the slot's buffer when that buffer is free, large enough, and of the same dtype and
  /// device; otherwise from a new buffer that the slot keeps. Throws c10::ValueError for a slot
  /// out of range or a negative size.
  torch::Tensor take(int slot, c10::IntArrayRef sizes, const torch::TensorOptions& options);

  /// Drops every buffer; memory still used by a tensor is freed when that tensor goes.
  void release();

  /// The bytes of the buffers held now.
  int64_t bytes() const;

 private:
  mutable std::mutex mutex_;
  std::vector<torch::Tensor> buffers_;  // flat, one per slot in use
};

}  // namespace attention
