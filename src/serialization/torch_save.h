#pragma once

// torch.save files: a zip archive whose `data.pkl` pickles the saved object and whose `data/<key>`
// records hold the raw little-endian storages. Read with the restricted unpickler, so no file can
// run code, and each storage is read once, straight into its tensor.

#include "serialization/byte_source.h"
#include "serialization/unpickler.h"
#include "serialization/zip_archive.h"

#include <attention/safetensors.h>

#include <string>

namespace attention {
namespace serialization {

/// True when the archive is TorchScript (`torch.jit.save`), which holds code besides weights.
bool is_torchscript(const ZipArchive& archive);

/// Unpickles a torch.save archive; throws c10::Error naming the source when it is not one or
/// breaks a rule of the restricted unpickler.
Unpickled read_torch_save(const ZipArchive& archive, const std::string& source,
                          const UnpicklerLimits& limits = {});

/// The name -> tensor entries of the saved object: the object itself when it is a dict of
/// tensors (`torch.save(model.state_dict(), path)`, an OrderedDict, or a plain dict), or its entry
/// `key` when `key` is not empty (a checkpoint such as `{"model_state_dict": ..., "epoch": 3}`).
/// Throws c10::ValueError saying what the file holds instead.
NamedTensors state_dict_entries(const Unpickled& saved, const std::string& key,
                                const std::string& source);

/// The bytes of `torch.save(state_dict, path)` for these tensors: an OrderedDict of
/// `_rebuild_tensor_v2` entries over one storage record each, which Python reads with
/// `torch.load(path, weights_only=True)` and load_weights() reads back. Tensors are written
/// contiguous, from the CPU.
std::string write_torch_save(const NamedTensors& tensors);

}  // namespace serialization
}  // namespace attention
