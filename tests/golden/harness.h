#pragma once

// The golden harness: builds a module the way a golden case describes it, runs forward and
// backward on the case's inputs, and compares with what Python computed.

#include <attention/functional.h>
#include <attention/weights.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace golden {

/// One entry of models/golden/manifest.json.
struct Case {
  std::string name;
  std::string module;
  nlohmann::json args;
  int64_t seed = 0;
  torch::Dtype dtype = torch::kFloat;
  /// Inputs in the order forward takes them; floating ones get gradients, bool ones are masks.
  std::vector<std::string> inputs;
  /// MultiHeadAttention's per-call options: context, key_padding_mask, attn_mask, need_weights,
  /// average_attn_weights.
  nlohmann::json forward;
  /// "train" (forward and backward) or "inference" (no autograd: the output only).
  std::string mode = "train";
  /// The kernel the case is meant to exercise, as functional::last_path() names it after the
  /// forward: "direct", "math", "chunked_fused", "chunked_tiles" or "native".
  std::string path = "math";
  double atol = 0, rtol = 0;
  /// Whether the module seeded with `seed` holds Python's weights ("seeded" in the manifest,
  /// default true): false where Python's class draws them in another order (the zoo's Llama 3.2
  /// attention draws W_key and W_value before W_query) or the case changed them after seeding.
  bool seeded = true;
  std::string weights_path;
  std::string tensors_path;
  std::string state_dict_path;
  std::string safetensors_path;
};

/// The folder of the committed goldens (or the one given with --golden-dir).
std::string& directory();
/// The one case to run (--golden-case), empty for all.
std::string& selected_case();
/// The module whose cases to run (--golden-module), empty for all.
std::string& selected_module();

std::vector<Case> read_manifest(const std::string& dir);

/// A module built from a case's constructor arguments, with a forward over the case's inputs
/// (by name) that returns the output and, when the case asks for them, the attention weights.
struct Module {
  using Inputs = std::map<std::string, torch::Tensor>;
  std::shared_ptr<torch::nn::Module> module;
  std::function<attention::functional::AttentionOutput(const Inputs&)> forward;
};
/// Seeded with the case's seed right before construction, then cast to the case's dtype.
Module make_module(const Case& c);

/// How the case's weight files load into make_module's module: the Llama layout for the zoo's
/// Gemma 4 attention, whose class names its projections q_proj ... o_proj; the defaults
/// otherwise. Its gradients are named as its file's parameters.
attention::LoadOptions load_options(const Case& c);

/// The case's tensors file: input.<arg>, output, grad_output, grad.<name>.
std::map<std::string, torch::Tensor> read_tensors(const Case& c);

struct Comparison {
  double max_abs_diff = 0;
  std::vector<std::string> failures;  // the kit's line for each mismatch; a wrong path
};

/// The name of a path as the manifest writes it.
std::string path_name(attention::functional::Path path);

/// A case's score modification (forward["score_mod"]) by name, as make_golden.py's reference
/// module writes it. "wavy": s (1 + 0.1 head + 0.2 batch) + 0.5 sin(s) cos(0.05 r), r
/// the relative position j - pos(i) of the key; with its derivative. Throws for other names.
attention::ScoreMod score_mod_of(const std::string& name);

/// The relative position of each pair of a score tile (int64, the tile's shape): key j minus the
/// position of query i.
torch::Tensor relative_positions(const torch::Tensor& scores, const attention::ScoreTile& tile);

/// With the parity kit's check_parity() (the case's tensors under the kit's names), runs forward
/// (and, for a training case, backward) of `m` on the case's inputs and compares the
/// output, the attention weights when the case has them, and the gradient of every floating input
/// and every parameter with Python's, within the case's tolerance. A case with forward["decode"]
/// feeds its input in those chunks through a KV cache. Also checks that the forward took the
/// case's path.
Comparison compare(const Case& c, Module& m, const std::map<std::string, torch::Tensor>& golden);

}  // namespace golden
