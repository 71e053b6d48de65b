#include "serialization/zip_archive.h"

#include <c10/util/Exception.h>

#include <zlib.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace attention {
namespace serialization {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr std::size_t kEndRecordSize = 22;
constexpr std::size_t kMaxComment = 0xffff;

// A little-endian field of a header held in a string; every caller has checked the bounds, and a
// miss is a c10::Error all the same.
uint64_t le(const std::string& bytes, std::size_t at, std::size_t width) {
  TORCH_CHECK(at <= bytes.size() && width <= bytes.size() - at, "zip header field out of bounds");
  return little_endian(bytes.data() + at, width);
}

struct CentralDirectory {
  uint64_t entries;
  uint64_t size;
  uint64_t offset;
};

CentralDirectory find_central_directory(const ByteSource& source) {
  const uint64_t file_size = source.size();
  TORCH_CHECK(file_size >= kEndRecordSize, "'", source.name(), "' is too short for a zip archive");
  const uint64_t tail_size = std::min<uint64_t>(file_size, kEndRecordSize + kMaxComment);
  const uint64_t tail_start = file_size - tail_size;
  const std::string tail = source.read_string(tail_start, static_cast<std::size_t>(tail_size));
  // The end record is the last signature whose comment runs exactly to the end of the file.
  for (std::size_t at = tail.size() - kEndRecordSize + 1; at-- > 0;) {
    if (le(tail, at, 4) != kEndOfCentralDirectory) continue;
    if (at + kEndRecordSize + le(tail, at + 20, 2) != tail.size()) continue;
    TORCH_CHECK(le(tail, at + 4, 2) == 0 && le(tail, at + 6, 2) == 0 &&
                    le(tail, at + 8, 2) == le(tail, at + 10, 2),
                "'", source.name(), "' is a zip archive split over several disks");
    CentralDirectory cd{le(tail, at + 10, 2), le(tail, at + 12, 4), le(tail, at + 16, 4)};
    const bool zip64 = cd.entries == 0xffff || cd.size == 0xffffffff || cd.offset == 0xffffffff;
    if (!zip64) return cd;
    const uint64_t end_record = tail_start + at;
    TORCH_CHECK(end_record >= 20, "'", source.name(), "' lacks its zip64 locator");
    const std::string locator = source.read_string(end_record - 20, 20);
    TORCH_CHECK(le(locator, 0, 4) == kZip64Locator, "'", source.name(),
                "' lacks its zip64 locator");
    const std::string record = source.read_string(le(locator, 8, 8), 56);
    TORCH_CHECK(le(record, 0, 4) == kZip64EndOfCentralDirectory, "'", source.name(),
                "' has no zip64 end of central directory where its locator points");
    return CentralDirectory{le(record, 32, 8), le(record, 40, 8), le(record, 48, 8)};
  }
  TORCH_CHECK(false, "'", source.name(), "' has no zip end of central directory record");
}

}  // namespace

ZipArchive::ZipArchive(const ByteSource& source) : source_(source) {
  const std::string& file = source.name();
  const CentralDirectory cd = find_central_directory(source);
  TORCH_CHECK(cd.offset <= source.size() && cd.size <= source.size() - cd.offset, "'", file,
              "' has a central directory past its end");
  // Each entry takes at least 46 bytes, which bounds the count before anything is allocated.
  TORCH_CHECK(cd.entries <= cd.size / 46, "'", file, "' claims ", cd.entries,
              " records in a central directory of ", cd.size, " bytes");
  const std::string dir = source.read_string(cd.offset, static_cast<std::size_t>(cd.size));
  struct Extent {
    uint64_t begin, end;  // the local header to the end of the data
    std::size_t index;    // in names_
  };
  std::vector<Extent> extents;
  std::size_t at = 0;
  for (uint64_t i = 0; i < cd.entries; ++i) {
    TORCH_CHECK(at + 46 <= dir.size() && le(dir, at, 4) == kCentralHeader, "'", file,
                "' has a damaged central directory (entry ", i, ")");
    const auto flags = le(dir, at + 8, 2);
    const auto method = le(dir, at + 10, 2);
    const auto crc = static_cast<uint32_t>(le(dir, at + 16, 4));
    uint64_t compressed = le(dir, at + 20, 4);
    uint64_t size = le(dir, at + 24, 4);
    const auto name_length = le(dir, at + 28, 2);
    const auto extra_length = le(dir, at + 30, 2);
    const auto comment_length = le(dir, at + 32, 2);
    uint64_t local = le(dir, at + 42, 4);
    const std::size_t end = at + 46 + name_length + extra_length + comment_length;
    TORCH_CHECK(end <= dir.size(), "'", file, "' has a damaged central directory (entry ", i, ")");
    std::string name = dir.substr(at + 46, name_length);
    // zip64: the fields saturated in the fixed header follow in the extra field, in order.
    for (std::size_t e = at + 46 + name_length; e + 4 <= at + 46 + name_length + extra_length;) {
      const auto id = le(dir, e, 2);
      const auto length = le(dir, e + 2, 2);
      TORCH_CHECK(e + 4 + length <= at + 46 + name_length + extra_length, "'", file,
                  "' has a damaged extra field in record '", name, "'");
      if (id == kZip64Extra) {
        std::size_t f = e + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffff) return;
          TORCH_CHECK(f + 8 <= e + 4 + length, "'", file, "' has a short zip64 field in '", name,
                      "'");
          field = le(dir, f, 8);
          f += 8;
        };
        take(size);
        take(compressed);
        take(local);
      }
      e += 4 + length;
    }
    TORCH_CHECK((flags & 1) == 0, "'", file, "': record '", name, "' is encrypted");
    // Compressed records (TorchScript compresses its code) are listed, and refused when read.
    const bool stored = method == 0 && compressed == size;
    if (!stored) size = compressed;
    TORCH_CHECK(local <= source.size() && source.size() - local >= 30, "'", file, "': record '",
                name, "' starts past the end of the file");
    const std::string header = source.read_string(local, 30);
    TORCH_CHECK(le(header, 0, 4) == kLocalHeader, "'", file, "': record '", name,
                "' has no local header where the central directory points");
    const uint64_t data = local + 30 + le(header, 26, 2) + le(header, 28, 2);
    TORCH_CHECK(data <= source.size() && size <= source.size() - data, "'", file, "': record '",
                name, "' (", size, " bytes) runs past the end of the file");
    TORCH_CHECK(records_.emplace(name, Record{data, size, crc, stored}).second, "'", file,
                "' holds two records named '", name, "'");
    extents.push_back({local, data + size, names_.size()});
    names_.push_back(std::move(name));
    at = end;
  }
  // Each record owns its bytes: entries that share or overlap records (a "zip bomb" of one
  // record read many times), or records that reach into the central directory, are refused. So
  // the records read hold at most the file's size between them.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.index < b.index;
  });
  for (std::size_t i = 0; i < extents.size(); ++i) {
    const uint64_t next = i + 1 < extents.size() ? extents[i + 1].begin : cd.offset;
    TORCH_CHECK(extents[i].end <= next, "'", file, "': record '", names_[extents[i].index], "' ",
                i + 1 < extents.size() ? "overlaps record '" + names_[extents[i + 1].index] + "'"
                                       : std::string("runs into the central directory"),
                " (zip records must not share bytes)");
  }
}

const ZipArchive::Record& ZipArchive::record(const std::string& name) const {
  auto it = records_.find(name);
  TORCH_CHECK(it != records_.end(), "'", source_.name(), "' has no record '", name, "'");
  TORCH_CHECK(it->second.stored, "'", source_.name(), "': record '", name,
              "' is compressed; torch.save stores records uncompressed");
  return it->second;
}

uint64_t ZipArchive::size(const std::string& name) const {
  return record(name).size;
}

void ZipArchive::read(const std::string& name, void* out) const {
  const Record& r = record(name);
  TORCH_CHECK(r.size <= std::numeric_limits<std::size_t>::max(), "record '", name,
              "' is too large");
  source_.read(r.data_offset, out, static_cast<std::size_t>(r.size));
  const auto computed =
      crc32_z(0, static_cast<const Bytef*>(out), static_cast<std::size_t>(r.size));
  TORCH_CHECK(computed == r.crc32, "'", source_.name(), "': record '", name,
              "' is damaged (its CRC-32 does not match)");
}

std::string ZipArchive::read_string(const std::string& name) const {
  std::string out(static_cast<std::size_t>(size(name)), '\0');
  read(name, out.data());
  return out;
}

}  // namespace serialization
}  // namespace attention
