#pragma once

/// \file
/// Moving weights between Python and C++ by parameter name.

#include <torch/arg.h>
#include <torch/nn/module.h>

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
};

/// What load_weights() did.
struct LoadReport {
  /// "torchscript" or "state_dict".
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
/// Reads a TorchScript archive (`torch.jit.save(torch.jit.script(m), path)` or a traced module)
/// and a state dict saved as a plain dict (`torch.save(dict(m.state_dict()), path)`), told apart
/// by content. Values are copied into the module's existing tensors, keeping their device.
///
/// Everything is checked before anything is copied: on any error the module is left exactly as
/// it was. One c10::ValueError lists every problem (missing and unexpected names, shape and
/// dtype mismatches, non-finite values); an unreadable file raises c10::Error naming the path.
///
/// A TorchScript archive can carry code: load such files only from sources you trust.
LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options = {});

/// Writes the module's parameters and buffers as a state dict that Python reads with
/// `module.load_state_dict(torch.load(path))`, and load_weights() reads back. Tensors are
/// written from the CPU.
void save_weights(const torch::nn::Module& module, const std::string& path);

}  // namespace attention
