#pragma once

// The one entry that reads any weight file: it decides the format once, from the first bytes
// (and, for a zip archive, from its record names), and hands the source to that format's reader.
// Everything above it (attention/weights.h) sees named tensors only.

#include "serialization/byte_source.h"

#include <attention/safetensors.h>

#include <string>

namespace attention {
namespace serialization {

/// What the reader may read, and which entry of a checkpoint it returns.
struct ReadOptions {
  /// TorchScript archives are read (by LibTorch's importer, which runs their code) only when true.
  bool trusted = true;
  /// The entry of a torch.save checkpoint that holds the state dict; empty for the file itself.
  std::string key;
};

struct WeightFile {
  /// "safetensors", "state_dict" (torch.save) or "torchscript", as LoadReport::format says.
  std::string format;
  /// The file's tensors by name, every name at most kMaxNameLength characters.
  NamedTensors tensors;
};

/// Reads a safetensors file, a torch.save file or (trusted sources only) a TorchScript archive.
/// Throws c10::ValueError for a file that is readable but refused (the pre-1.6 torch.save format,
/// TorchScript from an untrusted source, a malformed safetensors file, a name over the limit),
/// c10::Error naming the source for anything else.
WeightFile read_weight_file(const ByteSource& source, const ReadOptions& options);

}  // namespace serialization
}  // namespace attention
