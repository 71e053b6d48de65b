#pragma once

// The book's chapter-5 model zoo as one decoder built from attention-cpp's modules: Llama 3.2,
// Qwen3, Gemma 3, OLMo 3, Tiny Aya, Qwen3.5 and Gemma 4 differ only in the Description that
// describe() reads from the book's config (config.json): each layer's attention options (head
// size, QK-norm, value norm, scale, rotary, window, gate, KV sharing), the norms' kind and
// placement, the feed-forward's activation and names, the embedding and logit scales. Parameter
// names are the book's, so its state_dict loads strictly by name.

#include <attention/attention.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zoo {

namespace F = attention::functional;

/// Where a block's norms sit.
enum class BlockStyle {
  Pre,       // x += att(norm1(x)); x += ff(norm2(x))                    Llama, Qwen3, Qwen3.5
  Sandwich,  // x += post_attention_layernorm(att(input_layernorm(x))), the same around ff
  Post,      // x += post_attention_layernorm(att(x)); x += post_feedforward_layernorm(ff(x))
  Parallel,  // h = input_layernorm(x); x += att(h) + ff(h)                               Tiny Aya
};

/// Qwen3.5's linear-attention layers (Gated DeltaNet, as Hugging Face's Qwen3_5GatedDeltaNet).
struct DeltaNetSizes {
  int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0, conv_kernel = 0;
  double eps = 1e-6;
};

/// One layer: its kind ("full_attention", "sliding_attention", "linear_attention"), the options
/// of its attention (or the sizes of its delta rule), and the earlier layer whose keys and values
/// it reads (Gemma 4's KV sharing), if any.
struct Layer {
  std::string kind;
  std::optional<attention::MultiHeadAttentionOptions> attention;
  std::optional<DeltaNetSizes> delta_net;
  std::optional<int64_t> kv_source;
  bool kv_provider = false;  // some later layer reads this one's keys and values
  int64_t ff_width = 0;
};

/// A family's decoder, read from the book's config.
struct Description {
  std::string family;
  torch::Dtype dtype = torch::kFloat;
  int64_t vocab = 0, width = 0;
  std::vector<Layer> layers;
  BlockStyle style = BlockStyle::Pre;
  attention::NormOptions norm{1};  // the blocks' and the final norm (normalized_shape: width)
  bool gelu = false;               // GeGLU (Gemma) rather than SwiGLU
  bool hf_feed_forward = false;    // gate_proj, up_proj, down_proj (Gemma 4) for fc1, fc2, fc3
  std::string blocks_name = "trf_blocks", mixer_name = "att";
  double embedding_scale = 1.0;   // Gemma: sqrt(width)
  double logit_scale = 1.0;       // Tiny Aya
  std::optional<double> softcap;  // Gemma 4's final logits
  int64_t per_layer_input = 0;    // Gemma 4's per-layer inputs: their size P
  int64_t per_layer_vocab = 0;
};

/// The family's decoder from its book config (config.json, with "family" and "dtype").
Description describe(const nlohmann::json& cfg);

// ---- Modules ------------------------------------------------------------------------------

/// fc3(act(fc1 x) * fc2 x), act SiLU or GELU (tanh); Gemma 4 names them gate_proj, up_proj,
/// down_proj.
class FeedForwardImpl : public torch::nn::Cloneable<FeedForwardImpl> {
 public:
  FeedForwardImpl(int64_t width, int64_t hidden, bool gelu, bool hf_names)
      : width_(width), hidden_(hidden), gelu_(gelu), hf_names_(hf_names) {
    reset();
  }
  void reset() override {
    const auto linear = [](int64_t from, int64_t to) {
      return torch::nn::Linear(torch::nn::LinearOptions(from, to).bias(false));
    };
    gate = register_module(hf_names_ ? "gate_proj" : "fc1", linear(width_, hidden_));
    up = register_module(hf_names_ ? "up_proj" : "fc2", linear(width_, hidden_));
    down = register_module(hf_names_ ? "down_proj" : "fc3", linear(hidden_, width_));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto g = gate(x);
    const auto act = gelu_ ? torch::nn::functional::gelu(
                                 g, torch::nn::functional::GELUFuncOptions().approximate("tanh"))
                           : torch::silu(g);
    return down(act * up(x));
  }
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};

 private:
  int64_t width_, hidden_;
  bool gelu_, hf_names_;
};
TORCH_MODULE(FeedForward);

/// The recurrent state of a Qwen3.5 linear-attention layer for one batch: the last
/// conv_kernel - 1 projections before the convolution, and the delta rule's state.
struct DeltaNetState {
  torch::Tensor conv, rule;
};

/// Qwen3.5's Gated DeltaNet layer: in_proj_qkv through a causal depthwise convolution (conv1d)
/// and SiLU, queries and keys L2-normalized, the gated delta rule (functional::
/// gated_delta_rule, in float32) with beta = sigmoid(in_proj_b x) and log decay
/// -exp(A_log) softplus(in_proj_a x + dt_bias), a gated RMSNorm (norm.weight, times SiLU of
/// in_proj_z x), out_proj. The book's names; its casts.
class DeltaNetImpl : public torch::nn::Cloneable<DeltaNetImpl> {
 public:
  DeltaNetImpl(int64_t width, const DeltaNetSizes& sizes) : width_(width), sizes_(sizes) {
    reset();
  }
  void reset() override;
  /// x (B, T, width); `state` carried from call to call when given.
  torch::Tensor forward(const torch::Tensor& x, DeltaNetState* state);

  torch::nn::Conv1d conv1d{nullptr};
  torch::Tensor dt_bias, A_log, norm_weight;
  torch::nn::Linear out_proj{nullptr}, in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr},
      in_proj_a{nullptr};

 private:
  int64_t width_;
  DeltaNetSizes sizes_;
};
TORCH_MODULE(DeltaNet);

/// What a decoder call attends to beside its tokens: per layer a KVCache, or the step of a
/// PagedKVCache; a delta rule's state; the keys a producing layer shares.
struct Caches {
  std::vector<attention::KVCache> kv;  // one per layer (unused by linear layers)
  std::vector<DeltaNetState> delta;    // one per layer (unused by attention layers)
  // Paged: a cache per head size (Gemma 4's layers have two), the layer's index in it.
  std::map<int64_t, attention::PagedKVCache> pages;
  std::vector<int64_t> page_layer;
  std::map<int64_t, attention::PagedBatch> steps;
  int64_t sequence = 0;
};

/// One decoder layer: the token mixer (`att` or `token_mixer`), the feed-forward (`ff` or `mlp`),
/// the norms of the family's style, and Gemma 4's per-layer input and layer scalar.
class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  BlockImpl(const Description& description, const Layer& layer)
      : description_(description), layer_(layer) {
    reset();
  }
  void reset() override;
  /// x (B, T, width); `per_layer_input` (B, T, P) for Gemma 4; `shared` the KV-sharing slot.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& per_layer_input,
                        Caches* caches, int64_t index, attention::SharedKV* shared);

  attention::MultiHeadAttention att{nullptr};
  DeltaNet delta_net{nullptr};
  FeedForward ff{nullptr};
  std::map<std::string, attention::Norm> norms;
  torch::Tensor layer_scalar;
  torch::nn::Linear per_layer_input_gate{nullptr}, per_layer_projection{nullptr};

 private:
  torch::Tensor mix(const torch::Tensor& h, Caches* caches, int64_t index,
                    attention::SharedKV* shared);
  attention::Norm norm(const std::string& name) { return norms.at(name); }

  Description description_;
  Layer layer_;
};
TORCH_MODULE(Block);

/// The decoder: tok_emb, the blocks, final_norm, out_head, and Gemma 4's per-layer embeddings.
class ModelImpl : public torch::nn::Cloneable<ModelImpl> {
 public:
  explicit ModelImpl(Description description) : description_(std::move(description)) { reset(); }
  void reset() override;
  /// Logits (B, T, vocab) of the tokens `ids` (B, T), after what `caches` hold (none: the whole
  /// sequence).
  torch::Tensor forward(const torch::Tensor& ids, Caches* caches = nullptr);

  /// Caches for one sequence of up to `length` tokens: a KVCache per attention layer, or, with
  /// `paged`, PagedKVCaches of `page_size` tokens a page (sliding layers in one that gives pages
  /// back past their window).
  Caches make_caches(int64_t length, bool paged, int64_t page_size = 4) const;
  /// Before a paged call of `tokens` new tokens: the step of every page cache.
  void extend(Caches& caches, int64_t tokens) const;

  const Description& description() const { return description_; }

  torch::nn::Embedding tok_emb{nullptr}, embed_tokens_per_layer{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  attention::Norm final_norm{nullptr}, per_layer_projection_norm{nullptr};
  torch::nn::Linear out_head{nullptr}, per_layer_model_projection{nullptr};

 private:
  Description description_;
};
TORCH_MODULE(Model);

/// Loads the book's state_dict (model.pth: `torch.save(model.state_dict())`), or a Hugging Face
/// checkpoint (a folder with model.safetensors.index.json and its shards) through the family's
/// layout of names. Strict: every tensor in the file must fit a parameter.
attention::LoadReport load(Model& model, const std::string& path);

}  // namespace zoo
