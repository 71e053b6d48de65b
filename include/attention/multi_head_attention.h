#pragma once

/// \file
/// The production form of multi-head attention: fused projections, masks, KV cache, GQA.

#include <attention/export.h>
#include <attention/functional.h>
#include <attention/kv_cache.h>
#include <attention/norm.h>
#include <attention/paged_kv_cache.h>
#include <attention/rotary.h>
#include <attention/sliding_kv_cache.h>
#include <attention/weights.h>
#include <attention/workspace.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace attention {

namespace detail {
class AttentionCaches;
class RotaryCache;
}  // namespace detail

/// Options of MultiHeadAttention.
struct MultiHeadAttentionOptions {
  /// The three sizes; num_kv_heads starts at num_heads and d_in_kv at d_in.
  MultiHeadAttentionOptions(int64_t d_in, int64_t d_out, int64_t num_heads)
      : d_in_(d_in),
        d_out_(d_out),
        num_heads_(num_heads),
        num_kv_heads_(num_heads),
        d_in_kv_(d_in) {}
  /// Feature size of the input x.
  TORCH_ARG(int64_t, d_in);
  /// Feature size of the output; a multiple of num_heads (head_dim = d_out / num_heads) unless
  /// head_dim is given.
  TORCH_ARG(int64_t, d_out);
  /// Number of query heads.
  TORCH_ARG(int64_t, num_heads);
  /// Longest sequence of keys accepted (cache included); 0 accepts any length.
  TORCH_ARG(int64_t, context_length) = 0;
  /// Dropout on the attention weights, in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
  /// Bias in the query, key and value projections.
  TORCH_ARG(bool, qkv_bias) = false;
  /// Bias in out_proj: the book's has one (default true); Llama's `o_proj` has none.
  TORCH_ARG(bool, out_bias) = true;
  /// An output projection `out_proj` (default true). Without it the heads' outputs are only
  /// concatenated, as by the book's CausalAttention (one head) and its MultiHeadAttentionWrapper
  /// of CausalAttention heads (see WeightLayout::BookMultiHeadAttentionWrapper).
  TORCH_ARG(bool, output_projection) = true;
  /// Key/value heads: num_heads (default) is multi-head attention, fewer is grouped-query
  /// attention, 1 is multi-query attention. Must divide num_heads.
  TORCH_ARG(int64_t, num_kv_heads);
  /// Hide later keys from each query, as the book's class does (default true).
  TORCH_ARG(bool, causal) = true;
  /// Feature size of `context` for cross-attention (default d_in).
  TORCH_ARG(int64_t, d_in_kv);
  /// Where the causal diagonal, the window and ALiBi's distances sit when there are fewer queries
  /// than keys (see functional::CausalAlignment; default BottomRight, right for a KV cache).
  TORCH_ARG(functional::CausalAlignment,
            causal_alignment) = functional::CausalAlignment::BottomRight;
  /// Sliding-window attention as Mistral's and Gemma's `sliding_window`: each query sees at most
  /// the W keys that end at its own position (without causal, also W - 1 keys after it). Unset:
  /// no window; must be >= 1.
  TORCH_ARG(c10::optional<int64_t>, sliding_window) = c10::nullopt;
  /// Attention-logit soft-capping as Gemma 2's `attn_logit_softcapping`: scaled scores s become
  /// softcap * tanh(s / softcap). Unset: none; must be finite and > 0.
  TORCH_ARG(c10::optional<double>, softcap) = c10::nullopt;
  /// Rotary position embeddings on the queries and keys of every head (Llama, Qwen, Gemma,
  /// GPT-NeoX, GPT-J: see functional::RotaryOptions); positions continue after a KV cache's
  /// length, so decoding token by token equals one forward. Not with `context`. Unset: none.
  TORCH_ARG(c10::optional<functional::RotaryOptions>, rope) = c10::nullopt;
  /// Attention sinks as gpt-oss: a learned logit per query head, the parameter `sinks`
  /// (num_heads,), in every query's softmax normalizer (see functional::
  /// ScaledDotProductAttentionOptions::sinks). Initialized N(0, 0.02^2) after out_proj.
  TORCH_ARG(bool, sinks) = false;
  /// A learned relative position bias through these buckets (T5's): the parameter
  /// `relative_attention_bias` (num_buckets, num_heads), the layout of T5's
  /// `relative_attention_bias.weight`, added to the scaled scores of each head (see
  /// ScaledDotProductAttentionOptions::relative_bias). Initialized N(0, 0.02^2) after out_proj
  /// and the sinks. Unset: none.
  TORCH_ARG(c10::optional<functional::RelativeBuckets>, relative_bias) = c10::nullopt;
  /// ALiBi with the standard slopes of num_heads heads (functional::alibi_slopes), as BLOOM and
  /// MPT; such models have no position embeddings of their own.
  TORCH_ARG(bool, alibi) = false;
  /// Gated attention (Qwen3-Next; the book's chapter 4, `GatedMultiHeadAttention`): a projection
  /// `W_gate` (d_in -> d_out, bias as qkv_bias), created after W_query as the book's is, and the
  /// heads' joined outputs multiplied by sigmoid(W_gate x) before out_proj.
  TORCH_ARG(bool, gate) = false;
  /// With `gate`: the gate's rows in W_query, each head's queries followed by its gate (W_query:
  /// d_in -> 2 x num_heads x head_dim, as Qwen3.5's `q_proj`), and no W_gate.
  TORCH_ARG(bool, gate_in_query) = false;
  /// Features of each head's queries, keys and values; 0 (default) is d_out / num_heads, the
  /// book's. Given, the heads are num_heads x head_dim wide whatever d_out is, and out_proj maps
  /// them back to d_out (Qwen3-0.6B: d_in = d_out = 1024, 16 heads of 128; Gemma 3 270M: 640,
  /// 4 heads of 256). Without out_proj, d_out must be num_heads x head_dim.
  TORCH_ARG(int64_t, head_dim) = 0;
  /// QK-norm: the queries and the keys normalized before the rotary step, by `q_norm` and
  /// `k_norm` (Norm modules of the kind, scope, eps and parameter name given: Qwen3's RMSNorm per
  /// head, `q_norm.scale`; Gemma 3's zero-centred one; OLMo 3's over the whole projection,
  /// `q_norm.weight` of num_heads x head_dim). The cached keys are the normalized and rotated
  /// ones. Unset: none.
  TORCH_ARG(c10::optional<HeadNormOptions>, qk_norm) = c10::nullopt;
  /// The values normalized by `v_norm` before attention (Gemma 4: RMS per head, no weight).
  /// Unset: none.
  TORCH_ARG(c10::optional<HeadNormOptions>, value_norm) = c10::nullopt;
  /// The softmax scale, applied to the scores q . k: finite. Unset: 1 / sqrt(head_dim). Gemma's
  /// `query_pre_attn_scalar` s is scale(1 / sqrt(s)); Gemma 4 scales by 1.
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
};

/// Keys and values that one MultiHeadAttention layer hands to later layers: cross-layer KV
/// sharing (Brandon et al. 2024; Gemma 3n), as the book's chapter 4 writes it (`10_kv-sharing`). A
/// producing layer's forward with `share_kv(&shared)` leaves here the keys and values it attended
/// to, (B, num_kv_heads, Tk, head_dim), rotary embeddings applied: with a KVCache, views of the
/// cache (every cached token; no copy); without one, this call's own (carrying their gradient in
/// training). Later layers' forwards with `shared_kv(&shared)` attend to them with their own
/// queries and project no keys or values; they keep no cache of their own.
///
/// Example:
/// \code
/// attention::MultiHeadAttention producer(attention::MultiHeadAttentionOptions(64, 64, 4));
/// attention::MultiHeadAttention reader(attention::MultiHeadAttentionOptions(64, 64, 4));
/// attention::KVCache cache(/*max_length=*/32);
/// attention::SharedKV shared;
/// torch::Tensor x = torch::randn({1, 8, 64});
/// x = x + producer(x, attention::MultiHeadAttentionForwardOptions().kv_cache(&cache).share_kv(
///                         &shared)).output;
/// x = x + reader(x, attention::MultiHeadAttentionForwardOptions().shared_kv(&shared)).output;
/// \endcode
struct SharedKV {
  /// The producing layer's keys, (B, num_kv_heads, Tk, head_dim); undefined until it runs.
  torch::Tensor keys;
  /// Its values, of the same shape.
  torch::Tensor values;
  /// Set by a producing layer's forward: the rotary embedding its keys carry (unset: none). A
  /// reading layer must rotate its queries alike; keys given by hand (`produced` false) are
  /// taken as they are.
  c10::optional<functional::RotaryOptions> rope = c10::nullopt;
  /// Whether a producing layer's forward filled it (rather than the caller by hand).
  bool produced = false;
};

/// Per-call options of MultiHeadAttention::forward.
struct MultiHeadAttentionForwardOptions {
  /// A cache to append to (TORCH_ARG pastes its type textually, and `const KVCache*&` would
  /// point to a const cache).
  using KVCachePointer = KVCache*;
  /// A window-bounded cache to append to (see SlidingKVCache).
  using SlidingKVCachePointer = SlidingKVCache*;
  /// Where a producing layer leaves its keys and values (see SharedKV).
  using SharedKVPointer = SharedKV*;
  /// The keys and values a reading layer attends to.
  using ConstSharedKVPointer = const SharedKV*;

  /// Keys and values from this sequence (B, Tk, d_in_kv) instead of x: cross-attention.
  TORCH_ARG(torch::Tensor, context) = {};
  /// Bool (true = masked out) or additive float mask, broadcastable to (B, H, Tq, Tk).
  TORCH_ARG(torch::Tensor, attn_mask) = {};
  /// Bool (B, Tk), true = padding: those keys are hidden from every query.
  TORCH_ARG(torch::Tensor, key_padding_mask) = {};
  /// Which keys each query sees, per block (BlockMask): made for this call's Tq queries and its
  /// Tk keys (after the cache's, with kv_cache), batch 1 or B, heads 1 or num_heads. Not with
  /// sliding_kv_cache, whose keys' positions move with the window. See
  /// ScaledDotProductAttentionOptions::block_mask.
  TORCH_ARG(c10::optional<BlockMask>, block_mask) = c10::nullopt;
  /// A score modification (ScoreMod) of the scaled scores; its tiles index this call's queries and
  /// its keys (after the cache's, with kv_cache). Needs a derivative when the module trains. Not
  /// with sliding_kv_cache. See ScaledDotProductAttentionOptions::score_mod.
  TORCH_ARG(c10::optional<ScoreMod>, score_mod) = c10::nullopt;
  /// Append this call's keys and values to the cache and attend to everything cached. Not owned.
  /// Either cache needs causal_alignment BottomRight when the alignment matters (causal, a
  /// sliding window or ALiBi); a forward that is refused leaves the cache as it was.
  TORCH_ARG(KVCachePointer, kv_cache) = nullptr;
  /// Or append to a cache that keeps only what a sliding window needs (and sink tokens). With
  /// `sliding_window(W)`, its window must be at least W and it must keep no sink tokens. Not owned.
  TORCH_ARG(SlidingKVCachePointer, sliding_kv_cache) = nullptr;
  /// Leave the keys and values this call attends to in a SharedKV for later layers (after the
  /// kv_cache's append: all of the cache's). Not with sliding_kv_cache or shared_kv. Not owned.
  TORCH_ARG(SharedKVPointer, share_kv) = nullptr;
  /// Attend to the keys and values an earlier layer shared instead of projecting this call's own:
  /// this call's tokens are the last of them (they need at least as many keys as x has tokens,
  /// and rotary embeddings take the positions that follow). Not with a cache, a context or
  /// share_kv. Not owned.
  TORCH_ARG(ConstSharedKVPointer, shared_kv) = nullptr;
  /// Return the attention weights as well.
  TORCH_ARG(bool, need_weights) = false;
  /// With need_weights: average the weights over heads, (B, Tq, Tk), instead of (B, H, Tq, Tk).
  TORCH_ARG(bool, average_attn_weights) = true;
  /// The attention kernel (see functional::Backend).
  TORCH_ARG(functional::Backend, backend) = functional::Backend::Auto;
};

/// Per-step options of MultiHeadAttention::forward_paged.
struct PagedForwardOptions {
  /// The cache's layer that the step's keys and values go into.
  TORCH_ARG(int64_t, layer) = 0;
  /// The kernel (see functional::paged_attention).
  TORCH_ARG(functional::Backend, backend) = functional::Backend::Auto;
  /// Which keys each sequence's new tokens see (BlockMask): batch row s is the batch's s-th
  /// sequence, query i its i-th new token, key j its j-th key (this step's included). Batch 1 or
  /// the batch's sequences, heads 1 or num_heads, made for at least the step's most new tokens of
  /// a sequence and its longest sequence: a tree of draft tokens over each cached prefix. See
  /// functional::paged_attention.
  TORCH_ARG(c10::optional<BlockMask>, block_mask) = c10::nullopt;
  /// A score modification (ScoreMod); its tiles' batch is the sequence's place in the batch.
  TORCH_ARG(c10::optional<ScoreMod>, score_mod) = c10::nullopt;
};

/// Multi-head attention as in Raschka's book (chapter 3): one projection for all heads,
/// heads split with view/transpose, scaled dot-product attention, an output projection.
///
/// Submodules `W_query` (d_in -> d_out), `W_key` and `W_value` (d_in_kv -> num_kv_heads *
/// head_dim) and `out_proj` (d_out -> d_out, with bias; none with `output_projection(false)`),
/// created in that order with LibTorch's
/// Linear initialization: the same seed gives the same weights as the book's Python class, and
/// weights saved from that class load by name. The book's class also stores its causal mask as a
/// buffer `mask`; this module computes the mask instead, and load_weights() accepts and skips a
/// `mask` in a file.
///
/// Input (B, T, d_in) or (T, d_in); output of the same rank with d_out features.
///
/// Thread safety: forward() and forward_paged() may run on several threads at once, each with its
/// own caches; the workspace and the rotary tables they share each take a mutex. eval(), train(),
/// to(), reset() and load_weights() need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// attention::MultiHeadAttention mha(
///     attention::MultiHeadAttentionOptions(/*d_in=*/768, /*d_out=*/768, /*num_heads=*/12)
///         .num_kv_heads(4));  // grouped-query attention
/// torch::Tensor x = torch::randn({2, 16, 768});
/// torch::Tensor y = mha(x).output;  // (2, 16, 768), causal
///
/// // Token-by-token decoding with a cache equals the one forward above:
/// attention::KVCache cache(/*max_length=*/16);
/// for (int64_t t = 0; t < 16; ++t) {
///   auto step = mha(x.slice(1, t, t + 1),
///                   attention::MultiHeadAttentionForwardOptions().kv_cache(&cache));
/// }
/// \endcode
class ATTENTION_API MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl>,
                                             public DerivedBuffers {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  MultiHeadAttentionImpl(int64_t d_in, int64_t d_out, int64_t num_heads)
      : MultiHeadAttentionImpl(MultiHeadAttentionOptions(d_in, d_out, num_heads)) {}
  /// Builds the module from options.
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Throws c10::ValueError for wrong shapes (naming the argument, what was expected and what
  /// was given), c10::TypeError for wrong dtypes, c10::Error for another device.
  functional::AttentionOutput forward(const torch::Tensor& x,
                                      const MultiHeadAttentionForwardOptions& options = {});

  /// Serving: one step of many sequences against a PagedKVCache. `x` (total_tokens, d_in) holds
  /// the step's new tokens of every sequence of `batch`, packed as PagedKVCache::extend() made it
  /// (a prompt's chunk for some, one token for others); their keys and values go into layer
  /// `layer` of the cache, and each sequence's queries attend to its own keys through the pages
  /// (functional::paged_attention), rotary embeddings at each token's position in its sequence.
  /// Returns (total_tokens, d_out): for each sequence what forward() gives for its tokens with a
  /// KVCache. Self-attention, inference only (call it under torch::NoGradGuard); the cache's
  /// num_kv_heads, head_dim and dtype must be the module's, and a cache with a sliding window needs
  /// a module window no wider. Throws c10::ValueError for a batch the cache no longer holds, x of
  /// another shape, or a cache that does not fit the module, before anything is written.
  ///
  /// Thread safety: it writes only layer `layer` of the cache and reads its metadata, so calls on
  /// different layers of one batch may run at once; a call must not overlap extend(), add,
  /// fork, free or truncate of the cache, nor another call on the same layer (docs/THREADS.md).
  ///
  /// Example:
  /// \code
  /// torch::NoGradGuard no_grad;
  /// attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(64, 64, 4));
  /// attention::PagedKVCache cache(attention::PagedKVCacheOptions(
  ///     /*num_pages=*/32, /*page_size=*/16, /*num_kv_heads=*/4, /*head_dim=*/16));
  /// int64_t a = cache.add_sequence(), b = cache.add_sequence();
  /// auto step = cache.extend({a, b}, {7, 3});  // two prompts of 7 and 3 tokens
  /// torch::Tensor y = mha->forward_paged(torch::randn({10, 64}), cache, step);  // (10, 64)
  /// step = cache.extend({a, b}, {1, 1});  // then one token each
  /// y = mha->forward_paged(torch::randn({2, 64}), cache, step);
  /// \endcode
  torch::Tensor forward_paged(const torch::Tensor& x, PagedKVCache& cache, const PagedBatch& batch,
                              int64_t layer = 0,
                              functional::Backend backend = functional::Backend::Auto);

  /// The same with a block mask and a score modification per sequence (PagedForwardOptions),
  /// checked before anything is written.
  ///
  /// Example:
  /// \code
  /// torch::NoGradGuard no_grad;
  /// attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(64, 64, 4));
  /// attention::PagedKVCache cache(attention::PagedKVCacheOptions(32, 16, 4, 16));
  /// int64_t a = cache.add_sequence();
  /// mha->forward_paged(torch::randn({20, 64}), cache, cache.extend({a}, {20}));  // a prompt
  /// // Four draft tokens on two branches of a tree: each sees the prompt and its own branch.
  /// const auto tree = attention::BlockMask::from_function(
  ///     [](int64_t, int64_t, int64_t i, int64_t j) {
  ///       return j < 20 || (j - 20 <= i && (i - (j - 20)) % 2 == 0);
  ///     },
  ///     1, 1, 4, 24);
  /// torch::Tensor y = mha->forward_paged(torch::randn({4, 64}), cache, cache.extend({a}, {4}),
  ///                                      attention::PagedForwardOptions().block_mask(tree));
  /// \endcode
  torch::Tensor forward_paged(const torch::Tensor& x, PagedKVCache& cache, const PagedBatch& batch,
                              const PagedForwardOptions& step);

  /// `mask`: the book's causal-mask buffer, which this module derives.
  std::vector<std::string> derived_buffer_names() const override { return {"mask"}; }

  /// Size of each head's queries, keys and values: options.head_dim(), or d_out / num_heads.
  int64_t head_dim() const {
    return options.head_dim() > 0 ? options.head_dim() : options.d_out() / options.num_heads();
  }

  /// The buffers the forward reuses between calls for its query, key and value projections when
  /// no gradient is recorded (inference): at most (B * T * d_out + 2 * B * Tk * num_kv_heads *
  /// head_dim) elements of the largest call so far. A projection still in use elsewhere is never
  /// overwritten (see Workspace). release_workspace() gives the memory back; a clone starts with
  /// an empty workspace. Thread safety: forwards on several threads share it under its mutex; a
  /// slot still in use by one of them is not reused but replaced by a new buffer.
  const Workspace& workspace() const { return workspace_; }
  /// Drops the workspace's buffers (see workspace()). Thread safety: safe while other threads
  /// run forward(); buffers they use are freed when their tensors go.
  void release_workspace() { workspace_.release(); }

  /// The options the module was built with.
  MultiHeadAttentionOptions options;
  /// Query projection, d_in -> num_heads * head_dim (twice that with gate_in_query).
  torch::nn::Linear W_query{nullptr};
  /// Output gate projection, d_in -> num_heads * head_dim (with `gate(true)` and not
  /// gate_in_query; empty otherwise).
  torch::nn::Linear W_gate{nullptr};
  /// Key projection, d_in_kv -> num_kv_heads * head_dim.
  torch::nn::Linear W_key{nullptr};
  /// Value projection, d_in_kv -> num_kv_heads * head_dim.
  torch::nn::Linear W_value{nullptr};
  /// Output projection, num_heads * head_dim -> d_out (empty with `output_projection(false)`).
  torch::nn::Linear out_proj{nullptr};
  /// The queries' norm (with `qk_norm`; empty otherwise).
  Norm q_norm{nullptr};
  /// The keys' norm (with `qk_norm`; empty otherwise).
  Norm k_norm{nullptr};
  /// The values' norm (with `value_norm`; empty otherwise).
  Norm v_norm{nullptr};
  /// The attention sinks' logits (num_heads,), with `sinks(true)`; undefined otherwise.
  torch::Tensor sinks;
  /// The relative position bias table (num_buckets, num_heads), with `relative_bias`; undefined
  /// otherwise.
  torch::Tensor relative_attention_bias;

 protected:
  // So that AnyModule (and what holds one) can call forward(x) alone.
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(MultiHeadAttentionForwardOptions())})

 private:
  /// A forward call as its checks found it (multi_head_attention.cpp).
  struct Call;
  /// A call's queries, keys and values split into heads, (B, H or Hkv, T, head_dim), and its
  /// gate (B, T, num_heads * head_dim) with `gate`.
  struct Heads;

  /// Every check of a forward, before anything is computed or appended.
  Call check_forward(const torch::Tensor& x,
                     const MultiHeadAttentionForwardOptions& forward_options,
                     const detail::AttentionCaches& caches) const;
  /// The checks of a forward that reads `shared` keys and values, for x of `batch` rows of
  /// `tokens` tokens.
  void check_shared_kv(const SharedKV& shared,
                       const MultiHeadAttentionForwardOptions& forward_options, int64_t batch,
                       int64_t tokens) const;
  /// The projections of the tokens `x` (B, T, d_in) and of the keys' and values' `source`,
  /// normalized (over each projection or per head, as qk_norm and value_norm say) and split into
  /// heads; only the queries (and the gate) when `own_keys` is false.
  Heads project_heads(const torch::Tensor& x, const torch::Tensor& source, bool own_keys);
  /// The queries, and the keys with `keys_too`, rotated by cos and sin (T, rotary_dim / 2).
  void rotate_heads(Heads& heads, const torch::Tensor& cos, const torch::Tensor& sin,
                    bool keys_too) const;
  /// The heads' joined outputs `context` (..., num_heads * head_dim), times sigmoid(gate) with
  /// `gate(true)`, through out_proj when there is one.
  torch::Tensor output_of(const torch::Tensor& context, const torch::Tensor& gate);
  /// `attention` with this module's variants: alignment, window, soft-capping, ALiBi, scale.
  functional::ScaledDotProductAttentionOptions variants(
      functional::ScaledDotProductAttentionOptions attention) const;
  /// Whether a forward with an 8-bit KVCache reads its codes in place (attend_codes): in
  /// inference, without dense masks, weights, block masks or score_mods.
  bool reads_codes_in_place(const torch::Tensor& x,
                            const MultiHeadAttentionForwardOptions& forward_options) const;
  /// The queries (B, H, Tq, hd) against an 8-bit cache's codes, through the paged kernel (each
  /// batch row a sequence of one page): (B, H, Tq, hd).
  torch::Tensor attend_codes(const torch::Tensor& queries, const KVCache& cache,
                             functional::Backend backend) const;

  Workspace workspace_;
  /// ALiBi's standard slopes for num_heads, made by reset() (with `alibi(true)`).
  torch::Tensor alibi_slopes_;
  /// The rotary embedding's cos and sin tables, grown under their own mutex by forwards on any
  /// thread. reset() makes new ones, and so does a clone (Cloneable::clone() calls reset()).
  std::shared_ptr<detail::RotaryCache> rotary_;
};

TORCH_MODULE(MultiHeadAttention);

}  // namespace attention
