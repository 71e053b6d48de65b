#pragma once

// One validated attention problem: what functional::scaled_dot_product_attention and
// projected_attention establish once about their inputs, and the one description every backend
// reads. No backend looks at the options or re-derives shapes, causality or masking on its own;
// the helpers below are the only definitions of "which keys can a query see".

#include <attention/block_mask.h>
#include <attention/functional.h>

#include <torch/types.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace attention {
namespace kernels {

/// The largest block size the Chunked backend uses: larger requests are clamped to it (and to
/// the sequence lengths), so that a thread's tile of scores stays at most 16 MiB (float).
constexpr int64_t kMaxBlockSize = 2048;

/// Sequences of different lengths packed one after another along the tokens (FlashAttention's
/// varlen layout): sequence s holds the queries [query_offsets[s], query_offsets[s + 1]) and the
/// keys [key_offsets[s], key_offsets[s + 1]) of the packed tokens. Its queries see its keys only,
/// with causality, the window and ALiBi's distances placed by its own lengths
/// (Problem::sequence). Keys stored elsewhere (pages of a cache) keep the running sum of the
/// sequences' key lengths here: key_begin(s) is then an index into that running sum, keys(s) the
/// sequence's length either way. Validated where it is made: S + 1 offsets of each kind,
/// starting at 0 and nondecreasing.
struct Sequences {
  Sequences(std::vector<int64_t> query_offsets, std::vector<int64_t> key_offsets);
  std::vector<int64_t> query_offsets, key_offsets;
  int64_t max_queries = 0, max_keys = 0;  // the longest sequence's queries and keys
  double score_pairs = 0;                 // the sum over the sequences of queries x keys

  int64_t count() const { return static_cast<int64_t>(query_offsets.size()) - 1; }
  int64_t query_begin(int64_t s) const { return query_offsets[s]; }
  int64_t queries(int64_t s) const { return query_offsets[s + 1] - query_offsets[s]; }
  int64_t key_begin(int64_t s) const { return key_offsets[s]; }
  int64_t keys(int64_t s) const { return key_offsets[s + 1] - key_offsets[s]; }
};

/// Queries (..., H, Tq, d), keys (..., Hkv, Tk, d), values (..., Hkv, Tk, dv), with H = Hkv x G.
/// Flattened, there are N = (...) x Hkv key/value matrices and N x G query matrices: query
/// matrix h reads key/value matrix h / G. Rank-2 inputs are one head (H = Hkv = 1, no lead).
///
/// A packed problem (varlen_attention) is read through the same fields as one batch of H heads
/// whose Tq and Tk are the total query and key tokens of every sequence, queries (H, total_q, d),
/// plus `sequences`, which splits those tokens: the visibility helpers below take a problem with
/// one sequence, so a kernel asks them about sequence(s) of a packed problem.
struct Problem {
  const char* caller = "";          // the public function, for messages
  std::vector<int64_t> lead;        // (..., H): the leading dims of the scores; empty at rank 2
  int64_t heads = 1, kv_heads = 1;  // H and Hkv
  int64_t g = 1;                    // query heads per key/value head
  int64_t n = 1;                    // key/value matrices
  int64_t t_q = 0, t_k = 0, d = 0, dv = 0;
  bool causal = false;
  /// Query i sits at position i + query_offset among the keys: t_k - t_q (bottom-right
  /// alignment) or 0 (top-left). Places the causal diagonal, the window and ALiBi's distances.
  int64_t query_offset = 0;
  /// The sliding window: keys j < pos(i) - window_left and j > pos(i) + window_right are hidden;
  /// -1 = no bound on that side. make_problem describes a window of max(Tq, Tk) or more (up to
  /// INT64_MAX) as no bound, so a bounded side is below max(Tq, Tk): diagonal() and
  /// left_diagonal() lie within (-2 max(Tq, Tk), 2 max(Tq, Tk)) and the helpers below cannot
  /// overflow.
  int64_t window_left = -1, window_right = -1;
  /// Logit soft-capping: scores s become softcap * tanh(s / softcap); 0 = none.
  double softcap = 0.0;
  /// ALiBi: the slope of each query head (H entries; one at rank 2); empty = none.
  std::vector<double> alibi;
  /// A relative position bias table (num_buckets, H) (options.relative_bias); undefined = none.
  torch::Tensor relative_bias;
  /// The bucket of each relative position j - pos(i), from relative_first on: Tq + Tk - 1 of
  /// them, every relative position a query and key of the problem can have (a packed problem's
  /// cover those of every sequence, and its sequences keep them: relative_count() of them).
  std::vector<int64_t> relative_buckets;
  int64_t relative_first = 0;  // -(Tq - 1 + query_offset)
  /// Attention sinks: a logit per query head (H,) in every query's normalizer; undefined = none.
  torch::Tensor sinks;
  /// The user's mask as given: undefined, bool (true = hidden) or additive (same dtype as q).
  torch::Tensor mask;
  bool mask_is_bool = false;
  /// The additive mask is an autograd input of this call (grad mode on and it requires grad).
  bool mask_needs_grad = false;
  /// The block mask (options.block_mask), made for Tq x Tk, its batch and heads broadcasting to
  /// the leading dims; unset = none. A packed problem's is made for at least the longest
  /// sequence's queries and keys, batch 1 or one row per sequence, and each sequence reads its
  /// row's top-left corner (block_mask_rows, with_dense_block_mask). Only the fused CPU kernels
  /// read it as blocks: every other route is handed with_dense_block_mask(), where it is part of
  /// `mask`.
  c10::optional<BlockMask> block_mask;
  /// The score modification (options.score_mod), applied after ALiBi and before the relative
  /// bias and the masks; unset = none. Math calls it on each query matrix, the fused CPU kernels
  /// on each tile (cpu::modify_scores).
  c10::optional<ScoreMod> score_mod;
  /// Autograd records this call: a gradient is wanted for q, k, v or the mask.
  bool needs_grad = false;
  double scale = 1.0;
  /// No scale was given: scale is 1/sqrt(d) (1 when d = 0, where every score is 0).
  bool scale_is_default = true;
  double dropout_p = 0.0;
  bool need_weights = false;
  functional::Backend backend = functional::Backend::Auto;
  int64_t block = 1;  // the Chunked block size, clamped to [1, min(kMaxBlockSize, max(Tq, Tk))]
  at::Device device = at::kCPU;
  /// Where query i of each sequence sits among its keys (query_offset is the one sequence's).
  functional::CausalAlignment alignment = functional::CausalAlignment::BottomRight;
  /// The packed sequences (null: every token is one sequence). Shared by the copies of a problem
  /// and never changed once made; block is clamped to the longest sequence instead of Tq, Tk.
  std::shared_ptr<const Sequences> sequences;
  /// In the problem of one sequence of a packed problem (sequence()), which sequence; -1
  /// otherwise. It picks the block mask's batch row and is a score_mod tile's batch.
  int64_t sequence_index = -1;

  bool packed() const { return sequences != nullptr; }
  /// How many relative positions relative_buckets describes (0 without a relative bias).
  int64_t relative_count() const { return static_cast<int64_t>(relative_buckets.size()); }
  /// A score_mod tile's batch for query matrix m: the leading dims before the heads, flattened,
  /// or the sequence of a packed problem's sequence.
  int64_t tile_batch(int64_t m) const { return sequence_index >= 0 ? sequence_index : m / heads; }
  /// The problem that sequence s of a packed problem poses alone: one batch of H heads with its
  /// lengths and its causal alignment's query_offset, every option and the block as the packed
  /// problem's, and no sequences.
  Problem sequence(int64_t s) const;
  /// How many scores the problem has: (..., H) x Tq x Tk, or over the sequences of a packed one.
  double score_count() const;

  /// Keys after some query are hidden (causal, or a window bounded on the right): query i sees
  /// no key j > i + diagonal().
  bool bounded_right() const { return causal || window_right >= 0; }
  int64_t diagonal() const { return query_offset + (causal ? 0 : window_right); }
  /// Keys before some query are hidden (a window bounded on the left): query i sees no key
  /// j < i + left_diagonal().
  bool bounded_left() const { return window_left >= 0; }
  int64_t left_diagonal() const { return query_offset - window_left; }
  /// The scores are changed before masking (soft-capping, ALiBi or a score modification).
  bool transforms_scores() const { return softcap > 0.0 || !alibi.empty() || score_mod; }
  /// What LibTorch's own kernel cannot compute: soft-capping, ALiBi, a score modification, sinks.
  bool beyond_native() const { return transforms_scores() || sinks.defined(); }

  /// Nothing for a blockwise kernel to do: no query, key or head, or no query or value features
  /// (every score 0, or an empty output). Every backend hands such problems to Math.
  bool degenerate() const { return n == 0 || t_q == 0 || t_k == 0 || d == 0 || dv == 0; }
  /// The shape of the scores, (..., H, Tq, Tk).
  std::vector<int64_t> score_sizes() const;
  /// The user's mask expanded (a view) to the scores' shape; undefined without a mask.
  /// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
  ATTENTION_API torch::Tensor expanded_mask() const;
};

/// Validates query, key, value and options and describes the problem. Throws c10::ValueError for
/// shapes and option values, c10::TypeError for dtypes, c10::Error for devices; each message
/// names `caller`, what it expected and what it got.
/// Exported from a shared build (ATTENTION_API): attention::distributed calls it.
ATTENTION_API Problem make_problem(const torch::Tensor& query, const torch::Tensor& key,
                                   const torch::Tensor& value,
                                   const functional::ScaledDotProductAttentionOptions& options,
                                   const char* caller);

/// The same for packed sequences (varlen_attention): query (total_q, H, d), key (total_k, Hkv, d),
/// value (total_k, Hkv, dv) and the offsets cu_seqlens_q, cu_seqlens_k (read_offsets). Describes
/// the problem as one batch of H heads over the queries (H, total_q, d) (each tensor's dims 0 and
/// 1 swapped, a view), with `sequences` set. Refuses an attn_mask and need_weights by name; a
/// block mask must be made for at least the longest sequence, with batch 1 or S.
Problem make_varlen_problem(const torch::Tensor& query, const torch::Tensor& key,
                            const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                            const torch::Tensor& cu_seqlens_k,
                            const functional::ScaledDotProductAttentionOptions& options,
                            const char* caller);

/// The offsets of packed sequences, read to the host and checked: a 1-D int32 or int64 tensor
/// of S + 1 >= 1 entries, on the CPU or on `like`'s device, starting at 0, nondecreasing and ending
/// at `total` (the packed tensor's token count, which messages call `total_name`). `name` is
/// the argument's name in messages.
std::vector<int64_t> read_offsets(const torch::Tensor& offsets, const char* name, int64_t total,
                                  const char* total_name, const torch::Tensor& like,
                                  const char* caller);

/// The same for projected_attention: checks x_q (T, d_in) or (B, T, d_in), x_kv of the same rank
/// and batch, W_query (d_in, d_kq), W_key (d_in_kv, d_kq), W_value (d_in_kv, d_v), one dtype and
/// device, then describes the problem of the projections without computing them.
Problem make_projected_problem(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                               const torch::Tensor& w_query, const torch::Tensor& w_key,
                               const torch::Tensor& w_value,
                               const functional::ScaledDotProductAttentionOptions& options,
                               const char* caller);

/// The keys [visible_begin(p, i), visible_end(p, i)) that causality and the window let query i
/// see (all Tk without either). The range may be empty. These helpers take a problem of one
/// sequence: a plain problem, or sequence(s) of a packed one (whose indices count from the
/// sequence's first query and key).
inline int64_t visible_begin(const Problem& p, int64_t i) {
  if (!p.bounded_left()) return 0;
  return std::clamp<int64_t>(i + p.left_diagonal(), 0, p.t_k);
}

inline int64_t visible_end(const Problem& p, int64_t i) {
  if (!p.bounded_right()) return p.t_k;
  return std::clamp<int64_t>(i + 1 + p.diagonal(), 0, p.t_k);
}

/// Where the keys seen by query block [i0, i0 + rows) begin and end.
inline int64_t keys_begin(const Problem& p, int64_t i0) {
  return visible_begin(p, i0);
}

inline int64_t keys_end(const Problem& p, int64_t i0, int64_t rows) {
  return visible_end(p, i0 + rows - 1);
}

/// The queries [begin, end) that see at least one key of block [j0, j0 + cols).
inline int64_t queries_begin(const Problem& p, int64_t j0) {
  if (!p.bounded_right()) return 0;
  return std::clamp<int64_t>(j0 - p.diagonal(), 0, p.t_q);
}

inline int64_t queries_end(const Problem& p, int64_t j0, int64_t cols) {
  if (!p.bounded_left()) return p.t_q;
  return std::clamp<int64_t>(j0 + cols - p.left_diagonal(), 0, p.t_q);
}

/// `p` with its block mask turned into the dense mask (BlockMask::to_attn_mask) and merged with
/// attn_mask: a key is hidden where either hides it (an additive mask gets -inf there). What
/// every route but the fused CPU kernels computes from; `p` itself when it has no block mask.
Problem with_dense_block_mask(const Problem& p);

/// `p` with its relative position bias added to the mask as the dense bias it expands to,
/// (H, Tq, Tk) (a bool mask becomes -inf where it hides), differentiable through the table: what
/// every route but the fused CPU kernels computes from; `p` itself without a table.
Problem with_dense_relative_bias(const Problem& p);

/// The bias of each query head at each relative position, (H, Tq + Tk - 1) in `dtype`, row h
/// holding relative_bias[relative_buckets[r], h] at r - relative_first: what the fused kernels
/// add to a tile's scores. Undefined without a table.
torch::Tensor relative_bias_by_position(const Problem& p, at::ScalarType dtype);

/// For each query matrix of `p` (its leading dims (..., H) flattened), the block mask's batch row
/// times its heads plus its head: the (b, h) whose blocks that matrix reads, with the mask's
/// batch and heads broadcast as a dense (batch, heads, Tq, Tk) mask would be.
std::vector<int64_t> block_mask_rows(const Problem& p);

/// ALiBi's biases -slope_h * |pos(i) - j| of every query head, broadcastable to the scores;
/// undefined without ALiBi.
torch::Tensor alibi_bias(const Problem& p, const torch::TensorOptions& options);

/// The keys hidden from each query by causality, the window and a bool mask, true = hidden,
/// broadcastable to the scores; undefined when nothing is hidden that way.
torch::Tensor hidden_keys(const Problem& p);

/// The additive mask, undefined when the mask is bool or absent.
torch::Tensor additive_mask(const Problem& p);

/// Query rows (..., Tq, 1) that see no key at all through the masks (hidden_keys and the -inf
/// entries of the additive mask); undefined when no row can be in that state.
torch::Tensor rows_without_keys(const Problem& p);

}  // namespace kernels
}  // namespace attention
