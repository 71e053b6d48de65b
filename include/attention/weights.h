#pragma once

/// \file
/// Moving weights between Python and C++ by parameter name.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace attention {

/// Implemented by modules that compute some of their Python twin's buffers themselves (the book's
/// causal `mask`, say). load_weights() skips those names in a file and lists them in
/// LoadReport::derived.
class ATTENTION_API DerivedBuffers {
 public:
  virtual ~DerivedBuffers() = default;
  /// Names relative to the module.
  virtual std::vector<std::string> derived_buffer_names() const = 0;
};

/// Layouts of other codebases that load_weights() converts to this library's names. Each maps
/// the names of one attention module (after LoadOptions::prefix and LoadOptions::rename); the
/// module's own path in front of them (`blocks.0.attn.`) is kept, and every other name passes
/// through unchanged.
enum class WeightLayout {
  /// This library's names, which are the article's and the book's (`W_query`, `out_proj`, ...).
  Native,
  /// `torch.nn.MultiheadAttention`: `in_proj_weight` (3 E, E) and `in_proj_bias` (3 E) are split
  /// into `W_query`, `W_key` and `W_value`; `q_proj_weight`, `k_proj_weight` and `v_proj_weight`
  /// (when kdim or vdim differ from E) become their weights; `out_proj` keeps its name. For
  /// MultiHeadAttentionOptions(E, E, num_heads).qkv_bias(bias).
  TorchMultiheadAttention,
  /// Hugging Face Llama-style attention: `q_proj`, `k_proj`, `v_proj` and `o_proj` become
  /// `W_query`, `W_key`, `W_value` and `out_proj` (grouped-query shapes included: set
  /// MultiHeadAttentionOptions::num_kv_heads).
  Llama,
  /// GPT-2's attention as Hugging Face stores it: `c_attn.weight` (d_in, 3 d_out), the three
  /// projections fused and transposed as its Conv1D keeps them, `c_attn.bias`, and
  /// `c_proj.weight` (transposed) and `c_proj.bias` for `out_proj`. The causal-mask buffers `bias`
  /// and `masked_bias` next to `c_attn` are skipped and listed in LoadReport::derived.
  GPT2,
  /// The book's MultiHeadAttentionWrapper of CausalAttention heads (chapter 3):
  /// `heads.<i>.W_query.weight` (and bias, W_key, W_value) of the H heads are concatenated, in
  /// head order, into the projections of MultiHeadAttentionOptions(d_in, H * d_out, H)
  /// .output_projection(false); the heads' `mask` buffers are skipped and listed in
  /// LoadReport::derived.
  BookMultiHeadAttentionWrapper,
  /// A whole Hugging Face checkpoint of a model of the book's chapter-5 zoo, under the names of
  /// the book's class for that model as this library builds it (examples/zoo), as the book's
  /// `load_weights_into_<model>` maps them: the prefix (`model.`, `model.language_model.`,
  /// `language_model.` or none) dropped, `embed_tokens` -> `tok_emb`, `layers.N` -> the model's
  /// blocks, `self_attn.{q,k,v,o}_proj` -> `att.{W_query,W_key,W_value,out_proj}`,
  /// `mlp.{gate,up,down}_proj` -> `ff.fc{1,2,3}`, `norm` -> `final_norm`, `lm_head` -> `out_head`
  /// (from `embed_tokens` when the checkpoint has no lm_head: a tied head), each norm's weight
  /// under the book's name. Llama 3.2: blocks `trf_blocks`, `input_layernorm` -> `norm1`,
  /// `post_attention_layernorm` -> `norm2`.
  HuggingFaceLlama,
  /// Qwen3: as HuggingFaceLlama, every norm's weight named `scale` (q_norm and k_norm too).
  HuggingFaceQwen3,
  /// Gemma 3: blocks `blocks`, the four norms keep their names, weights named `scale`; its norms
  /// are zero-centred, and a module whose norms are not (NormKind::ZeroCenteredRMS) is refused.
  HuggingFaceGemma3,
  /// OLMo 3: blocks `blocks`, its post-norms keep their names (`weight`).
  HuggingFaceOlmo3,
  /// Cohere2 (Tiny Aya): blocks `trf_blocks`, `input_layernorm` keeps its name.
  HuggingFaceCohere2,
  /// Qwen3.5: blocks `trf_blocks`, each layer's `self_attn` or `linear_attn` -> `token_mixer`,
  /// the norms as HuggingFaceLlama's; zero-centred norms, as HuggingFaceGemma3's.
  HuggingFaceQwen3_5,
  /// Gemma 4: blocks `blocks`; the feed-forward keeps Hugging Face's names (`mlp.gate_proj`, ...)
  /// as the book's class does, and so do the norms and the per-layer inputs; plain (not
  /// zero-centred) norms.
  HuggingFaceGemma4,
};

/// Options of load_weights(). The file's names go through, in order: LoadOptions::key (which
/// entry of a checkpoint), LoadOptions::prefix, LoadOptions::rename, LoadOptions::layout; the
/// result must be the module's names.
struct ATTENTION_API LoadOptions {
  /// A function from a file's name to the module's name.
  using NameMap = std::function<std::string(const std::string&)>;
  /// A regular expression (ECMAScript) and its replacement (`$1` for a group), applied to every
  /// match in a name.
  using RenameRule = std::pair<std::string, std::string>;

  /// When true (the default) every parameter and buffer of the module must be in the file and
  /// every tensor in the file must belong to the module. When false, missing and unexpected names
  /// are skipped and listed in the LoadReport. Shape and dtype mismatches are errors either way.
  TORCH_ARG(bool, strict) = true;
  /// Accept NaN and Inf values in the file (rejected by default: a trained weight never is).
  TORCH_ARG(bool, allow_non_finite) = false;
  /// When false, TorchScript archives are refused with c10::ValueError before LibTorch parses
  /// them: their reader runs LibTorch's code importer, and a malformed archive can end the
  /// process there (fuzzing found a TorchScript type string that makes LibTorch 1.13's parser
  /// call std::terminate). safetensors and torch.save files are read either way: this library
  /// reads them itself, and its unpickler runs no code (the rules of PyTorch's
  /// `torch.load(..., weights_only=True)`), within a budget of stack, memory and time set by the
  /// file's size (docs/SECURITY.md). Use `trusted(false)` for every file you did not make.
  TORCH_ARG(bool, trusted) = true;
  /// For a checkpoint that holds more than the state dict
  /// (`{"model_state_dict": ..., "optimizer_state_dict": ..., "epoch": 3}`): the entry to load.
  TORCH_ARG(std::string, key) = "";
  /// Load only the names that start with this prefix, with the prefix removed: one block of a
  /// whole model, e.g. `prefix("trf_blocks.3.att.")`. When no name matches, the error lists the
  /// prefixes the file has.
  TORCH_ARG(std::string, prefix) = "";
  /// Convert another codebase's names and fused tensors (see WeightLayout).
  TORCH_ARG(WeightLayout, layout) = WeightLayout::Native;
  /// Convert floating-point tensors of another dtype (bfloat16, float16, float64, ...) to the
  /// module's dtype; LoadReport::casts lists each. Off by default: a dtype mismatch is an error.
  TORCH_ARG(bool, cast) = false;

 public:
  /// Renames the file's names with rules applied in order, e.g.
  /// `rename({{"^attn\\.", ""}, {"\\.qkv\\.", ".in_proj."}})`. Throws c10::ValueError for a
  /// pattern that is not a valid regular expression. No rule sees a name over 1024 characters
  /// (longer names are refused when a file is read, and a name the rules make longer stops the
  /// load): std::regex takes stack in proportion to its subject.
  LoadOptions& rename(const std::vector<RenameRule>& rules);
  /// Renames the file's names with a function.
  LoadOptions& rename(NameMap map);
  /// The renaming in effect (the identity when none was set).
  const NameMap& rename() const noexcept { return rename_; }

 private:
  NameMap rename_;
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
  /// One entry per converted tensor with LoadOptions::cast: "W_query.weight: BFloat16 -> Float".
  std::vector<std::string> casts;
};

/// Copies every parameter and buffer of a weight file into `module`, by name.
///
/// Reads, told apart by content: a state dict saved by Python with
/// `torch.save(model.state_dict(), path)` (or any dict of tensors, or a checkpoint dict with
/// LoadOptions::key), safetensors (see attention/safetensors.h), and a TorchScript archive
/// (`torch.jit.save(torch.jit.script(m), path)` or a traced module). Values are copied into the
/// module's existing tensors, keeping their device. The pre-1.6 torch.save format
/// (`_use_new_zipfile_serialization=False`) is refused with a message saying how to re-save it.
///
/// Everything is checked before anything is copied: on any error the module is left exactly as
/// it was. One c10::ValueError lists every problem (missing and unexpected names, shape and
/// dtype mismatches, non-finite values); an unreadable file raises c10::Error naming the path.
/// A torch.save file on disk is never held whole in memory: each storage is read once into the
/// tensor that holds it until it is copied into the module.
///
/// torch.save files are read by a restricted unpickler that runs no code and refuses every
/// Python global outside PyTorch's `weights_only` allowlist, and safetensors holds nothing but
/// tensors: both are safe for files you did not make, and their readers keep to a budget of
/// stack, memory (at most 32 times the file's size and 64 MiB beyond the tensors) and time (in
/// proportion to the file's size) that docs/SECURITY.md states. A TorchScript archive carries
/// code: load it only from sources you trust (see LoadOptions::trusted).
///
/// `path` may be a checkpoint sharded over several files: its index (a name ending in
/// ".index.json", as Hugging Face's `model.safetensors.index.json`), whose "weight_map" names the
/// shard of each tensor beside it. Every shard is read as a weight file of its own (within its
/// own budget), and together they load as one file; a shard that holds a tensor the index gives
/// another, or lacks one it is given, a shard name with a folder or "..", and an index that is not
/// JSON are refused with c10::ValueError naming the index.
///
/// Thread safety: loads into different modules may run at once. The values are copied into the
/// module's tensors in place, so no other thread may use `module` (a forward included) meanwhile.
///
/// Example:
/// \code
/// // Python: torch.save(model.state_dict(), "gpt.pth"), a GPT whose blocks hold `att`.
/// attention::MultiHeadAttention att(
///     attention::MultiHeadAttentionOptions(768, 768, 12).context_length(1024).qkv_bias(true));
/// attention::load_weights(*att, "gpt.pth", attention::LoadOptions().prefix("trf_blocks.3.att."));
/// \endcode
ATTENTION_API LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                                      const LoadOptions& options = {});

/// load_weights() on a file already in memory (`size` bytes at `data`), e.g. read from an archive
/// or received over a network. `source` names it in error messages. Thread safety: as
/// load_weights().
ATTENTION_API LoadReport load_weights_from_memory(torch::nn::Module& module, const char* data,
                                                  std::size_t size, const LoadOptions& options = {},
                                                  const std::string& source = "<memory>");

/// Writes the module's parameters and buffers, read back by load_weights(): as safetensors when
/// `path` ends in ".safetensors", else as `torch.save(module.state_dict(), path)` writes it, which
/// Python reads with `module.load_state_dict(torch.load(path, weights_only=True))`. Tensors are
/// written from the CPU, contiguous; the file is
/// written beside `path` and renamed over it, so a failed write leaves no truncated file.
///
/// Thread safety: it only reads `module`, so forwards may run meanwhile (not writes to it). Saves
/// may run at once, to one path too (threads or processes): each writes a file of its own beside
/// `path` and renames it over `path`, so `path` holds one save's whole file, the last one's.
ATTENTION_API void save_weights(const torch::nn::Module& module, const std::string& path);

}  // namespace attention
