#pragma once

// Random access to the bytes of a weight file, in memory or on disk. Readers ask for the ranges
// they need, so a torch.save archive on disk is never held in memory as a whole: each tensor
// record is read straight into the tensor that holds it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace attention {
namespace serialization {

/// The unsigned little-endian integer in the `width` (at most 8) bytes at `p`.
inline uint64_t little_endian(const char* p, std::size_t width) {
  uint64_t v = 0;
  for (std::size_t i = width; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Total number of bytes.
  virtual uint64_t size() const = 0;
  /// Copies `n` bytes at `offset` into `out`; throws c10::Error when the range is past the end or
  /// the read fails.
  virtual void read(uint64_t offset, void* out, std::size_t n) const = 0;
  /// The name used in error messages (a path, or "<memory>").
  virtual const std::string& name() const = 0;

  /// `n` bytes at `offset` as a string.
  std::string read_string(uint64_t offset, std::size_t n) const;
};

/// Bytes owned by someone else, alive for as long as the source is used.
class MemorySource final : public ByteSource {
 public:
  MemorySource(const char* data, std::size_t size, std::string name);
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* out, std::size_t n) const override;
  const std::string& name() const override { return name_; }

 private:
  const char* data_;
  std::size_t size_;
  std::string name_;
};

/// A regular file, opened for reading; its size is taken once, when it is opened.
class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path);
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* out, std::size_t n) const override;
  const std::string& name() const override { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file_;
  uint64_t size_ = 0;
  std::string path_;
};

}  // namespace serialization
}  // namespace attention
