#include "memory/large_buffer_cache.h"

#include <attention/workspace.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attention {
namespace detail {
namespace {

constexpr const char* kSetLimit = "attention::set_large_buffer_cache_limit";

// Idle buffers, oldest first, and a generation that release() advances so that buffers in use
// during a release are freed when they come back instead of kept. The lock is taken once per
// buffer of several MiB, on whichever thread frees its tensor.
class LargeBufferCache {
 public:
  static LargeBufferCache& instance() {
    // Never destroyed: tensors may be freed during exit.
    static LargeBufferCache* cache = new LargeBufferCache();
    return *cache;
  }

  LargeBuffer acquire(size_t bytes) {
    LargeBuffer buffer;
    buffer.bytes = (bytes + kLargeBufferGranule - 1) / kLargeBufferGranule * kLargeBufferGranule;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      buffer.generation = generation_;
      // The newest idle buffer of the size: the likeliest to be in the processor's caches still.
      for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
        if (it->bytes == buffer.bytes) {
          buffer.data = it->data;
          idle_bytes_ -= it->bytes;
          idle_.erase(std::next(it).base());
          return buffer;
        }
      }
    }
#if !defined(_WIN32)
    if (posix_memalign(&buffer.data, kLargeBufferGranule, buffer.bytes) != 0) return LargeBuffer{};
#endif
#if defined(__linux__)
    madvise(buffer.data, buffer.bytes, MADV_HUGEPAGE);  // without transparent huge pages, a no-op
#endif
    return buffer;
  }

  void give_back(const LargeBuffer& buffer) {
    std::deque<LargeBuffer> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (buffer.generation == generation_ && buffer.bytes <= limit_) {
        shrink_to(limit_ - buffer.bytes, &evicted);
        idle_.push_back(buffer);
        idle_bytes_ += buffer.bytes;
      } else {
        evicted.push_back(buffer);
      }
    }
    free_all(evicted);  // outside the lock
  }

  void set_limit(size_t limit) {
    std::deque<LargeBuffer> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = limit;
      shrink_to(limit_, &evicted);
    }
    free_all(evicted);
  }

  void release() {
    std::deque<LargeBuffer> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evicted.swap(idle_);
      idle_bytes_ = 0;
      ++generation_;
    }
    free_all(evicted);
  }

  size_t idle_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_bytes_;
  }

  size_t limit() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }

 private:
  // Moves the oldest idle buffers to `evicted` until at most `bytes` are idle; under the lock.
  void shrink_to(size_t bytes, std::deque<LargeBuffer>* evicted) {
    while (idle_bytes_ > bytes) {
      evicted->push_back(idle_.front());
      idle_bytes_ -= idle_.front().bytes;
      idle_.pop_front();
    }
  }

  static void free_all(const std::deque<LargeBuffer>& buffers) {
    for (const LargeBuffer& buffer : buffers) std::free(buffer.data);
  }

  mutable std::mutex mutex_;
  std::deque<LargeBuffer> idle_;
  size_t idle_bytes_ = 0;
  size_t limit_ = static_cast<size_t>(kDefaultLargeBufferCacheLimit);
  uint64_t generation_ = 0;
};

}  // namespace

LargeBuffer acquire_large_buffer(size_t bytes) {
  return LargeBufferCache::instance().acquire(bytes);
}

void give_back_large_buffer(const LargeBuffer& buffer) {
  LargeBufferCache::instance().give_back(buffer);
}

}  // namespace detail

int64_t large_buffer_cache_bytes() {
  return static_cast<int64_t>(detail::LargeBufferCache::instance().idle_bytes());
}

int64_t large_buffer_cache_limit() {
  return static_cast<int64_t>(detail::LargeBufferCache::instance().limit());
}

void set_large_buffer_cache_limit(int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, detail::kSetLimit, ": expected a limit >= 0 bytes, got ", bytes);
  detail::LargeBufferCache::instance().set_limit(static_cast<size_t>(bytes));
}

void release_large_buffer_cache() {
  detail::LargeBufferCache::instance().release();
}

}  // namespace attention
