#pragma once

/// \file
/// Block masks: which keys each query sees, described per block of queries and block of keys
/// (FlexAttention's `BlockMask`), made once from a mask function and read by every attention
/// call it serves.

#include <attention/causal_alignment.h>
#include <attention/export.h>

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <vector>

namespace attention {

/// Whether query `q` of batch row `b` and head `h` sees key `kv` (true: it does). The opposite
/// of a bool `attn_mask`, whose `true` hides a key: a mask function says what is visible, as
/// FlexAttention's `mask_mod` does.
using MaskFunction = std::function<bool(int64_t b, int64_t h, int64_t q, int64_t kv)>;

/// The default side of a block mask's blocks (FlexAttention's default as well).
constexpr int64_t kDefaultMaskBlock = 128;

/// Which keys each query sees, as a class per (batch row, head, query block, key block): empty
/// (no query of the block sees a key of it), full (every query sees every key) or partial (the
/// mask function decides element by element). A kernel skips empty blocks, computes full ones
/// without looking at the mask, and asks the function only inside partial ones.
///
/// Memory is one byte per block, and one byte per query-key pair of each partial block: a mask is
/// made once, and the kernels that read it never call the function. Every class is exact (a
/// block the builders' first guess calls partial, whose pairs turn out all visible or all hidden,
/// is full or empty). A mask whose function does not depend on the batch row or the head is made
/// with `batch` or `heads` 1 and broadcasts over them (its function is called with b = 0 or
/// h = 0). Masks of the same sizes combine with `&` (a key is visible when both see it) and `|`
/// (when either does). A mask never changes once made, and copies share its memory.
///
/// Attention takes a block mask through ScaledDotProductAttentionOptions::block_mask (and
/// MultiHeadAttention's forward options): the fused CPU kernels skip its empty blocks and mask
/// nothing in its full ones; every other route computes from to_attn_mask().
///
/// Thread safety: the member functions are const and the blocks are written only while the mask
/// is made, so any number of threads and attention calls may read one mask (and its copies) at
/// once. Making one (from_function(), &, |) calls mask functions from several threads at once.
///
/// Example:
/// \code
/// using attention::BlockMask;
/// // Causal attention inside each of three documents of a packed 1000-token sequence.
/// std::vector<int64_t> ids(1000);
/// for (int64_t t = 0; t < 1000; ++t) ids[t] = t < 300 ? 0 : (t < 700 ? 1 : 2);
/// BlockMask mask = BlockMask::document(torch::tensor(ids)) & BlockMask::causal(1000, 1000);
/// // mask.visible(0, 0, 500, 299) is false: another document.
/// torch::Tensor hidden = mask.to_attn_mask();  // (1, 1, 1000, 1000) bool, true = hidden
/// \endcode
class ATTENTION_API BlockMask {
 public:
  /// A block's class.
  enum class Block : uint8_t {
    Empty = 0,    ///< No query of the block sees a key of it.
    Partial = 1,  ///< Some do: the mask function decides element by element.
    Full = 2,     ///< Every query of the block sees every key of it.
  };

  /// Evaluates `visible` on every query and key of every block, in parallel over the blocks (so
  /// it must be safe to call from several threads at once), and keeps each block's class and the
  /// pairs of the partial ones. `batch` and `heads` of 1 broadcast; `t_q` queries, `t_k` keys,
  /// square blocks of `block_size` (the last block of each side may be shorter). It takes up to
  /// batch x heads x t_q x t_k calls (the partial blocks' twice): the builders below classify
  /// without calls and ask the function only about the pairs of partial blocks. Throws
  /// c10::ValueError for sizes below their minimum (0 for lengths, 1 otherwise), for more than
  /// 2^36 queries and keys (batch x heads x t_q x t_k: the calls it may make), 2^32 blocks or
  /// 2^34 pairs in partial blocks, and a c10::Error naming the block, query and key
  /// when `visible` throws (nothing is made then).
  static BlockMask from_function(MaskFunction visible, int64_t batch, int64_t heads, int64_t t_q,
                                 int64_t t_k, int64_t block_size = kDefaultMaskBlock);

  /// Query i sees key j <= i + t_k - t_q (bottom-right, the queries are the last t_q positions)
  /// or j <= i (top-left): the library's `is_causal`.
  static BlockMask causal(
      int64_t t_q, int64_t t_k, int64_t block_size = kDefaultMaskBlock,
      functional::CausalAlignment alignment = functional::CausalAlignment::BottomRight);

  /// Causal, and at most `window_left` keys left of the query's position: the library's
  /// `is_causal` with `window_left`.
  static BlockMask sliding_window(
      int64_t t_q, int64_t t_k, int64_t window_left, int64_t block_size = kDefaultMaskBlock,
      functional::CausalAlignment alignment = functional::CausalAlignment::BottomRight);

  /// Query i sees key j when both lie in the same document: `document_ids` (T,) or (B, T) holds
  /// each position's document, any integers (packed sequences: nondecreasing ids give the most
  /// empty and full blocks). Queries and keys are the same T positions; combine with causal()
  /// for causal attention inside each document.
  static BlockMask document(const torch::Tensor& document_ids,
                            int64_t block_size = kDefaultMaskBlock);

  /// Every query sees the first `prefix` keys (the prefix attends bidirectionally), and the keys
  /// up to its own position after them: prefix-LM over T positions.
  static BlockMask prefix_lm(int64_t t, int64_t prefix, int64_t block_size = kDefaultMaskBlock);

  /// A key is visible where both masks see it. Their t_q, t_k and block size must agree; batch
  /// and heads must agree or be 1 (which broadcasts). A block is empty where either part's is,
  /// full where both parts' are, and otherwise as its pairs combine.
  BlockMask operator&(const BlockMask& other) const;
  /// A key is visible where either mask sees it: full where either part's block is, empty where
  /// both are, and otherwise as its pairs combine.
  BlockMask operator|(const BlockMask& other) const;

  /// Batch rows the mask holds (1: the same for every row).
  int64_t batch() const { return batch_; }
  /// Heads the mask holds (1: the same for every head).
  int64_t heads() const { return heads_; }
  /// Queries.
  int64_t t_q() const { return t_q_; }
  /// Keys.
  int64_t t_k() const { return t_k_; }
  /// The side of a block.
  int64_t block_size() const { return block_size_; }
  /// Blocks of queries: ceil(t_q / block_size).
  int64_t q_blocks() const { return q_blocks_; }
  /// Blocks of keys: ceil(t_k / block_size).
  int64_t kv_blocks() const { return kv_blocks_; }

  /// The class of a block; b and h are taken modulo batch() and heads() (broadcast).
  Block block(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const;
  /// Whether query q of batch row b and head h sees key kv: the block's class, and the kept pair
  /// inside a partial block.
  bool visible(int64_t b, int64_t h, int64_t q, int64_t kv) const;
  /// The mask function the mask was made from (for the & and | of two masks, the two functions
  /// combined).
  const MaskFunction& function() const { return visible_; }
  /// The pairs of a partial block, what a kernel reads instead of calling the function: a byte
  /// per query (row) and key (column) of the block, 1 where the query sees the key, rows
  /// pair_stride() apart; nullptr for an empty or full block. b and h broadcast as in block();
  /// the indices are not checked (block() checks them).
  const uint8_t* partial_pairs(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const;
  /// The distance between the rows of partial_pairs(): min(block_size, t_k).
  int64_t pair_stride() const { return pair_cols_; }

  /// How many blocks have each class, over every batch row and head the mask holds.
  int64_t count(Block which) const;

  /// FlexAttention's layout, int32 on the CPU: for each (b, h, query block) the number of its
  /// partial key blocks, (batch, heads, q_blocks).
  torch::Tensor kv_num_blocks() const;
  /// Their indices, first in each row of (batch, heads, q_blocks, kv_blocks) (the rest of the
  /// row is 0).
  torch::Tensor kv_indices() const;
  /// The number of full key blocks of each (b, h, query block).
  torch::Tensor full_kv_num_blocks() const;
  /// Their indices, as kv_indices().
  torch::Tensor full_kv_indices() const;
  /// The transposed view a backward pass visits by key block: for each (b, h, key block) the
  /// number of its partial query blocks, (batch, heads, kv_blocks).
  torch::Tensor q_num_blocks() const;
  /// Their indices, first in each row of (batch, heads, kv_blocks, q_blocks).
  torch::Tensor q_indices() const;
  /// The number of full query blocks of each (b, h, key block).
  torch::Tensor full_q_num_blocks() const;
  /// Their indices, as q_indices().
  torch::Tensor full_q_indices() const;

  /// The dense mask it stands for, (batch, heads, t_q, t_k) bool in this library's convention:
  /// `true` hides the key. What `attn_mask` of scaled_dot_product_attention takes (Math computes
  /// a block mask's attention from it: the reference).
  torch::Tensor to_attn_mask() const;

  /// A copy shares the classes and pairs, which no mask changes once made.
  BlockMask(const BlockMask&) = default;
  /// Shares the classes and pairs of `other`, as a copy does.
  BlockMask& operator=(const BlockMask&) = default;
  /// A move copies: the mask moved from stays the mask it was, where an emptied one would have
  /// nothing for its members to read.
  BlockMask(BlockMask&& other) : BlockMask(static_cast<const BlockMask&>(other)) {}
  /// As the copy assignment: `other` stays the mask it was.
  BlockMask& operator=(BlockMask&& other) { return *this = static_cast<const BlockMask&>(other); }

 private:
  // The classes, and the pairs of the partial blocks. Written while a mask is made, never after.
  struct Storage {
    std::vector<uint8_t> blocks;   // (batch, heads, q_blocks, kv_blocks) Block values
    std::vector<int64_t> partial;  // the partial blocks' indices into `blocks`, ascending
    std::vector<uint8_t> pairs;    // q_side x pair_cols_ bytes per partial block, in that order
  };
  // Fills the pairs of one block of queries [q0, q1) and keys [k0, k1), rows pair_cols_ apart.
  using PairSource =
      std::function<void(int64_t b, int64_t h, int64_t q_block, int64_t kv_block, uint8_t* pairs)>;

  BlockMask(MaskFunction visible, int64_t batch, int64_t heads, int64_t t_q, int64_t t_k,
            int64_t block_size, const char* caller);
  uint8_t& at(int64_t b, int64_t h, int64_t q_block, int64_t kv_block);
  uint8_t at(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const;
  // A builder's classes from the first and last position of each block: `classify(q0, q1, k0,
  // k1)` for queries [q0, q1) and keys [k0, k1).
  void classify_blocks(const std::function<Block(int64_t, int64_t, int64_t, int64_t)>& classify);
  // Keeps the pairs of every block classified partial, from `source` (in parallel; the first
  // failure by block index is thrown, naming the block, as from_function's), then makes each
  // class exact.
  void keep_partial_pairs(const PairSource& source, const char* caller);
  // The source that asks the mask function.
  PairSource function_pairs(const char* caller) const;
  BlockMask combined(const BlockMask& other, bool both, const char* caller) const;
  std::pair<torch::Tensor, torch::Tensor> indices_of(Block which, bool by_key_block) const;

  MaskFunction visible_;
  int64_t batch_, heads_, t_q_, t_k_, block_size_, q_blocks_, kv_blocks_;
  int64_t pair_rows_ = 0, pair_cols_ = 0;  // a partial block's pairs: min(block_size, t_q or t_k)
  std::shared_ptr<Storage> storage_;
};

/// "BlockMask(batch=1, heads=1, t_q=1000, t_k=1000, block_size=128: 12 full, 8 partial, 44
/// empty blocks)".
ATTENTION_API std::ostream& operator<<(std::ostream& out, const BlockMask& mask);

}  // namespace attention
