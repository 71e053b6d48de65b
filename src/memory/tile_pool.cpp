#include "memory/tile_pool.h"

#include <attention/workspace.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

struct Buffer {
  char* data;
  size_t bytes;
};

// Idle buffers, and a generation that release() advances so that buffers leased before it are
// freed when their lease ends instead of kept.
class TilePool {
 public:
  static TilePool& instance() {
    static TilePool* pool = new TilePool();  // never destroyed: leases may end during exit
    return *pool;
  }

  Buffer acquire(size_t bytes, uint64_t* generation) {
    std::lock_guard<std::mutex> lock(mutex_);
    *generation = generation_;
    // The smallest idle buffer that is large enough.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->bytes >= bytes && (best == idle_.end() || it->bytes < best->bytes)) best = it;
    }
    if (best != idle_.end()) {
      const Buffer found = *best;
      idle_.erase(best);
      idle_bytes_ -= found.bytes;
      return found;
    }
    // None fits: the block size grew. Let the largest idle buffer go, which is too small now.
    if (!idle_.empty()) {
      auto largest =
          std::max_element(idle_.begin(), idle_.end(),
                           [](const Buffer& a, const Buffer& b) { return a.bytes < b.bytes; });
      idle_bytes_ -= largest->bytes;
      std::free(largest->data);
      idle_.erase(largest);
    }
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    char* data = static_cast<char*>(std::aligned_alloc(64, rounded));
    TORCH_CHECK(data != nullptr, "attention::functional::scaled_dot_product_attention: could not ",
                "allocate ", rounded, " bytes for the Chunked kernel's tiles");
    return {data, rounded};
  }

  void give_back(Buffer buffer, uint64_t generation) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (generation == generation_ && buffer.bytes <= kMaxPooledTileBytes &&
        idle_bytes_ + buffer.bytes <= kMaxPooledBytes) {
      idle_.push_back(buffer);
      idle_bytes_ += buffer.bytes;
    } else {
      std::free(buffer.data);
    }
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Buffer& buffer : idle_) std::free(buffer.data);
    idle_.clear();
    idle_bytes_ = 0;
    ++generation_;
  }

  size_t idle_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_bytes_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Buffer> idle_;
  size_t idle_bytes_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace

TileLease::TileLease(size_t bytes) {
  const Buffer buffer = TilePool::instance().acquire(std::max<size_t>(bytes, 64), &generation_);
  data_ = buffer.data;
  bytes_ = buffer.bytes;
}

TileLease::~TileLease() {
  TilePool::instance().give_back({data_, bytes_}, generation_);
}

}  // namespace cpu
}  // namespace kernels

int64_t kernel_workspace_bytes() {
  return static_cast<int64_t>(kernels::cpu::TilePool::instance().idle_bytes());
}

void release_kernel_workspace() {
  kernels::cpu::TilePool::instance().release();
}

}  // namespace attention
