#pragma once

// The book's GPT (chapter 4) as LibTorch modules on attention-cpp: token and position
// embeddings, transformer blocks of MultiHeadAttention, LayerNorm with `scale` and `shift`, the
// tanh GELU feed-forward, `final_norm` and `out_head`, with the book's parameter names, so that
// `torch.save(model.state_dict(), path)` loads unchanged. Generation runs with one KVCache per
// block; serving many sequences at once (serving.h) runs packed steps over one PagedKVCache.

#include <attention/attention.h>

#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace gpt {

struct Config {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  int64_t emb_dim = 0;
  int64_t n_heads = 0;
  int64_t n_layers = 0;
  double drop_rate = 0.0;
  bool qkv_bias = false;
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
  explicit TransformerBlockImpl(const Config& c)
      : att(register_module(
            "att", attention::MultiHeadAttention(
                       attention::MultiHeadAttentionOptions(c.emb_dim, c.emb_dim, c.n_heads)
                           .context_length(c.context_length)
                           .dropout(c.drop_rate)
                           .qkv_bias(c.qkv_bias)))),
        ff(register_module("ff", FeedForward(c.emb_dim))),
        norm1(register_module("norm1", LayerNorm(c.emb_dim))),
        norm2(register_module("norm2", LayerNorm(c.emb_dim))),
        drop_shortcut(register_module("drop_shortcut", torch::nn::Dropout(c.drop_rate))) {}

  /// The book's block; with a cache, x holds the new tokens only.
  torch::Tensor forward(torch::Tensor x, attention::KVCache* cache = nullptr) {
    auto options = attention::MultiHeadAttentionForwardOptions().kv_cache(cache);
    x = drop_shortcut(att(norm1(x), options).output) + x;
    return drop_shortcut(ff(norm2(x))) + x;
  }

  /// The same block on a packed step of many sequences, (total_tokens, emb_dim): the attention
  /// writes the step's keys and values into `layer` of the paged cache and reads each sequence's
  /// earlier ones from it.
  torch::Tensor forward_paged(torch::Tensor x, attention::PagedKVCache& cache,
                              const attention::PagedBatch& batch, int64_t layer) {
    x = drop_shortcut(att->forward_paged(norm1(x), cache, batch, layer)) + x;
    return drop_shortcut(ff(norm2(x))) + x;
  }

  attention::MultiHeadAttention att;
  FeedForward ff;
  LayerNorm norm1, norm2;
  torch::nn::Dropout drop_shortcut;
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
    for (int64_t i = 0; i < c.n_layers; ++i) trf_blocks->push_back(TransformerBlock(c));
  }

  /// Logits (B, T, vocab) of tokens `idx` (B, T) at positions start, start + 1, ...; with
  /// `caches` (one per block) the earlier tokens come from the caches.
  torch::Tensor forward(const torch::Tensor& idx, std::vector<attention::KVCache>* caches = nullptr,
                        int64_t start = 0) {
    const auto positions = torch::arange(start, start + idx.size(1), torch::kLong);
    auto x = drop_emb(tok_emb(idx) + pos_emb(positions));
    for (size_t i = 0; i < trf_blocks->size(); ++i) {
      x = trf_blocks[i]->as<TransformerBlock>()->forward(x, caches ? &(*caches)[i] : nullptr);
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
  std::vector<attention::KVCache> caches(model->trf_blocks->size(),
                                         attention::KVCache(context_length));
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
