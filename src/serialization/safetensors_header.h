#pragma once

// The JSON header of a safetensors file, read to the format's fixed grammar as it streams past:
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...,
//    "__metadata__": {"<key>": "<text>", ...}}
// Nothing deeper than an entry's shape is accepted, and no document tree is built, so a header
// takes stack of its nesting limit (three levels) and memory in proportion to its entries.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attention {
namespace serialization {

struct HeaderEntry {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  const char* dtype_name = "";  // as the file names it ("F32")
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};

/// The entries of a header, in file order (the metadata is checked and dropped). Throws
/// c10::ValueError naming the first problem: text that is not a JSON object, nesting beyond three
/// levels, an entry without dtype, shape or data_offsets (or with one twice), an unknown dtype, a
/// dimension that is not a whole number up to 2^40, more than kMaxDimensions dimensions, a tensor
/// too large to address, offsets that are not two whole numbers, a name longer than
/// kMaxNameLength or given twice, a metadata value that is not text.
std::vector<HeaderEntry> parse_safetensors_header(const std::string& text);

/// The safetensors name of a dtype ("F32"); throws c10::ValueError for one it has none for.
const char* safetensors_dtype_name(c10::ScalarType dtype);

}  // namespace serialization
}  // namespace attention
