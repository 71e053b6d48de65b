#pragma once

/// \file
/// The shared math of every attention module: scaled dot-product attention, in one place.

#include <attention/block_mask.h>
#include <attention/causal_alignment.h>
#include <attention/export.h>
#include <attention/relative_bias.h>
#include <attention/score_mod.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

namespace attention {
namespace functional {

/// Which implementation computes the attention.
enum class Backend {
  /// Math when attention weights, dropout or a mask's gradient are requested. Otherwise, on every
  /// LibTorch: in inference on the fused CPU kernels (CPU float, double and bfloat16) Chunked at
  /// every size (ahead of Math from one query and one key up); in training and off those kernels,
  /// Chunked for scores of at least kAutoChunkedScores, Math below (in training Math's backward is
  /// exact where a softmax saturates; the fused backward is accurate to rounding of its terms).
  Auto,
  /// softmax(Q Kᵀ · scale + mask) V on whole score matrices, exactly as the article writes it.
  Math,
  /// Query and key blocks with an online softmax: memory linear in T, blocks above the causal
  /// diagonal skipped, backward by recomputation. No attention weights, no dropout.
  Chunked,
  /// LibTorch's own kernel (at::scaled_dot_product_attention from 2.0, with its fused CPU flash
  /// kernel; the composite math in 1.13). No attention weights.
  Native,
};

/// The kernel that computed a call (see last_path()).
enum class Path {
  /// No call on this thread yet.
  None,
  /// projected_attention's plain loops for tiny CPU inputs.
  Direct,
  /// Whole score matrices (Backend::Math, and every empty problem on any backend).
  Math,
  /// The Chunked backend's fused CPU kernels, forward and backward (float, double and bfloat16
  /// on the CPU; bfloat16 computed in float).
  ChunkedFused,
  /// The Chunked backend's tiles of LibTorch ops (other devices).
  ChunkedTiles,
  /// LibTorch's own kernel.
  Native,
};

/// The kernel that computed the calling thread's most recent scaled_dot_product_attention() or
/// projected_attention() call (or gated_delta_rule(): Math for its recurrence in ops,
/// ChunkedFused for its CPU kernel), for diagnostics and for tests that must know which path ran.
/// Thread safety: a thread_local, so calls on other threads never change what this one reads.
ATTENTION_API Path last_path();

/// In training, and off the fused CPU kernels, Auto picks Chunked when the scores (..., H, Tq, Tk)
/// would hold at least this many elements; in inference on those kernels it picks Chunked at any
/// size.
constexpr int64_t kAutoChunkedScores = int64_t{1} << 20;

/// Auto also takes the fused CPU route for a decoding step (one query per head, or at most 16
/// query rows per key/value head: its query heads times Tq; no mask, dropout, weights or gradient)
/// with at least this many keys, however few its scores: the paged kernel reads each key once for
/// all of those rows and splits the keys across threads.
constexpr int64_t kAutoDecodeKeys = 256;

/// Options of scaled_dot_product_attention().
///
/// Mask convention, the same everywhere in this library: in a **bool** mask `true` means
/// "masked out" (the key is hidden from the query), as in the article's
/// `attn_scores.masked_fill(mask.bool(), -torch.inf)` and in `torch.nn.MultiheadAttention`.
/// A **floating** mask is added to the scaled scores (use `-inf` to hide a key).
struct ScaledDotProductAttentionOptions {
  /// Bool (true = masked out) or additive float mask, broadcastable to (..., H, Tq, Tk).
  TORCH_ARG(torch::Tensor, attn_mask) = {};
  /// Which keys each query sees, per block of queries and keys (BlockMask, made once and shared
  /// by every call it serves): a key is hidden where the block mask hides it, in addition to
  /// attn_mask, causality and the window. Its t_q and t_k must be the call's Tq and Tk, and its
  /// batch and heads must broadcast to the scores' leading dims (..., H). The fused CPU kernels
  /// skip its empty blocks and mask nothing in its full ones; every other route computes from
  /// its dense mask (BlockMask::to_attn_mask()). In varlen_attention and paged_attention: made
  /// for at least the longest sequence's queries and keys, batch 1 or one row per sequence, each
  /// sequence reading the top-left corner of its row. Unset: none.
  TORCH_ARG(c10::optional<BlockMask>, block_mask) = c10::nullopt;
  /// Hides keys after each query. With Tq != Tk the queries are the last Tq positions of the
  /// Tk keys, as when new tokens attend to a KV cache (see causal_alignment).
  TORCH_ARG(bool, is_causal) = false;
  /// The position of query i among the keys: i + Tk - Tq (BottomRight, default) or i (TopLeft).
  /// It places the causal diagonal, the sliding window and ALiBi's distances.
  TORCH_ARG(CausalAlignment, causal_alignment) = CausalAlignment::BottomRight;
  /// Sliding window: the query at position i sees no key j < i - window_left (flash-attn's
  /// `window_size[0]`). A window of W keys ending at the query itself, as the `sliding_window`
  /// of Mistral's and Gemma's configurations, is window_left = W - 1 with is_causal. Unset: no
  /// bound; must be >= 0, and may be up to INT64_MAX (one of max(Tq, Tk) or more hides
  /// nothing).
  TORCH_ARG(c10::optional<int64_t>, window_left) = c10::nullopt;
  /// The query at position i sees no key j > i + window_right (flash-attn's `window_size[1]`);
  /// with is_causal the bound is i whatever this holds. Unset: no bound; must be >= 0, and may be
  /// up to INT64_MAX (one of max(Tq, Tk) or more hides nothing).
  TORCH_ARG(c10::optional<int64_t>, window_right) = c10::nullopt;
  /// ALiBi: one slope m_h per query head (H,), adding -m_h * |pos(i) - j| to the scaled scores of
  /// head h (Press et al.; flash-attn's `alibi_slopes`). See alibi_slopes() for the standard ones.
  /// On the queries' device or the CPU. Constants: no gradient flows to them.
  TORCH_ARG(torch::Tensor, alibi_slopes) = {};
  /// A relative position bias table (num_buckets, H) of the queries' dtype and device (T5's
  /// `relative_attention_bias.weight`): relative_bias[bucket(j - pos(i)), h] is added to the
  /// scaled scores of head h after soft-capping, where relative_buckets gives the bucket.
  /// Differentiable: the fused CPU kernels accumulate its gradient per relative position, never
  /// forming a Tq x Tk tensor; every other route adds the dense bias it expands to. Packed and
  /// paged calls place it by each sequence's own positions. Undefined: none.
  TORCH_ARG(torch::Tensor, relative_bias) = {};
  /// The buckets that relative_bias is indexed by (T5's by default).
  TORCH_ARG(RelativeBuckets, relative_buckets) = RelativeBuckets::t5();
  /// A score modification (ScoreMod): the user's function of a tile of scaled scores and of
  /// where it lies, applied after soft-capping and ALiBi and before relative_bias and the masks,
  /// with its derivative for training (a call that needs gradients is refused without one).
  /// Math and the fused CPU kernels apply it (Math to each query matrix whole, the kernels to
  /// each tile they compute); Native refuses it, and so does Chunked on other devices, where Auto
  /// takes Math. In packed and paged calls a tile's batch is its sequence. Unset: none.
  TORCH_ARG(c10::optional<ScoreMod>, score_mod) = c10::nullopt;
  /// Logit soft-capping, as Gemma 2: the scaled scores s become softcap * tanh(s / softcap)
  /// before ALiBi and the masks are added. Unset: none; must be finite and > 0.
  TORCH_ARG(c10::optional<double>, softcap) = c10::nullopt;
  /// Attention sinks as gpt-oss: one finite logit per query head (H,), of the queries' dtype and
  /// device, that joins each query's softmax normalizer as a key without a value:
  /// out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(sink_h)). Differentiable.
  TORCH_ARG(torch::Tensor, sinks) = {};
  /// Multiplies the scores; when unset they are divided by sqrt(d), as in the article.
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
  /// Dropout probability on the attention weights. Applied whenever > 0: modules pass 0 in
  /// evaluation mode.
  TORCH_ARG(double, dropout_p) = 0.0;
  /// Also return the attention weights, (..., H, Tq, Tk).
  TORCH_ARG(bool, need_weights) = false;
  /// The kernel; Auto picks by size and by what is requested.
  TORCH_ARG(Backend, backend) = Backend::Auto;
  /// Query and key block size of the Chunked backend; must be positive, and is clamped to the
  /// longer sequence and to 2048 (a thread's tile of scores stays within 16 MiB in float).
  TORCH_ARG(int64_t, block_size) = 256;
};

/// ALiBi's standard slopes for `num_heads` heads (float64, (num_heads,)): the geometric sequence
/// 2^(-8/n), 2^(-16/n), ... for n = num_heads a power of two; otherwise those of the largest
/// power of two n below num_heads, followed by every other slope of 2n (as the ALiBi paper's
/// code and Hugging Face's `build_alibi_tensor` compute them). Throws c10::ValueError unless
/// 0 < num_heads <= kMaxAlibiHeads.
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// torch::Tensor q = torch::randn({1, 8, 512, 64}), k = torch::randn({1, 8, 512, 64});
/// auto out = F::scaled_dot_product_attention(
///     q, k, k, F::ScaledDotProductAttentionOptions().is_causal(true).alibi_slopes(
///                  F::alibi_slopes(8).to(torch::kFloat)));
/// \endcode
ATTENTION_API torch::Tensor alibi_slopes(int64_t num_heads);

/// The most heads alibi_slopes() makes slopes for (2^24: 128 MiB of float64; far beyond any
/// model, and short of the sizes where the power-of-two search would overflow).
constexpr int64_t kMaxAlibiHeads = int64_t{1} << 24;

/// What scaled_dot_product_attention() returns.
struct AttentionOutput {
  /// The context vectors, (..., H, Tq, d_v).
  torch::Tensor output;
  /// The attention weights (..., H, Tq, Tk) when requested, else undefined.
  torch::Tensor weights;
};

/// softmax(Q Kᵀ / sqrt(d) + mask) V.
///
/// Shapes: `query` (..., Tq, d), `key` (..., Tk, d), `value` (..., Tk, d_v), all of the same
/// rank (at least 2), dtype and device. With rank >= 3 the dimension -3 holds heads; `key` and
/// `value` may have fewer heads Hkv than the query's H when H is a multiple of Hkv
/// (grouped-query attention: query head h reads key/value head h / (H / Hkv)).
///
/// Every backend follows one contract (docs/CONTRACT.md): a query whose scores are all -inf
/// (every key masked, or no key at all) gets a zero output, zero weights and zero gradients,
/// never NaN; a NaN score or a +inf score makes its query's output NaN; empty inputs give empty
/// or zero outputs. Inputs are validated before any backend runs.
///
/// Throws c10::ValueError for inconsistent shapes and option values, c10::TypeError for
/// mismatched or unsupported dtypes, c10::Error for mismatched devices and for what the chosen
/// backend cannot do (the message names the backend).
///
/// Thread safety: any number of calls may run at once, on the same inputs too: a call reads its
/// arguments, writes only tensors it allocates, and shares nothing but the process's locked
/// caches (docs/THREADS.md). A score_mod is called from several threads at once.
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// torch::Tensor q = torch::randn({2, 12, 1024, 64});  // (B, H, T, d)
/// torch::Tensor k = torch::randn({2, 4, 1024, 64});   // 4 key/value heads (GQA)
/// torch::Tensor v = torch::randn({2, 4, 1024, 64});
/// auto options = F::ScaledDotProductAttentionOptions().is_causal(true);
/// auto out = F::scaled_dot_product_attention(q, k, v, options.backend(F::Backend::Chunked));
/// torch::Tensor context = out.output;  // (2, 12, 1024, 64)
/// \endcode
ATTENTION_API AttentionOutput scaled_dot_product_attention(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const ScaledDotProductAttentionOptions& options = {});

/// The article's modules in one call: softmax((x_q W_query)(x_kv W_key)ᵀ / sqrt(d_kq)) x_kv
/// W_value, with the options of scaled_dot_product_attention (causal, masks, dropout, backend).
///
/// x_q (T, d_in) or (B, T, d_in), x_kv of the same rank and batch; W_query (d_in, d_kq), W_key
/// (d_in_kv, d_kq), W_value (d_in_kv, d_v), all of one dtype and device; every argument is checked
/// before anything is computed (the same errors as scaled_dot_product_attention, plus those of
/// the projections). Tiny CPU inputs that need no gradient (at most 64 tokens and features, no
/// mask, dropout or weights, Backend::Auto) skip LibTorch's per-op dispatch and are computed
/// directly (Path::Direct); the result agrees with the general path to rounding. Thread safety:
/// as scaled_dot_product_attention().
///
/// Example:
/// \code
/// torch::manual_seed(123);
/// torch::Tensor x = torch::rand({6, 3});
/// torch::Tensor W_query = torch::rand({3, 2}), W_key = torch::rand({3, 2});
/// torch::Tensor W_value = torch::rand({3, 4});
/// torch::Tensor context = attention::functional::projected_attention(
///     x, x, W_query, W_key, W_value,
///     attention::functional::ScaledDotProductAttentionOptions().is_causal(true));  // (6, 4)
/// \endcode
ATTENTION_API torch::Tensor projected_attention(
    const torch::Tensor& x_q, const torch::Tensor& x_kv, const torch::Tensor& W_query,
    const torch::Tensor& W_key, const torch::Tensor& W_value,
    const ScaledDotProductAttentionOptions& options = {});

/// Attention over sequences of different lengths packed one after another, without padding
/// (FlashAttention's `flash_attn_varlen_func` layout): `query` (total_q, H, d), `key`
/// (total_k, Hkv, d) and `value` (total_k, Hkv, d_v) hold the tokens of every sequence, the
/// queries of sequence s in rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and its keys and values
/// in rows [cu_seqlens_k[s], cu_seqlens_k[s + 1]). Returns (total_q, H, d_v): each sequence's
/// rows are what scaled_dot_product_attention() gives for that sequence alone, (H, Tq_s, d) against
/// (Hkv, Tk_s, d). The cost is the sum over the sequences of Tq_s x Tk_s, not S x max Tq x max Tk.
///
/// The offsets: 1-D int32 or int64 tensors of S + 1 entries (S >= 0 sequences), on the CPU or on
/// the queries' device (they are read to the host once), each starting at 0, nondecreasing, and
/// ending at total_q and total_k. A sequence may have no queries or no keys (its queries then see
/// nothing: zeros).
///
/// The options hold per sequence: is_causal with its causal_alignment (with Tq_s != Tk_s the
/// queries of a sequence are the last Tq_s of its Tk_s positions, or its first with TopLeft),
/// window_left and window_right, ALiBi's distances, soft-capping, sinks, the scale, grouped-query
/// heads, dropout (Math), the backend and block_size; a relative_bias by each sequence's own
/// positions; a score_mod whose tiles' batch is the sequence; a block_mask with one row per
/// sequence (or one for all), made for at least the longest sequence, whose top-left corner each
/// sequence reads (the visibility of each sequence described once, in its own positions: a tree
/// of draft tokens over each sequence's prefix, documents inside each sequence). attn_mask and
/// need_weights are refused by name (a mask over the packed tokens would be quadratic in the
/// whole batch; call scaled_dot_product_attention per sequence for masks and weights). Auto picks
/// as scaled_dot_product_attention's does (kAutoChunkedScores counted over all sequences): Chunked
/// on the fused CPU kernels, which compute every sequence in one parallel pass, forward and
/// backward.
///
/// Throws c10::ValueError for shapes, offsets and option values, c10::TypeError for dtypes (of the
/// offsets too), c10::Error for devices and for what the chosen backend cannot do; every message
/// names this function, what it expected and what it got. Thread safety: as
/// scaled_dot_product_attention().
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// // Three prompts of 5, 0 and 3 tokens, 4 query heads sharing 2 key/value heads.
/// torch::Tensor q = torch::randn({8, 4, 16}), k = torch::randn({8, 2, 16});
/// torch::Tensor v = torch::randn({8, 2, 16});
/// torch::Tensor cu_seqlens = torch::tensor({0, 5, 5, 8}, torch::kInt);
/// torch::Tensor out = F::varlen_attention(q, k, v, cu_seqlens, cu_seqlens,
///                                         F::ScaledDotProductAttentionOptions().is_causal(true));
/// // out: (8, 4, 16); out.narrow(0, 5, 3) is the causal attention of the last prompt alone.
/// \endcode
ATTENTION_API torch::Tensor varlen_attention(const torch::Tensor& query, const torch::Tensor& key,
                                             const torch::Tensor& value,
                                             const torch::Tensor& cu_seqlens_q,
                                             const torch::Tensor& cu_seqlens_k,
                                             const ScaledDotProductAttentionOptions& options = {});

}  // namespace functional
}  // namespace attention
