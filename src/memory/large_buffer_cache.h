#pragma once

// Memory for large temporaries (the projections, the attention kernels' outputs and their
// gradients), kept when their tensors are freed and handed out again to a request of the same
// size. On these machines a fresh buffer of several MiB is faulted in and zeroed by the kernel on
// first touch, which in a training step costs about a tenth of the step; a kept one is mapped
// already. The cache is bounded (attention::set_large_buffer_cache_limit) and let go on request
// (attention::release_large_buffer_cache).

#include <cstddef>
#include <cstdint>

namespace attention {
namespace detail {

// Buffers are multiples of this (a transparent huge page) and aligned to it.
constexpr size_t kLargeBufferGranule = size_t{2} << 20;

// Whether this system has the cache (it needs posix_memalign).
constexpr bool large_buffers_available() {
#if defined(_WIN32)
  return false;
#else
  return true;
#endif
}

struct LargeBuffer {
  void* data = nullptr;  // nullptr when no memory could be had
  size_t bytes = 0;      // the request rounded up to the granule
  uint64_t generation = 0;
};

// A buffer of at least `bytes`: a kept one of the same rounded size, else a new one advised for
// huge pages.
LargeBuffer acquire_large_buffer(size_t bytes);

// Hands a buffer from acquire_large_buffer back: kept while the limit allows (the buffers kept
// longest are let go first to make room), freed when it does not or when the cache was released
// after the buffer was acquired.
void give_back_large_buffer(const LargeBuffer& buffer);

}  // namespace detail
}  // namespace attention
