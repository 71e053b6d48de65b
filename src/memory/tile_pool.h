#pragma once

// Memory for the fused CPU kernels' per-worker tiles, kept between calls: on these machines a
// fresh buffer is faulted in page by page on every call, while a kept one is already mapped and
// usually still in the cache.

#include <cstddef>
#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

// The largest buffer the pool keeps (larger ones, from block sizes above 512 in float, are freed
// at the end of their call), and the most it keeps in all.
constexpr size_t kMaxPooledTileBytes = size_t{4} << 20;
constexpr size_t kMaxPooledBytes = size_t{32} << 20;

// One worker's tile memory for the length of its share of a parallel loop: a kept buffer large
// enough when the pool has one, else a new one; handed back to the pool (or freed) when the lease
// ends. Leases are taken once per worker and call, so the pool's lock is never contended in the
// loops. The memory is uninitialized.
class TileLease {
 public:
  explicit TileLease(size_t bytes);
  ~TileLease();
  TileLease(const TileLease&) = delete;
  TileLease& operator=(const TileLease&) = delete;

  // The next `count` elements of the buffer, 64-byte aligned; the lease's `bytes` must have
  // counted them with tile_bytes<T>().
  template <typename T>
  T* take(int64_t count) {
    T* at = reinterpret_cast<T*>(data_ + used_);
    used_ += tile_bytes<T>(count);
    return at;
  }

  // The bytes take<T>(count) uses.
  template <typename T>
  static size_t tile_bytes(int64_t count) {
    return (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
  }

 private:
  char* data_;
  size_t bytes_;
  size_t used_ = 0;
  uint64_t generation_;
};

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
