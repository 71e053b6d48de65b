#pragma once

// The zip container of torch.save files: a central directory of stored (uncompressed) records.
// Only what torch.save writes is read: stored records, zip64 sizes and offsets, no encryption, no
// archives split over several disks. Every offset and size is checked against the file before
// it is used, and a record's CRC-32 is checked when it is read.

#include "serialization/byte_source.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attention {
namespace serialization {

class ZipArchive {
 public:
  /// Reads the central directory; throws c10::Error naming the source when it is not a valid
  /// archive of stored records.
  explicit ZipArchive(const ByteSource& source);

  /// The size of the whole archive.
  uint64_t file_size() const { return source_.size(); }
  /// Record names, in the archive's order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return records_.count(name) != 0; }
  /// Size in bytes of a record; throws c10::Error when there is none by that name, or when it is
  /// compressed.
  uint64_t size(const std::string& name) const;
  /// Reads a whole record into `out` (size(name) bytes) and checks its CRC-32.
  void read(const std::string& name, void* out) const;
  std::string read_string(const std::string& name) const;

 private:
  struct Record {
    uint64_t data_offset;
    uint64_t size;
    uint32_t crc32;
    bool stored;  // uncompressed
  };
  const Record& record(const std::string& name) const;

  const ByteSource& source_;
  std::vector<std::string> names_;
  std::map<std::string, Record> records_;
};

}  // namespace serialization
}  // namespace attention
