#include "gemm/code_cache.h"

#include <cstring>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define ATTENTION_HAVE_MMAP 1
#endif

namespace attention {
namespace kernels {
namespace cpu {
namespace {

size_t table_size_for(size_t capacity) {
  size_t size = 2;
  while (size < 2 * capacity) size *= 2;
  return size;
}

#if defined(ATTENTION_HAVE_MMAP)

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Copies `code` into fresh pages that are writable while it is copied and then only readable
// and executable; nullptr where the system refuses either step.
void* map_executable(const std::vector<unsigned char>& code, size_t* mapped) {
  const size_t bytes = (code.size() + page_size() - 1) / page_size() * page_size();
  void* pages = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) return nullptr;
  std::memcpy(pages, code.data(), code.size());
  if (mprotect(pages, bytes, PROT_READ | PROT_EXEC) != 0) {
    munmap(pages, bytes);
    return nullptr;
  }
  *mapped = bytes;
  return pages;
}

void unmap(void* pages, size_t bytes) {
  munmap(pages, bytes);
}

#else

// No executable pages of our own here: every key gets no code, and callers take BLAS.
void* map_executable(const std::vector<unsigned char>&, size_t*) {
  return nullptr;
}

void unmap(void*, size_t) {}

#endif

}  // namespace

CodeCache::CodeCache(size_t capacity)
    : capacity_(capacity),
      table_size_(table_size_for(capacity)),
      slots_(new std::atomic<const Entry*>[table_size_]) {
  for (size_t i = 0; i < table_size_; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

CodeCache::~CodeCache() {
  for (size_t i = 0; i < table_size_; ++i) {
    const Entry* entry = slots_[i].load(std::memory_order_relaxed);
    if (entry == nullptr) continue;
    if (entry->code != nullptr) unmap(entry->code, entry->mapped);
    delete entry;
  }
}

size_t CodeCache::slot_of(const Key& key) const {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the key's words
  for (const int64_t word : key) {
    hash ^= static_cast<uint64_t>(word);
    hash *= 1099511628211ull;
  }
  return static_cast<size_t>(hash ^ (hash >> 29)) & (table_size_ - 1);
}

const CodeCache::Entry* CodeCache::find(const Key& key) const {
  for (size_t slot = slot_of(key);; slot = (slot + 1) & (table_size_ - 1)) {
    const Entry* entry = slots_[slot].load(std::memory_order_acquire);
    if (entry == nullptr || entry->key == key) return entry;
  }
}

const void* CodeCache::generate_and_keep(const Key& key, const Generator& generate) {
  std::lock_guard<std::mutex> lock(generating_);
  if (const Entry* entry = find(key)) return entry->code;  // generated while this thread waited
  if (size_ == capacity_) return nullptr;
  std::unique_ptr<Entry> entry(new Entry{key, nullptr, 0});
  const std::vector<unsigned char> code = generate();
  if (!code.empty()) entry->code = map_executable(code, &entry->mapped);
  size_t slot = slot_of(key);
  while (slots_[slot].load(std::memory_order_relaxed) != nullptr)
    slot = (slot + 1) & (table_size_ - 1);
  ++size_;
  mapped_bytes_ += entry->mapped;
  const Entry* published = entry.release();
  slots_[slot].store(published, std::memory_order_release);
  return published->code;
}

size_t CodeCache::size() const {
  std::lock_guard<std::mutex> lock(generating_);
  return size_;
}

size_t CodeCache::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(generating_);
  return mapped_bytes_;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
