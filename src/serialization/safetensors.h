#pragma once

// safetensors read by range: the header first, then each tensor straight into its own memory, so
// a file on disk is never held whole in memory (attention/safetensors.h has the format).

#include "serialization/byte_source.h"

#include <attention/safetensors.h>

namespace attention {
namespace serialization {

/// parse_safetensors() on any source.
NamedTensors read_safetensors(const ByteSource& source);

/// looks_like_safetensors() on the first bytes of a source.
bool looks_like_safetensors(const ByteSource& source);

}  // namespace serialization
}  // namespace attention
