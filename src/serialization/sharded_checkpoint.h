#pragma once

// Checkpoints sharded over several files, as Hugging Face writes them: an index,
// `model.safetensors.index.json` (or `pytorch_model.bin.index.json`), whose "weight_map" names
// the file of each tensor, beside the shards. The shards are read as any weight file; together
// they are one file's tensors.

#include "serialization/weight_file.h"

#include <string>

namespace attention {
namespace serialization {

/// Whether `path` names a sharded checkpoint's index (a name ending in ".index.json").
bool is_shard_index(const std::string& path);

/// The tensors of every shard the index at `path` lists, each shard read with `options`.
/// Throws c10::ValueError naming the index for an index that is not JSON or has no "weight_map"
/// of names to file names, a shard name that is not a plain file name beside the index (no
/// folder, no "..": an index cannot send the reader elsewhere), a tensor of a shard that the
/// index does not give that shard, a tensor the index names that its shard lacks, or shards of
/// different formats; what a shard's reader throws names the shard.
WeightFile read_sharded(const std::string& path, const ReadOptions& options);

}  // namespace serialization
}  // namespace attention
