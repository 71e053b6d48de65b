#include "serialization/byte_source.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <filesystem>

namespace attention {
namespace serialization {
namespace {

void check_range(const ByteSource& source, uint64_t offset, std::size_t n) {
  TORCH_CHECK(offset <= source.size() && n <= source.size() - offset, "'", source.name(),
              "' ends at byte ", source.size(), ", before ", n, " bytes at offset ", offset);
}

}  // namespace

std::string ByteSource::read_string(uint64_t offset, std::size_t n) const {
  check_range(*this, offset, n);
  std::string out(n, '\0');
  read(offset, out.data(), n);
  return out;
}

MemorySource::MemorySource(const char* data, std::size_t size, std::string name)
    : data_(data), size_(size), name_(std::move(name)) {}

void MemorySource::read(uint64_t offset, void* out, std::size_t n) const {
  check_range(*this, offset, n);
  if (n > 0) std::memcpy(out, data_ + offset, n);
}

FileSource::FileSource(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TORCH_CHECK(fs::exists(path, ec), "no file at '", path, "'");
  TORCH_CHECK(fs::is_regular_file(path, ec), "'", path, "' is not a regular file");
  file_.reset(std::fopen(path.c_str(), "rb"));
  TORCH_CHECK(file_ != nullptr, "cannot open '", path, "'");
  const auto size = fs::file_size(path, ec);
  TORCH_CHECK(!ec, "cannot read the size of '", path, "': ", ec.message());
  size_ = size;
}

void FileSource::read(uint64_t offset, void* out, std::size_t n) const {
  check_range(*this, offset, n);
  if (n == 0) return;
  TORCH_CHECK(fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) == 0, "cannot seek to ",
              offset, " in '", path_, "'");
  TORCH_CHECK(std::fread(out, 1, n, file_.get()) == n, "cannot read ", n, " bytes at offset ",
              offset, " of '", path_, "' (was it changed while being read?)");
}

}  // namespace serialization
}  // namespace attention
