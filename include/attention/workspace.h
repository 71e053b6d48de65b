#pragma once

/// \file
/// Buffers kept between calls for large temporaries: a module's, and the fused kernels' tiles.

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

/// The bytes the fused CPU kernels (Backend::Chunked, and Auto where it picks it) keep between
/// calls for their tiles: one buffer per worker thread that ran them, reused by the next call
/// instead of fresh pages each time (at the default block of 256 in float, 320 KiB for the
/// forward and 768 KiB for the backward). Buffers above 4 MiB (block sizes above 512 in float) are
/// not kept, nor more than 32 MiB in all.
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// auto q = torch::randn({1, 8, 2048, 64});
/// F::scaled_dot_product_attention(q, q, q,
///                                 F::ScaledDotProductAttentionOptions().backend(F::Backend::Chunked));
/// std::cout << attention::kernel_workspace_bytes() << " bytes kept\n";
/// attention::release_kernel_workspace();  // none kept from here on
/// \endcode
ATTENTION_API int64_t kernel_workspace_bytes();

/// Frees the tile buffers the fused CPU kernels keep (see kernel_workspace_bytes()); buffers in use
/// by a call running now are freed when it ends. Later calls allocate them again.
ATTENTION_API void release_kernel_workspace();

}  // namespace attention
