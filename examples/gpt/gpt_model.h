#pragma once

// The book's GPT (chapter 4) as LibTorch modules on attention-cpp: token and position
// embeddings, transformer blocks of MultiHeadAttention, LayerNorm with `scale` and `shift`, the
// tanh GELU feed-forward, `final_norm` and `out_head`, with the book's parameter names, so that
// `torch.save(model.state_dict(), path)` loads unchanged. Generation runs with one KVCache per
// block; serving many sequences at once (serving.h) runs packed steps over one PagedKVCache.
//
// Config::attention gives the blocks one of the attention mechanisms of the book's chapter 4
// instead, as its bonus sections do (examples/gpt/gpt.py's make_attention): each decodes through
// its own cache or state, held by a BlockCache.

#include <attention/attention.h>

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

/// The attention of every block: the book's MultiHeadAttention or a mechanism of its chapter 4,
/// named as gpt.py's cfg["attention"] names them.
enum class Attention { MultiHead, Gated, Latent, DeltaNet, Sparse, KVSharing };

/// The Attention that `name` ("mha", "gated", "mla", "deltanet", "dsa", "kv_sharing") names.
inline Attention attention_named(const std::string& name) {
  const std::pair<const char*, Attention> names[] = {
      {"mha", Attention::MultiHead}, {"gated", Attention::Gated},
      {"mla", Attention::Latent},    {"deltanet", Attention::DeltaNet},
      {"dsa", Attention::Sparse},    {"kv_sharing", Attention::KVSharing}};
  for (const auto& [known, attention] : names) {
    if (name == known) return attention;
  }
  throw std::invalid_argument("unknown attention '" + name +
                              "' (expected mha, gated, mla, deltanet, dsa or kv_sharing)");
}

struct Config {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  int64_t emb_dim = 0;
  int64_t n_heads = 0;
  int64_t n_layers = 0;
  double drop_rate = 0.0;
  bool qkv_bias = false;
  Attention attention = Attention::MultiHead;
  int64_t latent_dim = 0;             // Latent
  int64_t index_n_heads = 0;          // Sparse
  int64_t index_head_dim = 0;         // Sparse
  int64_t topk = 0;                   // Sparse
  int64_t n_kv_producing_layers = 0;  // KVSharing: the first blocks make keys and values
};

/// What one block keeps between decoding steps: the cache or state of its attention's kind (the
/// others stay empty). A KVSharing block that reads an earlier block's keys keeps nothing.
struct BlockCache {
  explicit BlockCache(int64_t max_length)
      : keys_values(max_length), latent(max_length), sparse(max_length) {}
  attention::KVCache keys_values;          // MultiHead, Gated, KVSharing
  attention::LatentCache latent;           // Latent
  attention::SparseAttentionCache sparse;  // Sparse
  attention::GatedDeltaNetState state;     // DeltaNet
};

/// The book's LayerNorm: parameters `scale` and `shift`, biased variance, eps 1e-5.
struct LayerNormImpl : torch::nn::Module {
  explicit LayerNormImpl(int64_t emb_dim)
      : scale(register_parameter("scale", torch::ones(emb_dim))),
        shift(register_parameter("shift", torch::zeros(emb_dim))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto mean = x.mean(-1, /*keepdim=*/true);
    const auto var = x.var(-1, /*unbiased=*/false, /*keepdim=*/true);
    return scale * (x - mean) / torch::sqrt(var + 1e-5) + shift;
  }
  torch::Tensor scale, shift;
};
TORCH_MODULE(LayerNorm);

/// The book's GELU, the tanh approximation written out as in its Python class.
inline torch::Tensor gelu(const torch::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + torch::tanh(c * (x + 0.044715 * torch::pow(x, 3))));
}

/// `layers`: Linear(emb, 4 emb), GELU, Linear(4 emb, emb), as `layers.0` and `layers.2`.
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(int64_t emb_dim)
      : layers(register_module("layers",
                               torch::nn::Sequential(torch::nn::Linear(emb_dim, 4 * emb_dim),
                                                     torch::nn::Functional(gelu),
                                                     torch::nn::Linear(4 * emb_dim, emb_dim)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x); }
  torch::nn::Sequential layers;
};
TORCH_MODULE(FeedForward);

struct TransformerBlockImpl : torch::nn::Module {
  /// Block `index` of a model of `c`; its attention is registered as `att`, whichever it is, as
  /// the book's blocks name it.
  TransformerBlockImpl(const Config& c, int64_t index)
      : kind(c.attention),
        reads_shared_kv(c.attention == Attention::KVSharing && index >= c.n_kv_producing_layers) {
    const int64_t d = c.emb_dim;
    switch (kind) {
      case Attention::Latent:
        latent_att =
            register_module("att", attention::MultiHeadLatentAttention(
                                       attention::MultiHeadLatentAttentionOptions(d, d, c.n_heads)
                                           .latent_dim(c.latent_dim)
                                           .dropout(c.drop_rate)
                                           .qkv_bias(c.qkv_bias)));
        break;
      case Attention::DeltaNet:
        delta_net = register_module(
            "att", attention::GatedDeltaNet(attention::GatedDeltaNetOptions(d, d, c.n_heads)
                                                .dropout(c.drop_rate)
                                                .qkv_bias(c.qkv_bias)));
        break;
      case Attention::Sparse:
        sparse_att =
            register_module("att", attention::DeepSeekSparseAttention(
                                       attention::DeepSeekSparseAttentionOptions(d, d, c.n_heads)
                                           .index_n_heads(c.index_n_heads)
                                           .index_head_dim(c.index_head_dim)
                                           .topk(c.topk)
                                           .dropout(c.drop_rate)
                                           .qkv_bias(c.qkv_bias)));
        break;
      default:  // MultiHead, Gated, KVSharing: MultiHeadAttention's options cover all three
        att = register_module("att", attention::MultiHeadAttention(
                                         attention::MultiHeadAttentionOptions(d, d, c.n_heads)
                                             .context_length(c.context_length)
                                             .dropout(c.drop_rate)
                                             .qkv_bias(c.qkv_bias)
                                             .gate(kind == Attention::Gated)));
    }
    ff = register_module("ff", FeedForward(d));
    norm1 = register_module("norm1", LayerNorm(d));
    norm2 = register_module("norm2", LayerNorm(d));
    drop_shortcut = register_module("drop_shortcut", torch::nn::Dropout(c.drop_rate));
  }

  /// The book's block; with a cache, x holds the new tokens only. `shared` carries keys and
  /// values from the producing blocks to the reading ones (KVSharing).
  torch::Tensor forward(torch::Tensor x, BlockCache* cache, attention::SharedKV& shared) {
    x = drop_shortcut(attend(norm1(x), cache, shared)) + x;
    return drop_shortcut(ff(norm2(x))) + x;
  }

  /// The same block on a packed step of many sequences, (total_tokens, emb_dim): the attention
  /// writes the step's keys and values into `layer` of the paged cache and reads each sequence's
  /// earlier ones from it.
  torch::Tensor forward_paged(torch::Tensor x, attention::PagedKVCache& cache,
                              const attention::PagedBatch& batch, int64_t layer) {
    if (kind != Attention::MultiHead) {
      throw std::invalid_argument(
          "gpt: serving over a PagedKVCache needs the book's MultiHeadAttention (attention "
          "\"mha\")");
    }
    x = drop_shortcut(att->forward_paged(norm1(x), cache, batch, layer)) + x;
    return drop_shortcut(ff(norm2(x))) + x;
  }

  Attention kind;
  bool reads_shared_kv;
  // The attention, one of four module types (the others stay empty).
  attention::MultiHeadAttention att{nullptr};
  attention::MultiHeadLatentAttention latent_att{nullptr};
  attention::GatedDeltaNet delta_net{nullptr};
  attention::DeepSeekSparseAttention sparse_att{nullptr};
  FeedForward ff{nullptr};
  LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Dropout drop_shortcut{nullptr};

 private:
  torch::Tensor attend(const torch::Tensor& x, BlockCache* cache, attention::SharedKV& shared) {
    switch (kind) {
      case Attention::Latent:
        return latent_att(x, cache ? &cache->latent : nullptr);
      case Attention::DeltaNet:
        return delta_net(x, cache ? &cache->state : nullptr);
      case Attention::Sparse:
        return sparse_att(x, cache ? &cache->sparse : nullptr);
      default:
        break;
    }
    auto options = attention::MultiHeadAttentionForwardOptions();
    if (reads_shared_kv) {
      options.shared_kv(&shared);  // the last producing block's keys and values, cache and all
    } else {
      options.kv_cache(cache ? &cache->keys_values : nullptr);
      if (kind == Attention::KVSharing) options.share_kv(&shared);
    }
    return att(x, options).output;
  }
};
TORCH_MODULE(TransformerBlock);

struct GPTModelImpl : torch::nn::Module {
  explicit GPTModelImpl(const Config& c)
      : tok_emb(register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.emb_dim))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(c.context_length, c.emb_dim))),
        drop_emb(register_module("drop_emb", torch::nn::Dropout(c.drop_rate))),
        trf_blocks(register_module("trf_blocks", torch::nn::ModuleList())),
        final_norm(register_module("final_norm", LayerNorm(c.emb_dim))),
        out_head(register_module(
            "out_head",
            torch::nn::Linear(torch::nn::LinearOptions(c.emb_dim, c.vocab_size).bias(false)))) {
    for (int64_t i = 0; i < c.n_layers; ++i) trf_blocks->push_back(TransformerBlock(c, i));
  }

  /// Logits (B, T, vocab) of tokens `idx` (B, T) at positions start, start + 1, ...; with
  /// `caches` (one per block) the earlier tokens come from the caches.
  torch::Tensor forward(const torch::Tensor& idx, std::vector<BlockCache>* caches = nullptr,
                        int64_t start = 0) {
    const auto positions = torch::arange(start, start + idx.size(1), torch::kLong);
    auto x = drop_emb(tok_emb(idx) + pos_emb(positions));
    attention::SharedKV shared;
    for (size_t i = 0; i < trf_blocks->size(); ++i) {
      x = trf_blocks[i]->as<TransformerBlock>()->forward(x, caches ? &(*caches)[i] : nullptr,
                                                         shared);
    }
    return out_head(final_norm(x));
  }

  /// Logits (S, vocab) after the last new token of each sequence of a packed step: `tokens`
  /// (total_tokens,) holds the new tokens of batch.sequences() one after another, as
  /// PagedKVCache::extend() laid them out; each token's position in its own sequence selects its
  /// position embedding. Block i uses layer i of the cache.
  torch::Tensor forward_packed(const torch::Tensor& tokens, attention::PagedKVCache& cache,
                               const attention::PagedBatch& batch) {
    auto x = drop_emb(tok_emb(tokens) + pos_emb(batch.positions()));
    for (size_t i = 0; i < trf_blocks->size(); ++i) {
      x = trf_blocks[i]->as<TransformerBlock>()->forward_paged(x, cache, batch,
                                                               static_cast<int64_t>(i));
    }
    // Only each sequence's last row predicts a token: the others need no output head.
    const auto last_rows = batch.query_starts().slice(0, 1) - 1;
    return out_head(final_norm(x.index_select(0, last_rows)));
  }

  torch::nn::Embedding tok_emb, pos_emb;
  torch::nn::Dropout drop_emb;
  torch::nn::ModuleList trf_blocks;
  LayerNorm final_norm;
  torch::nn::Linear out_head;
};
TORCH_MODULE(GPTModel);

/// Greedy generation with a KV cache: the prompt once, then one token per step. Returns the
/// tokens (prompt included) and the logits of each step, (B, new_tokens, vocab).
inline std::pair<torch::Tensor, torch::Tensor> generate(GPTModel& model, torch::Tensor tokens,
                                                        int64_t new_tokens,
                                                        int64_t context_length) {
  torch::NoGradGuard no_grad;
  std::vector<BlockCache> caches(model->trf_blocks->size(), BlockCache(context_length));
  std::vector<torch::Tensor> steps;
  auto logits = model(tokens, &caches, 0).select(1, -1);
  for (int64_t i = 0; i < new_tokens; ++i) {
    steps.push_back(logits);
    const auto next = logits.argmax(-1, /*keepdim=*/true);
    tokens = torch::cat({tokens, next}, 1);
    // The last token needs no logits of its own.
    if (i + 1 < new_tokens) logits = model(next, &caches, tokens.size(1) - 1).select(1, -1);
  }
  return {tokens, torch::stack(steps, 1)};
}

}  // namespace gpt
