#pragma once

/// \file
/// Moving weights between Python and C++ by parameter name.

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <string>
#include <vector>

namespace attention {

/// Implemented by modules that compute some of their Python twin's buffers themselves (the book's
/// causal `mask`, say). load_weights() skips those names in a file and lists them in
/// LoadReport::derived.
class DerivedBuffers {
 public:
  virtual ~DerivedBuffers() = default;
  /// Names relative to the module.
  virtual std::vector<std::string> derived_buffer_names() const = 0;
};

/// Options of load_weights().
struct LoadOptions {
  /// When true (the default) every parameter and buffer of the module must be in the file and
  /// every tensor in the file must belong to the module. When false, missing and unexpected names
  /// are skipped and listed in the LoadReport. Shape and dtype mismatches are errors either way.
  TORCH_ARG(bool, strict) = true;
  /// Accept NaN and Inf values in the file (rejected by default: a trained weight never is).
  TORCH_ARG(bool, allow_non_finite) = false;
  /// When false, only safetensors is accepted: TorchScript archives and pickled state dicts are
  /// refused with c10::ValueError before LibTorch parses them. Their readers run LibTorch's code
  /// importer and unpickler, and a malformed archive can end the process there (fuzzing found
  /// a TorchScript type string that makes LibTorch 1.13's parser call std::terminate), so use
  /// `trusted(false)` for every file you did not make.
  TORCH_ARG(bool, trusted) = true;
};

/// What load_weights() did.
struct LoadReport {
  /// "safetensors", "torchscript" or "state_dict".
  std::string format;
  /// Names copied into the module, in the module's order.
  std::vector<std::string> loaded;
  /// The module's names that the file lacks (non-strict loading only).
  std::vector<std::string> missing;
  /// The file's names that the module lacks (non-strict loading only).
  std::vector<std::string> unexpected;
  /// The file's names that the module derives itself (see DerivedBuffers), skipped.
  std::vector<std::string> derived;
};

/// Copies every parameter and buffer of a weight file into `module`, by name.
///
/// Reads safetensors (see attention/safetensors.h), a TorchScript archive
/// (`torch.jit.save(torch.jit.script(m), path)` or a traced module) and a state dict saved as a
/// plain dict (`torch.save(dict(m.state_dict()), path)`), told apart by content. Values are
/// copied into the module's existing tensors, keeping their device.
///
/// Everything is checked before anything is copied: on any error the module is left exactly as
/// it was. One c10::ValueError lists every problem (missing and unexpected names, shape and
/// dtype mismatches, non-finite values); an unreadable file raises c10::Error naming the path.
///
/// A TorchScript archive or a pickled state dict can carry code: load those only from sources you
/// trust. safetensors holds nothing but tensors and is strictly validated: use it for files you
/// did not make.
LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options = {});

/// load_weights() on a file already in memory (`size` bytes at `data`), e.g. read from an archive
/// or received over a network. `source` names it in error messages.
LoadReport load_weights_from_memory(torch::nn::Module& module, const char* data, std::size_t size,
                                    const LoadOptions& options = {},
                                    const std::string& source = "<memory>");

/// Writes the module's parameters and buffers, read back by load_weights(): as safetensors when
/// `path` ends in ".safetensors", else as a state dict that Python reads with
/// `module.load_state_dict(torch.load(path))`. Tensors are written from the CPU; the file is
/// written beside `path` and renamed over it, so a failed write leaves no truncated file.
void save_weights(const torch::nn::Module& module, const std::string& path);

}  // namespace attention
