#pragma once

/// \file
/// A key/value cache that many sequences share: a pool of fixed-size pages, a page table per
/// sequence, pages shared by reference count between forked sequences.

#include <attention/export.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

#include <cstdint>
#include <list>
#include <map>
#include <unordered_map>
#include <vector>

namespace attention {

/// Options of PagedKVCache.
struct PagedKVCacheOptions {
  /// The pool's sizes: `num_pages` pages of `page_size` tokens, each token `num_kv_heads` keys
  /// and values of `head_dim` features.
  PagedKVCacheOptions(int64_t num_pages, int64_t page_size, int64_t num_kv_heads, int64_t head_dim)
      : num_pages_(num_pages),
        page_size_(page_size),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim) {}
  /// Pages in the pool: the most tokens held at once, all sequences together, is num_pages *
  /// page_size.
  TORCH_ARG(int64_t, num_pages);
  /// Tokens per page. On the CPU, pages of 64 to 256 tokens keep the kernels' tiles large; a
  /// sequence wastes at most page_size - 1 slots of its last page.
  TORCH_ARG(int64_t, page_size);
  /// Key/value heads of the attention that writes the cache.
  TORCH_ARG(int64_t, num_kv_heads);
  /// Features per head (keys and values alike).
  TORCH_ARG(int64_t, head_dim);
  /// Layers whose keys and values the cache holds. The page table is shared: a token's slot is the
  /// same in every layer, so that one extend() per step serves the whole model.
  TORCH_ARG(int64_t, num_layers) = 1;
  /// Keys each query sees, itself included (the `sliding_window` of the attention that reads the
  /// cache, or more): pages whose tokens every later query of their sequence has left behind go
  /// back to the pool. Unset: sequences keep every page; must be >= 1.
  TORCH_ARG(c10::optional<int64_t>, sliding_window) = c10::nullopt;
  /// The keys' and values' dtype: float, double or bfloat16; or torch::kChar, 8 bits per feature
  /// with a float scale per token and head (for keys and for values), a quarter of float's bytes
  /// (see PagedKVCache).
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;
  /// Where the pool lives.
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

class PagedKVCache;

/// What PagedKVCache::add_sequence(tokens) made: the new sequence, and how many of its leading
/// tokens the cache already holds (whole pages, written in every layer by an earlier sequence
/// with the same tokens at the same positions). The caller computes the rest: the sequence's
/// length() is cached_tokens, and its next step extends it by the tokens after them.
struct PrefixHit {
  /// The new sequence's id.
  int64_t sequence = -1;
  /// Its tokens already in the cache: a multiple of page_size, less than the tokens given (the
  /// last token is always left to compute, since its query makes the next token's logits).
  int64_t cached_tokens = 0;
};

/// One step of a PagedKVCache: which sequences take part, how many new tokens each brings (its
/// rows of the packed batch), where those tokens' keys and values go, and every sequence's keys
/// after the step, as page tables. Made by PagedKVCache::extend(); valid until the cache changes
/// again (the next extend, add, fork, free or truncate), after which the cache refuses it.
///
/// Packed layout: the new tokens of sequences()[i] are rows [query_starts[i],
/// query_starts[i + 1]) of the step's (total_tokens, ...) tensors; their positions in their
/// sequence are key_lengths[i] - (query_starts[i + 1] - query_starts[i]) onwards.
///
/// Thread safety: nothing changes a batch after extend() made it; any number of threads may read
/// one (its tensors included), as long as none assigns to the object meanwhile.
class ATTENTION_API PagedBatch {
 public:
  /// An empty batch of no cache.
  PagedBatch() = default;

  /// The sequences of the step, in the order of the packed rows.
  const std::vector<int64_t>& sequences() const { return sequences_; }
  /// Rows of the packed batch, all sequences together.
  int64_t total_tokens() const { return total_tokens_; }
  /// (S + 1,) int64 on the CPU: where each sequence's rows begin (FlashAttention's cu_seqlens_q).
  const torch::Tensor& query_starts() const { return query_starts_; }
  /// (S,) int64 on the CPU: each sequence's tokens after the step (its keys are positions
  /// [0, key_lengths[i]); FlashAttention's cache_seqlens once the step's keys are written).
  const torch::Tensor& key_lengths() const { return key_lengths_; }
  /// (S, max_pages) int64 on the CPU: the page that holds keys [j * page_size, (j + 1) *
  /// page_size) of sequence i at (i, j); -1 past its last page and where a sliding window let
  /// the page go (FlashAttention's block_table).
  const torch::Tensor& page_table() const { return page_table_; }
  /// (total_tokens,) int64 on the CPU: each new token's position in its sequence (for rotary
  /// embeddings and position tables).
  const torch::Tensor& positions() const { return positions_; }

 private:
  friend class PagedKVCache;
  std::vector<int64_t> sequences_;
  int64_t total_tokens_ = 0;
  torch::Tensor query_starts_, key_lengths_, page_table_, positions_;
  std::vector<int64_t> slots_;  // page * page_size + offset of every new token
  uint64_t version_ = 0;        // the state of the cache it was made in (unique in the process)
};

/// Keys and values of many sequences in one bounded pool of pages (vLLM's PagedAttention): a
/// server adds a sequence when a request arrives, extends all running sequences by a different
/// number of tokens each in one step (a prompt's chunk for some, one decoded token for others),
/// and frees a sequence when its request ends, its pages going back to the pool at once.
///
/// - Memory: 2 x num_layers x num_pages x page_size x num_kv_heads x head_dim elements, allocated
///   when the cache is made (the system maps it as it is written) and never more.
/// - Forks: fork_sequence() makes a sequence that shares every page of its parent (parallel
///   sampling, beam search, a common prompt). Full pages stay shared for good; a partly filled
///   page is copied when the first of its sharers writes to it.
/// - Sliding window: with `sliding_window(W)`, a sequence gives back each page once every later
///   query of it sees none of its keys (all its tokens lie before position length - W + 1).
/// - Failure: extend() checks every sequence and counts every page first; when the pool cannot
///   give what a step needs it throws c10::ValueError and the cache is exactly as it was.
/// - 8 bits (dtype torch::kChar): write() takes float, double or bfloat16 keys and values and
///   keeps each token's row of each head as int8 codes and a float scale, max|x| / 127 (codes
///   round(x / scale)), so each feature is off by at most half its row's scale. A row with a NaN or
///   an infinity keeps a NaN scale: what attends to it comes out NaN, as with the float cache.
///   The attention reads the codes in place (functional::paged_attention's overload with scales;
///   MultiHeadAttention::forward_paged takes it).
///
/// A step: extend() reserves slots for the new tokens and returns a PagedBatch; each layer writes
/// its keys and values with write(), then attends through the batch's page tables
/// (functional::paged_attention, or MultiHeadAttention::forward_paged, which does both).
///
/// Thread safety: no lock inside. add_sequence(), add_tokens(), fork_sequence(), free_sequence(),
/// truncate() and extend() need the cache to themselves (extend() may copy pages of every layer;
/// they offer the pages written since the last of them to prefix caching); other calls may
/// overlap, but write() of a layer must not overlap another read or write of that layer's pages
/// (write() touches no other layer: it records only how far its layer is written). A reader-writer
/// lock fits (docs/THREADS.md).
///
/// Example:
/// \code
/// attention::PagedKVCache cache(attention::PagedKVCacheOptions(
///     /*num_pages=*/64, /*page_size=*/16, /*num_kv_heads=*/2, /*head_dim=*/8));
/// int64_t a = cache.add_sequence(), b = cache.add_sequence();
/// attention::PagedBatch step = cache.extend({a, b}, {5, 1});  // a prefills 5 tokens, b 1
/// cache.write(/*layer=*/0, step, torch::randn({6, 2, 8}), torch::randn({6, 2, 8}));
/// int64_t c = cache.fork_sequence(a);  // shares a's page until one of them writes to it
/// cache.free_sequence(b);              // its page goes back to the pool
/// \endcode
class ATTENTION_API PagedKVCache {
 public:
  /// Allocates the pool (one tensor for every layer's keys and values). Throws c10::ValueError
  /// unless every size is positive (and the window >= 1) and the pool's size in bytes fits in
  /// int64; c10::TypeError for a dtype other than float, double or bfloat16.
  explicit PagedKVCache(const PagedKVCacheOptions& options);
  /// Not copyable: a copy would write into the same pool.
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;
  /// Movable: the pool, the sequences and their page tables move to the new object.
  PagedKVCache(PagedKVCache&&) noexcept = default;
  /// Movable: the pool, the sequences and their page tables move to this object.
  PagedKVCache& operator=(PagedKVCache&&) noexcept = default;

  /// A new, empty sequence; its id (ids are never reused).
  int64_t add_sequence();
  /// A new sequence whose first tokens are `tokens` (1-D, any integer dtype, on the CPU): it
  /// starts with the cached pages of the longest prefix of them (see the class comment), and the
  /// cache remembers the rest, so that the pages the sequence fills with them are offered to later
  /// sequences once written. Throws c10::TypeError for another dtype, c10::ValueError for another
  /// shape, device or more tokens than the pool holds; nothing changes then.
  PrefixHit add_sequence(const torch::Tensor& tokens);
  /// Tells the cache the ids of a sequence's next tokens, after those it knows (the tokens given to
  /// add_sequence() and to earlier calls): a decoded token, or the next turn of a conversation,
  /// so that their pages are offered too. Same checks as add_sequence(tokens), and the sequence
  /// must be known; nothing changes when one fails.
  void add_tokens(int64_t sequence, const torch::Tensor& tokens);
  /// A new sequence with the tokens of `parent`, sharing its pages; its id.
  int64_t fork_sequence(int64_t parent);
  /// Forgets a sequence; pages no other sequence shares go back to the pool.
  void free_sequence(int64_t sequence);
  /// Keeps the first `length` tokens of a sequence (rolling back rejected tokens, or a step that
  /// failed after extend()), and forgets the ids of its tokens past `length` (add_tokens() tells
  /// the cache the next ones). Throws c10::ValueError unless length <= length(sequence) and, with a
  /// sliding window, the tokens a query at `length` sees are still held.
  void truncate(int64_t sequence, int64_t length);

  /// Reserves slots for new_tokens[i] more tokens of sequences[i] (all distinct), taking pages
  /// from the pool (and copying shared pages the step writes to), and returns the step's batch.
  /// Throws c10::ValueError, leaving the cache unchanged, for an unknown or freed sequence, a
  /// repeated one, a negative count, or a step that needs more pages than the pool has free.
  PagedBatch extend(const std::vector<int64_t>& sequences, const std::vector<int64_t>& new_tokens);
  /// The pages extend() would take from the pool for this step (0 when it fits in held pages),
  /// with the same checks but nothing changed: for admitting requests while memory lasts; the
  /// largest int64 for a sequence that asks for more tokens than the whole pool holds.
  int64_t pages_needed(const std::vector<int64_t>& sequences,
                       const std::vector<int64_t>& new_tokens) const;

  /// Writes the keys and values (total_tokens, num_kv_heads, head_dim) of `batch`'s new tokens
  /// into layer `layer`. Throws c10::ValueError for a batch the cache no longer holds (made before
  /// the cache last changed, or by another cache) and for wrong shapes, c10::TypeError for another
  /// dtype, c10::Error for another device; nothing is written then.
  void write(int64_t layer, const PagedBatch& batch, const torch::Tensor& keys,
             const torch::Tensor& values);

  /// The pool of keys of `layer`, (num_pages, num_kv_heads, page_size, head_dim): page p holds
  /// its tokens' keys at [p, :, slot, :]. The pool's own memory, not a copy.
  torch::Tensor keys(int64_t layer) const;
  /// The pool of values of `layer`, shaped like keys().
  torch::Tensor values(int64_t layer) const;
  /// The scales of the keys of `layer` in an 8-bit cache, (num_pages, num_kv_heads, page_size)
  /// float: key [p, h, slot, :] stands for keys(layer)[p, h, slot, :] times it. Undefined for
  /// caches of other dtypes.
  torch::Tensor key_scales(int64_t layer) const;
  /// The scales of the values of `layer`, as key_scales().
  torch::Tensor value_scales(int64_t layer) const;
  /// Whether the cache keeps 8-bit codes and scales (dtype torch::kChar).
  bool quantized() const { return options_.dtype() == torch::kChar; }
  /// Whether `batch` describes this cache as it is now.
  bool holds(const PagedBatch& batch) const;

  /// Tokens of a sequence so far (the next token's position).
  int64_t length(int64_t sequence) const;
  /// The pages of a sequence, one per page_size tokens, -1 where a sliding window let one go.
  std::vector<int64_t> pages(int64_t sequence) const;
  /// The sequences held, in the order they were added.
  std::vector<int64_t> sequences() const;
  /// Pages no sequence holds (the cached ones among them, which the pool gives back when needed).
  int64_t free_pages() const;
  /// Pages no sequence holds that prefix caching keeps for reuse (part of free_pages()).
  int64_t cached_pages() const;
  /// Whether `page` is offered to sequences with its tokens (held by a sequence or not).
  bool page_cached(int64_t page) const;
  /// How many sequences hold `page` (0 when it is free).
  int64_t page_references(int64_t page) const;
  /// The options it was made with.
  const PagedKVCacheOptions& options() const { return options_; }
  /// The pool's size in bytes, keys and values of every layer (and their scales).
  int64_t memory_bytes() const { return memory_bytes_; }

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int64_t> pages;  // -1 where released by the window
    int64_t released = 0;        // leading pages given back
    // Prefix caching: the token ids known from position 0, the tokens each layer has written from
    // position 0 without a gap, and the serial of the cached page standing for each leading page
    // offered so far (the sequence's own page, or the one cached before it with the same tokens).
    std::vector<int64_t> tokens;
    std::vector<int64_t> written;
    std::vector<uint64_t> offered;
  };
  // A cached page: its serial, its tokens and the serial of the cached page before it (0 for a
  // sequence's first page). Serials are never reused: a page given back and cached again under
  // other tokens has a new one, so the pages cached after it before are found no more.
  struct CachedPage {
    uint64_t serial = 0;
    uint64_t parent = 0;
    uint64_t hash = 0;
    std::vector<int64_t> tokens;
    bool idle = false;                  // in lru_: no sequence holds it
    std::list<int64_t>::iterator used;  // its place in lru_ when idle
  };
  struct Plan;

  const Sequence& find(int64_t sequence, const char* caller) const;
  Sequence& find(int64_t sequence, const char* caller);
  Plan plan(const std::vector<int64_t>& sequences, const std::vector<int64_t>& new_tokens,
            const char* caller) const;
  int64_t take_page();
  void drop_page(int64_t page);
  void copy_page(int64_t from, int64_t to);
  static std::vector<int64_t> token_ids(const torch::Tensor& tokens, int64_t capacity,
                                        const char* caller);
  int64_t find_cached(uint64_t parent, const int64_t* tokens) const;
  void offer_written_pages();
  void offer_pages(Sequence& s);
  void forget_page(int64_t page);
  void changed();
  void check_layer(int64_t layer, const char* caller) const;
  // Rows (total_tokens, num_kv_heads, width) of the batch's new tokens into a pool of one layer's
  // keys, values or scales, (num_pages, num_kv_heads, page_size, width).
  void scatter(torch::Tensor pool, const torch::Tensor& from, const PagedBatch& batch) const;

  PagedKVCacheOptions options_;
  int64_t memory_bytes_ = 0;
  torch::Tensor pool_;                     // (2, num_layers, num_pages, num_kv_heads, page_size,
                                           // head_dim): keys, then values
  torch::Tensor scales_;                   // 8-bit caches: (2, num_layers, num_pages,
                                           // num_kv_heads, page_size) float
  std::map<int64_t, Sequence> sequences_;  // live ones by id (ids grow: the order added)
  int64_t next_id_ = 0;
  std::vector<int64_t> references_;  // per page ever used; pages beyond were never taken
  std::vector<int64_t> free_list_;   // pages given back, taken again first
  int64_t free_count_ = 0;
  uint64_t version_ = 0;  // drawn from a process-wide counter at every change
  // Prefix caching: cached pages by page, their pages by hash, and the idle ones least recently
  // used first.
  std::unordered_map<int64_t, CachedPage> cached_;
  std::unordered_multimap<uint64_t, int64_t> by_hash_;
  std::list<int64_t> lru_;
  uint64_t next_serial_ = 0;
};

}  // namespace attention
