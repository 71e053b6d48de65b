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
/// A copy (as clone() makes) starts empty.
///
/// Thread safety: every member may be called from several threads at once (a std::mutex); a
/// buffer that a tensor of one thread still uses is never handed to another.
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
  /// out of range, a negative size, or sizes of more than 2^63 - 1 bytes.
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
/// Thread safety: the buffers form one pool for the process, behind a mutex: calls on any
/// threads may take and give back buffers at once, and this may be asked at any time.
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
/// Thread safety: may run at any time, while other threads compute (a mutex and a generation).
ATTENTION_API void release_kernel_workspace();

/// The default of set_large_buffer_cache_limit(): 1 GiB.
constexpr int64_t kDefaultLargeBufferCacheLimit = int64_t{1} << 30;

/// The bytes of large temporaries kept idle for reuse. The modules' projections, the attention
/// kernels' outputs and their gradients, and the input gradients of training take their memory
/// (when they are CPU tensors of 8 MiB or more) from a process-wide cache: memory that an earlier
/// tensor of the same size (rounded up to 2 MiB) gave back when it was freed, else new memory
/// advised for transparent huge pages. From its second run on, a training step takes no fresh
/// pages for these tensors, and neither does inference: on these machines fresh pages cost about
/// a tenth of a step, and how much depends on the allocator. Memory in use by a tensor is never
/// handed out.
/// At most large_buffer_cache_limit() bytes are kept idle; the buffers kept longest go first.
///
/// Thread safety: one cache for the process, behind a mutex: any thread may take a buffer or
/// give one back (whichever frees its tensor), and these functions may be called at any time.
///
/// Example:
/// \code
/// attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(768, 768, 12));
/// auto x = torch::randn({8, 1024, 768});
/// mha(x).output.sum().backward();
/// std::cout << attention::large_buffer_cache_bytes() << " bytes kept\n";
/// attention::release_large_buffer_cache();  // none kept now
/// \endcode
ATTENTION_API int64_t large_buffer_cache_bytes();

/// The most bytes of large temporaries kept idle (see large_buffer_cache_bytes()).
ATTENTION_API int64_t large_buffer_cache_limit();

/// Sets the most bytes of large temporaries kept idle, freeing what is idle beyond it now; 0 keeps
/// none (every large temporary then takes fresh memory, as without the cache). Throws
/// c10::ValueError for a negative limit. Thread safety: any thread, any time; the limit is the
/// process's, for every thread.
///
/// Example:
/// \code
/// attention::set_large_buffer_cache_limit(int64_t{256} << 20);  // 256 MiB
/// \endcode
ATTENTION_API void set_large_buffer_cache_limit(int64_t bytes);

/// Frees the idle large temporaries; buffers in use now are freed when their tensors go, instead
/// of being kept. Later calls fill the cache again. Thread safety: any thread, any time (a mutex
/// and a generation: buffers in use during the release are freed when they come back).
ATTENTION_API void release_large_buffer_cache();

}  // namespace attention
