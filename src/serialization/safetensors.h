#pragma once

// safetensors read by range: the header first, then each tensor straight into its own memory, so
// a file on disk is never held whole in memory (attention/safetensors.h has the format).

#include "serialization/byte_source.h"

#include <attention/safetensors.h>

namespace attention {
namespace serialization {

/// parse_safetensors() on any source.
NamedTensors read_safetensors(const ByteSource& source);

/// True when `head` (the first bytes of a file of `size` bytes, at least 9 of them) starts like
/// safetensors: a plausible header length, then '{'.
bool safetensors_prefix(const std::string& head, uint64_t size);

}  // namespace serialization
}  // namespace attention
