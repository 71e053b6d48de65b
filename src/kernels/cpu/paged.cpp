// The paged forward on the CPU (kernels/paged.h): keys and values read where they lie in the
// pages of a cache, through each sequence's page table, never gathered into a copy. A work item
// is a sequence's key/value head, a block of its query rows (of every query head that shares
// the key/value head) and a part of the keys they see; each key and value is read once per item,
// for all of its rows, which is what a decoding step (one query, many keys) is bound by. Each
// row keeps a running maximum, sum and weighted values: they are the output when the item holds
// all of the row's keys, and are merged with the other parts' otherwise (split-KV decoding, as
// FlashDecoding: one sequence's step uses every thread). An item of many rows (a multi-query
// step, a prompt chunk) meets its keys and values in matrix products instead, on the columns
// that every one of its rows sees (matrix_tile), and one row at a time on the others (row_tile).

#include "kernels/paged.h"
#include "gemm/small_gemm.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/decode_products.h"
#include "kernels/cpu/query_codes.h"
#include "kernels/cpu/softmax_step.h"
#include "kernels/cpu/tile.h"
#include "kernels/shared_prefix.h"
#include "memory/tile_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace attention {
namespace kernels {
namespace {

using torch::Tensor;

thread_local int64_t last_parts = 0;
thread_local int64_t last_matrix_tiles = 0;
thread_local int64_t last_shared_rows = 0;

// Keys per tile of scores: of the one-row products, and of the matrix products (larger: each
// product's fixed costs, the transposes and the softmax step's calls, are spread over more keys).
constexpr int64_t kPagedKeyTile = 64;
constexpr int64_t kMatrixKeyTile = 256;
// The row stride of a tile's scores: room for a matrix tile's keys rounded up to the products'
// granule.
constexpr int64_t kScoresLd = kMatrixKeyTile + cpu::kSmallGemmGranule;
// Items of at least this many rows, a multiple of it, take matrix products: each key then
// carries enough arithmetic (2 x rows flop per feature) that the one-row products run behind
// the memory.
constexpr int64_t kMatrixRows = cpu::kSmallGemmGranule;
// The most rows of a prompt chunk's item (kPagedItemRows for decoding steps): each key and value
// is copied and widened once per item, and the products' rate grows with their rows.
constexpr int64_t kMatrixItemRows = 128;
// When the split is decided by the threads, a part holds at least this many keys: fewer would
// cost more in merging than they save.
constexpr int64_t kMinPartKeys = 256;
// Parts split the keys on multiples of this many.
constexpr int64_t kPartGranule = 16;

ATTENTION_ALWAYS_INLINE float widen(float x) {
  return x;
}
ATTENTION_ALWAYS_INLINE double widen(double x) {
  return x;
}
// An 8-bit key or value is widened without its row's scale, which is applied once per score and
// once per weight.
ATTENTION_ALWAYS_INLINE float widen(int8_t x) {
  return static_cast<float>(x);
}
static_assert(sizeof(c10::BFloat16) == sizeof(uint16_t), "the vector products read its bits");

// bfloat16 is the upper half of a float: widening is a shift.
ATTENTION_ALWAYS_INLINE float widen(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The pages of keys or values: row j of key/value head kv of a sequence is slot j % P of page
// table[j / P]. 8-bit pages have a scale per row, (num_pages, Hkv, P) floats contiguous.
template <typename In>
struct Pages {
  const In* data;
  int64_t page_stride, head_stride, row_stride, page_size;
  const float* scales = nullptr;
  int64_t scale_page_stride = 0, scale_head_stride = 0;  // a row's scales are contiguous
  Pages(const Tensor& t, const Tensor& row_scales)
      : data(t.data_ptr<In>()),
        page_stride(t.stride(0)),
        head_stride(t.stride(1)),
        row_stride(t.stride(2)),
        page_size(t.size(2)) {
    if constexpr (std::is_same_v<In, int8_t>) {
      scales = row_scales.data_ptr<float>();
      scale_page_stride = row_scales.stride(0);
      scale_head_stride = row_scales.stride(1);
    }
  }
  // Where rows [first, first + count) of key/value head kv lie, and for 8-bit pages their scales,
  // a page at a time. A null scale_to asks for the scales' cache lines instead of reading them,
  // for rows read later: their reads would wait on the memory here.
  void rows(const int64_t* table, int64_t kv, int64_t first, int64_t count, const In** to,
            float* scale_to) const {
    int64_t page = first / page_size, slot = first % page_size;
    for (int64_t j = 0; j < count; ++page, slot = 0) {
      const int64_t n = std::min(page_size - slot, count - j);
      const In* at = data + table[page] * page_stride + kv * head_stride + slot * row_stride;
      for (int64_t i = 0; i < n; ++i) to[j + i] = at + i * row_stride;
      if constexpr (std::is_same_v<In, int8_t>) {
        const float* scale =
            scales + table[page] * scale_page_stride + kv * scale_head_stride + slot;
        if (scale_to != nullptr) {
          std::copy(scale, scale + n, scale_to + j);
        } else {
          __builtin_prefetch(scale);
          __builtin_prefetch(scale + n - 1);
        }
      }
      j += n;
    }
  }
};

// A row of keys or values into the matrix products' buffer: copied, or widened from bfloat16 or
// from 8 bits times the row's scale (on the processor's widest vectors: this file is built for
// the baseline instruction set).
ATTENTION_MULTIVERSION void widen_i8_row(const int8_t* in, float scale, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = static_cast<float>(in[c]) * scale;
}
template <typename In, typename Acc>
void copy_row(const In* in, float scale, Acc* out, int64_t n) {
  if constexpr (std::is_same_v<In, Acc>) {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(Acc));
  } else if constexpr (std::is_same_v<In, int8_t>) {
    static_assert(std::is_same_v<Acc, float>);
    widen_i8_row(in, scale, out, n);
  } else {
    static_assert(std::is_same_v<In, c10::BFloat16> && std::is_same_v<Acc, float>);
    cpu::widen_bf16_rows(reinterpret_cast<const uint16_t*>(in), n, 1, n, out, n);
  }
}

// Asks for `count` rows of `width` elements, a cache line at a time.
template <typename In>
void prefetch_rows(const In* const* rows, int64_t count, int64_t width) {
  constexpr int64_t kLine = 64 / sizeof(In);
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t c = 0; c < width; c += kLine) __builtin_prefetch(rows[j] + c);
  }
}

// Rows r of a sequence's item are (query head g of the key/value head, query i0 + q),
// r = g * nq + q. A shared prefix's item instead holds rows of several sequences' items (listed
// from `first_row` on in the kernel's shared_rows_), against the keys of their common pages.
struct PagedItem {
  int64_t sequence, kv, i0, nq;
  int64_t base;                // the unsplit item this is a part of
  int64_t part;                // which part of its keys
  int64_t key_begin, key_end;  // the part's keys, counted in the sequence
  double cost;
  int64_t rows = 0;
  int64_t first_row = -1;  // >= 0: a shared prefix's item
};

// A row of a shared prefix's item: row `row` of the sequence's item bases_[base].
struct SharedRow {
  int64_t base, row;
};

// The vector products for float accumulation over rows of d and dv features, where they run.
const cpu::DecodeProducts* products_for(int64_t d, int64_t dv) {
  const cpu::DecodeProducts* set = cpu::decode_products();
  return set != nullptr && d % set->lanes == 0 && dv % set->lanes == 0 ? set : nullptr;
}

template <typename In, typename Acc>
class PagedForward {
 public:
  PagedForward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& k_scales,
               const Tensor& v, const Tensor& v_scales, const Tensor& out, const Tensor& table,
               int64_t num_splits, bool share_prefixes)
      : p_(p),
        q_(q),
        out_(out),
        k_(k, k_scales),
        v_(v, v_scales),
        table_(table.data_ptr<int64_t>()),
        table_ld_(table.size(1)),
        num_splits_(num_splits),
        share_prefixes_(share_prefixes) {
    if constexpr (std::is_same_v<Acc, float>) {
      products_ = products_for(p.d, p.dv);
      coded_ = std::is_same_v<In, int8_t> && paged_codes_int8_queries(p.d, p.dv);
      codes_values_ = std::is_same_v<In, int8_t> && paged_codes_int8_weights(p.d, p.dv);
    }
    if constexpr (std::is_same_v<In, c10::BFloat16>) bf16_ = cpu::bf16_products();
    if (p.sinks.defined()) {
      const auto host = p.sinks.detach().to(torch::kCPU, torch::kDouble).contiguous();
      sinks_.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    }
    relative_ = relative_bias_by_position(p, c10::CppTypeToScalarType<Acc>::value);
  }

  void run() {
    make_items();
    last_parts = parts_;
    last_matrix_tiles = 0;
    last_shared_rows = static_cast<int64_t>(shared_rows_.size());
    if (items_.empty()) return;
    partials_.resize(partial_offset_.back());
    cpu::run_dearest_first(
        items_, [&] { return Buffers(p_, max_rows_, matrix_items_, bf16_ != nullptr); },
        [&](const PagedItem& item, Buffers& w) { run_item(item, w); });
    if (partial_offset_.back() > 0) {
      at::parallel_for(0, static_cast<int64_t>(bases_.size()), 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          if (slots(b) > 1) merge(b);
        }
      });
    }
    last_matrix_tiles = matrix_tiles_.load();
  }

 private:
  void make_items() {
    const Sequences& sequences = *p_.sequences;
    const int64_t decode_queries = std::max<int64_t>(1, kPagedItemRows / p_.g);
    const int64_t chunk_queries = matrix_chunk_queries();
    // The fewest queries whose rows are a multiple of the products' granule.
    const int64_t granule_queries = kMatrixRows / std::gcd(kMatrixRows, p_.g);
    problems_.reserve(sequences.count());
    for (int64_t s = 0; s < sequences.count(); ++s) {
      problems_.push_back(p_.sequence(s));
      const Problem& one = problems_.back();
      if (p_.block_mask) blocks_.emplace_back(one);
      for (int64_t kv = 0; kv < p_.n; ++kv) {
        // A prompt chunk's items hold more rows when the matrix products can take them.
        const bool chunk = one.t_q * p_.g > kPagedItemRows && chunk_queries > 0;
        const int64_t nq_max = chunk ? chunk_queries : decode_queries;
        for (int64_t i0 = 0, nq = 0; i0 < one.t_q; i0 += nq) {
          nq = std::min(nq_max, one.t_q - i0);
          // A chunk's last item keeps its rows a multiple of the granule where it can; the few
          // queries left over make an item of their own.
          if (chunk && nq >= granule_queries) {
            nq = nq / granule_queries * granule_queries;
          }
          const int64_t begin = keys_begin(one, i0);
          const int64_t end = std::max(begin, keys_end(one, i0, nq));
          PagedItem base{s, kv, i0, nq, static_cast<int64_t>(bases_.size()), 0, begin, end, 0};
          base.rows = p_.g * nq;
          bases_.push_back(base);
          max_rows_ = std::max(max_rows_, base.rows);
          matrix_items_ = matrix_items_ || takes_matrices(base.rows);
        }
      }
    }
    shared_base_.assign(bases_.size(), 0);
    if (share_prefixes_) stack_shared_prefixes();
    parts_ = parts_for();
    for (const auto* units : {&bases_, &shared_}) {
      for (const PagedItem& unit : *units) split(unit);
    }
    // Where each item of a sequence keeps its rows' states for the merge: one slot per part of
    // its own keys, and one per part of its shared prefix's. An item of one slot writes its
    // output directly.
    partial_offset_.push_back(0);
    for (int64_t b = 0; b < static_cast<int64_t>(bases_.size()); ++b) {
      const int64_t slots_b = slots(b);
      partial_offset_.push_back(partial_offset_.back() +
                                (slots_b > 1 ? slots_b * bases_[b].rows * (p_.dv + 2) : 0));
    }
  }

  // A unit's items: its keys in parts_ parts.
  void split(const PagedItem& unit) {
    const int64_t keys = unit.key_end - unit.key_begin;
    const int64_t span = (keys + parts_ - 1) / parts_;
    const int64_t chunk =
        std::max<int64_t>(kPartGranule, (span + kPartGranule - 1) / kPartGranule * kPartGranule);
    for (int64_t c = 0; c < parts_; ++c) {
      PagedItem item = unit;
      item.part = c;
      item.key_begin = std::min(unit.key_end, unit.key_begin + c * chunk);
      item.key_end = std::min(unit.key_end, item.key_begin + chunk);
      item.cost = static_cast<double>(item.key_end - item.key_begin + kPartGranule) *
                  static_cast<double>(item.rows);
      items_.push_back(item);
    }
  }

  // The slots of sequence item b's rows' states.
  int64_t slots(int64_t b) const { return parts_ * (shared_base_[static_cast<size_t>(b)] ? 2 : 1); }

  // Cascade attention: where sequences of the step begin with the same pages (a cached prefix, or
  // forks), their items' rows of one key/value head are stacked into items of the shared
  // prefix (up to kMatrixItemRows rows, a multiple of the matrix products' granule where there
  // are that many), which read each of its keys and values once for all of them, in matrix
  // products; the sequences' own items keep the keys after it. Each row still sees only what
  // its own sequence lets it see (causality, window, masks), row by row.
  void stack_shared_prefixes() {
    const int64_t count = p_.sequences->count();
    std::vector<KeyRange> keys(static_cast<size_t>(count));
    for (int64_t s = 0; s < count; ++s) {
      const Problem& one = problems_[static_cast<size_t>(s)];
      if (one.t_q > 0 && one.t_k > 0) {
        keys[static_cast<size_t>(s)] = {visible_begin(one, 0), visible_end(one, one.t_q - 1)};
      }
    }
    const std::vector<SharedPrefix> prefixes =
        find_shared_prefixes(table_, count, table_ld_, k_.page_size, keys);
    if (prefixes.empty()) return;
    // The items of sequence s are bases_[first_base[s], first_base[s + 1]).
    std::vector<int64_t> first_base(static_cast<size_t>(count) + 1, 0);
    for (const PagedItem& b : bases_) ++first_base[static_cast<size_t>(b.sequence) + 1];
    std::partial_sum(first_base.begin(), first_base.end(), first_base.begin());
    for (const SharedPrefix& prefix : prefixes) {
      const int64_t shared_keys = prefix.pages * k_.page_size;
      for (int64_t kv = 0; kv < p_.n; ++kv) {
        const int64_t first_row = static_cast<int64_t>(shared_rows_.size());
        for (const int64_t s : prefix.sequences) {
          for (int64_t b = first_base[static_cast<size_t>(s)];
               b < first_base[static_cast<size_t>(s) + 1]; ++b) {
            PagedItem& base = bases_[static_cast<size_t>(b)];
            if (base.kv != kv || base.key_begin >= shared_keys) continue;
            for (int64_t r = 0; r < base.rows; ++r) shared_rows_.push_back({b, r});
            shared_base_[static_cast<size_t>(b)] = 1;
            base.key_begin = shared_keys;
            base.key_end = std::max(base.key_end, base.key_begin);
          }
        }
        const int64_t total = static_cast<int64_t>(shared_rows_.size()) - first_row;
        for (int64_t r0 = 0, rows = 0; r0 < total; r0 += rows) {
          rows = std::min(kMatrixItemRows, total - r0);
          if (rows >= kMatrixRows) rows = rows / kMatrixRows * kMatrixRows;
          PagedItem unit{prefix.sequences.front(),
                         kv,
                         0,
                         0,
                         static_cast<int64_t>(shared_.size()),
                         0,
                         0,
                         shared_keys,
                         0};
          unit.rows = rows;
          unit.first_row = first_row + r0;
          shared_.push_back(unit);
          max_rows_ = std::max(max_rows_, rows);
          matrix_items_ = matrix_items_ || takes_matrices(rows);
        }
      }
    }
  }

  // The queries of a prompt chunk's item: the most whose rows (x the group's query heads) are a
  // multiple of the products' granule and at most kMatrixItemRows; 0 where none is.
  int64_t matrix_chunk_queries() const {
    for (int64_t nq = kMatrixItemRows / p_.g; nq > 0; --nq) {
      if ((nq * p_.g) % kMatrixRows == 0) return nq;
    }
    return 0;
  }

  // Parts per item: as asked, or, when there are fewer items than threads, enough that every
  // thread has one, keeping at least kMinPartKeys keys in a part of the longest item.
  int64_t parts_for() const {
    int64_t longest = 0;
    for (const auto* units : {&bases_, &shared_}) {
      for (const PagedItem& b : *units) longest = std::max(longest, b.key_end - b.key_begin);
    }
    const int64_t most = std::max<int64_t>(1, (longest + kPartGranule - 1) / kPartGranule);
    if (num_splits_ > 0) return std::min(num_splits_, most);
    const int64_t threads = at::get_num_threads();
    const int64_t bases = static_cast<int64_t>(bases_.size() + shared_.size());
    if (bases == 0 || bases >= threads) return 1;
    const int64_t wanted = (threads + bases - 1) / bases;
    return std::clamp<int64_t>(std::min(wanted, longest / kMinPartKeys), 1, most);
  }

  // One thread's buffers, kept for every item it takes. The matrix route's (null when no item
  // takes it): the queries transposed (d x rows), a tile's keys and values widened into rows of
  // their own (zero rows up to the products' granule), its scores as the keys x rows product,
  // and the values' product before it joins `acc`. With the processor's bfloat16 products, the
  // tile's bfloat16 keys and values gathered, then packed in pairs, the queries in bfloat16, and
  // the probabilities rounded to it.
  struct Buffers {
    cpu::TileLease lease;
    Acc *acc, *max, *sum, *q, *s;
    const In** k_ptr;
    const In** v_ptr;
    float *k_scale, *v_scale;  // the tile's rows' scales (8-bit pages)
    int64_t* lo;
    int64_t* hi;
    // Each row's sequence, query head and query (counted in its sequence).
    int64_t *sequence, *head, *query;
    // The item's queries as 16-bit codes and their rows' scales, where `coded` (8-bit keys on
    // integer products: kernels/cpu/query_codes.h).
    int16_t* q_codes;
    float* q_scales;
    bool coded = false;
    // Keys [asked_from, asked_to) of the item, whose rows the last tile asked the memory for.
    int64_t asked_from = 0, asked_to = 0;
    // The matrix route's: the codes in pairs (cpu::pack_code_pairs) and a group of keys' codes
    // widened for the products.
    int32_t *q_pairs = nullptr, *key_words = nullptr, *value_words = nullptr;
    Acc *q_t = nullptr, *keys = nullptr, *values = nullptr, *s_t = nullptr, *scratch = nullptr;
    uint16_t *q16 = nullptr, *keys16 = nullptr, *values16 = nullptr, *p16 = nullptr;
    uint32_t *key_pairs = nullptr, *value_pairs = nullptr;
    Buffers(const Problem& p, int64_t rows, bool matrix, bool bf16)
        : lease(bytes(p, rows, matrix, bf16)),
          acc(lease.take<Acc>(rows * p.dv)),
          max(lease.take<Acc>(rows)),
          sum(lease.take<Acc>(rows)),
          q(lease.take<Acc>(rows * p.d)),
          s(lease.take<Acc>(rows * kScoresLd)),
          k_ptr(lease.take<const In*>(2 * kMatrixKeyTile)),
          v_ptr(lease.take<const In*>(2 * kMatrixKeyTile)),
          k_scale(lease.take<float>(2 * kMatrixKeyTile)),
          v_scale(lease.take<float>(2 * kMatrixKeyTile)),
          lo(lease.take<int64_t>(rows)),
          hi(lease.take<int64_t>(rows)),
          sequence(lease.take<int64_t>(rows)),
          head(lease.take<int64_t>(rows)),
          query(lease.take<int64_t>(rows)),
          q_codes(lease.take<int16_t>(rows * p.d)),
          q_scales(lease.take<float>(rows)) {
      if (!matrix) return;
      q_t = lease.take<Acc>(p.d * rows);
      keys = lease.take<Acc>(kMatrixKeys * p.d);
      values = lease.take<Acc>(kMatrixKeys * p.dv);
      s_t = lease.take<Acc>(kMatrixKeys * rows);
      scratch = lease.take<Acc>(rows * p.dv);
      q_pairs = lease.take<int32_t>(rows * p.d / 2);
      key_words = lease.take<int32_t>(cpu::kCodedColumnKeys * p.d / 2);
      if constexpr (std::is_same_v<In, int8_t>) {
        value_words = lease.take<int32_t>(cpu::coded_values_scratch_words(rows, p.dv));
      }
      if (!bf16) return;
      q16 = lease.take<uint16_t>(rows * p.d);
      keys16 = lease.take<uint16_t>(kMatrixKeyTile * p.d);
      values16 = lease.take<uint16_t>(kMatrixKeyTile * p.dv);
      p16 = lease.take<uint16_t>(rows * kScoresLd);
      key_pairs = lease.take<uint32_t>((p.d + 1) / 2 * kMatrixKeyTile);
      value_pairs = lease.take<uint32_t>(kMatrixKeyTile / 2 * p.dv);
    }
    static constexpr int64_t kMatrixKeys = kMatrixKeyTile + cpu::kSmallGemmGranule;
    static size_t bytes(const Problem& p, int64_t rows, bool matrix, bool bf16) {
      using L = cpu::TileLease;
      size_t total = L::tile_bytes<Acc>(rows * p.dv) + 2 * L::tile_bytes<Acc>(rows) +
                     L::tile_bytes<Acc>(rows * p.d) + L::tile_bytes<Acc>(rows * kScoresLd) +
                     2 * L::tile_bytes<const In*>(2 * kMatrixKeyTile) +
                     2 * L::tile_bytes<float>(2 * kMatrixKeyTile) +
                     5 * L::tile_bytes<int64_t>(rows) + L::tile_bytes<int16_t>(rows * p.d) +
                     L::tile_bytes<float>(rows);
      if (matrix) {
        total += L::tile_bytes<Acc>(p.d * rows) + L::tile_bytes<Acc>(kMatrixKeys * p.d) +
                 L::tile_bytes<Acc>(kMatrixKeys * p.dv) + L::tile_bytes<Acc>(kMatrixKeys * rows) +
                 L::tile_bytes<Acc>(rows * p.dv) + L::tile_bytes<int32_t>(rows * p.d / 2) +
                 L::tile_bytes<int32_t>(cpu::kCodedColumnKeys * p.d / 2);
        if constexpr (std::is_same_v<In, int8_t>) {
          total += L::tile_bytes<int32_t>(cpu::coded_values_scratch_words(rows, p.dv));
        }
        if (bf16) {
          total += L::tile_bytes<uint16_t>(rows * p.d) +
                   L::tile_bytes<uint16_t>(kMatrixKeyTile * p.d) +
                   L::tile_bytes<uint16_t>(kMatrixKeyTile * p.dv) +
                   L::tile_bytes<uint16_t>(rows * kScoresLd) +
                   L::tile_bytes<uint32_t>((p.d + 1) / 2 * kMatrixKeyTile) +
                   L::tile_bytes<uint32_t>(kMatrixKeyTile / 2 * p.dv);
        }
      }
      return total;
    }
  };

  void run_item(const PagedItem& it, Buffers& w) {
    const int64_t rows = it.rows, width = p_.dv + 2;
    describe_rows(it, w);
    std::fill(w.acc, w.acc + rows * p_.dv, Acc(0));
    std::fill(w.max, w.max + rows, -std::numeric_limits<Acc>::infinity());
    std::fill(w.sum, w.sum + rows, Acc(0));
    if (it.key_end > it.key_begin) attend(it, w);
    if (it.first_row < 0 && slots(it.base) == 1) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = p_.sequences->query_begin(w.sequence[r]) + w.query[r];
        write_row(w.head[r], i, w.acc + r * p_.dv, w.max[r], w.sum[r]);
      }
      return;
    }
    // Kept for the merge: each row's state (values..., maximum, sum) in its slot, after the
    // parts of its sequence item's own keys for a shared prefix's item.
    for (int64_t r = 0; r < rows; ++r) {
      int64_t base = it.base, row = r, slot = it.part;
      if (it.first_row >= 0) {
        const SharedRow& shared = shared_rows_[static_cast<size_t>(it.first_row + r)];
        base = shared.base;
        row = shared.row;
        slot = parts_ + it.part;
      }
      Acc* to = partials_.data() + partial_offset_[static_cast<size_t>(base)] +
                (slot * bases_[static_cast<size_t>(base)].rows + row) * width;
      std::copy(w.acc + r * p_.dv, w.acc + (r + 1) * p_.dv, to);
      to[p_.dv] = w.max[r];
      to[p_.dv + 1] = w.sum[r];
    }
  }

  // Each row's sequence, query head and query.
  void describe_rows(const PagedItem& it, Buffers& w) const {
    for (int64_t r = 0; r < it.rows; ++r) {
      const PagedItem* base = &it;
      int64_t row = r;
      if (it.first_row >= 0) {
        const SharedRow& shared = shared_rows_[static_cast<size_t>(it.first_row + r)];
        base = &bases_[static_cast<size_t>(shared.base)];
        row = shared.row;
      }
      w.sequence[r] = base->sequence;
      w.head[r] = base->kv * p_.g + row / base->nq;
      w.query[r] = base->i0 + row % base->nq;
    }
  }

  // The item's keys, a tile at a time: each key and value read once from its page for all rows.
  // An item of many rows takes, in each tile, the columns every row sees in matrix products, and
  // the columns some rows do not (across the causal diagonal or a window's edge) one row at a time.
  //
  // A shared prefix's item reads the pages through its first sequence's table: every sharer's
  // holds the same pages there.
  void attend(const PagedItem& it, Buffers& w) const {
    const Problem& ps = problems_[it.sequence];
    const int64_t* table = table_ + it.sequence * table_ld_;
    const int64_t rows = it.rows, d = p_.d;
    const Acc scale = static_cast<Acc>(p_.scale);
    w.asked_from = w.asked_to = 0;  // no key of this item is on its way yet
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = p_.sequences->query_begin(w.sequence[r]) + w.query[r];
      const Acc* from = q_.row(w.head[r], i);
      for (int64_t c = 0; c < d; ++c) w.q[r * d + c] = from[c] * scale;
    }
    code_queries(rows, w);
    if (!takes_matrices(rows)) {
      for (int64_t j0 = it.key_begin; j0 < it.key_end; j0 += kPagedKeyTile) {
        row_tile(it, w, ps, table, j0, std::min(kPagedKeyTile, it.key_end - j0));
      }
      return;
    }
    // The float products' queries, transposed (coded items' scores take the codes instead).
    if (!w.coded) cpu::transpose_scaled<Acc>(w.q, d, rows, d, Acc(1), w.q_t, rows);
    if (bf16_ != nullptr) {
      // The queries as they came (bfloat16, widened exactly): the products take the scale.
      for (int64_t r = 0; r < rows; ++r) {
        const Acc* from = q_.row(w.head[r], p_.sequences->query_begin(w.sequence[r]) + w.query[r]);
        for (int64_t c = 0; c < d; ++c) w.q16[r * d + c] = c10::BFloat16(from[c]).x;
      }
    }
    for (int64_t j0 = it.key_begin; j0 < it.key_end; j0 += kMatrixKeyTile) {
      const int64_t cols = std::min(kMatrixKeyTile, it.key_end - j0);
      // The columns [begin, end) of the tile that every row sees.
      int64_t begin = 0, end = cols;
      for (int64_t r = 0; r < rows; ++r) {
        const Problem& own = problems_[w.sequence[r]];
        begin = std::max(begin, visible_begin(own, w.query[r]) - j0);
        end = std::min(end, visible_end(own, w.query[r]) - j0);
      }
      if (end - begin < cpu::kSmallGemmGranule) {
        row_tile(it, w, ps, table, j0, cols);
        continue;
      }
      if (begin > 0) row_tile(it, w, ps, table, j0, begin);
      matrix_tile(it, w, ps, table, j0 + begin, end - begin);
      if (end < cols) row_tile(it, w, ps, table, j0 + end, cols - end);
    }
  }

  // The item's scaled queries as codes, where its keys are 8-bit and every row can be coded (a row
  // with a value that is not finite keeps the float products, and so does its item).
  void code_queries(int64_t rows, Buffers& w) const {
    w.coded = coded_;
    if constexpr (std::is_same_v<Acc, float>) {
      for (int64_t r = 0; r < rows && w.coded; ++r) {
        w.coded = cpu::code_query_row(w.q + r * p_.d, p_.d, w.q_codes + r * p_.d, w.q_scales + r);
      }
      if (w.coded && takes_matrices(rows)) cpu::pack_code_pairs(w.q_codes, rows, p_.d, w.q_pairs);
    }
  }

  // Scores on integer products, where the item's queries are coded; false where they are not.
  bool coded_scores(const Buffers& w, int64_t rows, const In* const* keys, const float* scales,
                    int64_t cols, Acc* s, cpu::RowsAhead* ahead) const {
    if constexpr (std::is_same_v<In, int8_t> && std::is_same_v<Acc, float>) {
      if (w.coded) {
        products_->scores_coded(w.q_codes, w.q_scales, rows, p_.d, keys, scales, cols, s, kScoresLd,
                                ahead);
        return true;
      }
    }
    return false;
  }

  // The same for a matrix tile's keys (in w.k_ptr), transposed into w.s_t as the float product
  // leaves them.
  bool coded_column_scores(const Buffers& w, int64_t rows, int64_t cols) const {
    if constexpr (std::is_same_v<In, int8_t> && std::is_same_v<Acc, float>) {
      if (w.coded) {
        products_->scores_coded_columns(w.q_pairs, w.q_scales, rows, p_.d, w.k_ptr, w.k_scale, cols,
                                        w.s_t, rows, w.key_words);
        return true;
      }
    }
    return false;
  }

  // Keys [j0, j0 + cols) against every row of the item, one row at a time.
  void row_tile(const PagedItem& it, Buffers& w, const Problem& ps, const int64_t* table,
                int64_t j0, int64_t cols) const {
    const int64_t rows = it.rows, d = p_.d, dv = p_.dv, ld = kScoresLd;
    // Each row's columns: the keys of the tile it sees.
    int64_t lo = cols, hi = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const Problem& own = problems_[w.sequence[r]];
      w.lo[r] = std::clamp<int64_t>(visible_begin(own, w.query[r]) - j0, 0, cols);
      w.hi[r] = std::clamp<int64_t>(visible_end(own, w.query[r]) - j0, w.lo[r], cols);
      if (w.hi[r] > w.lo[r]) {
        lo = std::min(lo, w.lo[r]);
        hi = std::max(hi, w.hi[r]);
      }
    }
    if (hi <= lo) return;  // no row sees a key of this tile
    k_.rows(table, it.kv, j0 + lo, hi - lo, w.k_ptr + lo, w.k_scale + lo);
    v_.rows(table, it.kv, j0 + lo, hi - lo, w.v_ptr + lo, w.v_scale + lo);
    // 8-bit rows are short: the next tile is asked for too, or too few bytes are on their way at
    // once for the memory to deliver its rate. Its rows are asked for a few lines at a time as
    // the integer products go (RowsAhead), its scales' lines here.
    const bool asked = w.asked_from <= j0 + lo && j0 + hi <= w.asked_to;
    cpu::RowsAhead keys_ahead, values_ahead;
    if constexpr (std::is_same_v<In, int8_t>) {
      const int64_t next = std::min(kPagedKeyTile, it.key_end - (j0 + cols));
      if (next > 0 && cols + next <= kMatrixKeyTile) {
        k_.rows(table, it.kv, j0 + cols, next, w.k_ptr + cols, nullptr);
        v_.rows(table, it.kv, j0 + cols, next, w.v_ptr + cols, nullptr);
        keys_ahead = cpu::RowsAhead(w.k_ptr + cols, next, d);
        values_ahead = cpu::RowsAhead(w.v_ptr + cols, next, dv);
        w.asked_from = j0 + cols;
        w.asked_to = j0 + cols + next;
      }
    }
    // Scores of every row against the keys some row sees, while the values they weigh are on
    // their way to the cache (rows a page apart are in no order a hardware prefetcher follows).
    if (products_ != nullptr) {
      if (!asked) prefetch_rows(w.v_ptr + lo, hi - lo, dv);
      if (!coded_scores(w, rows, w.k_ptr + lo, w.k_scale + lo, hi - lo, w.s + lo, &keys_ahead)) {
        keys_ahead.rest();
        vector_scores(w.q, rows, w.k_ptr + lo, w.k_scale + lo, hi - lo, w.s + lo, ld);
      }
    } else {
      keys_ahead.rest();
      values_ahead.rest();
      for (int64_t j = lo; j < hi; ++j) {
        const In* key = w.k_ptr[j];
        for (int64_t r = 0; r < rows; ++r) {
          const Acc* q = w.q + r * d;
          Acc dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < d; ++c) dot += q[c] * widen(key[c]);
          if constexpr (std::is_same_v<In, int8_t>) dot *= w.k_scale[j];
          w.s[r * ld + j] = dot;
        }
      }
    }
    const bool uniform = every_row_sees(w, rows, lo, hi);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t a = w.lo[r], b = w.hi[r];
      Acc* s = w.s + r * ld;
      if (b > a) {
        if (modifies(ps)) prepare_row(w, r, j0 + a, b - a, s + a);
        if (!uniform) {
          cpu::online_softmax_step(s + a, 1, b - a, ld, false, 0, w.max + r, w.sum + r,
                                   w.acc + r * dv, dv, dv);
        }
      }
      // Probabilities of the columns the row does not see are 0.
      std::fill(s + lo, s + a, Acc(0));
      std::fill(s + std::max(a, b), s + hi, Acc(0));
    }
    if (uniform) {
      cpu::online_softmax_step(w.s + lo, rows, hi - lo, ld, false, 0, w.max, w.sum, w.acc, dv, dv);
    }
    // The weighted values (a value a row gives no weight is not read for it).
    if (products_ != nullptr) {
      vector_values(w.s + lo, ld, rows, w.v_ptr + lo, w.v_scale + lo, hi - lo, w.acc, &values_ahead,
                    nullptr);
      return;
    }
    for (int64_t j = lo; j < hi; ++j) {
      const In* value = w.v_ptr[j];
      for (int64_t r = 0; r < rows; ++r) {
        Acc weight = w.s[r * ld + j];
        if (weight == Acc(0)) continue;
        if constexpr (std::is_same_v<In, int8_t>) weight *= w.v_scale[j];
        Acc* acc = w.acc + r * dv;
#pragma omp simd
        for (int64_t c = 0; c < dv; ++c) acc[c] += weight * widen(value[c]);
      }
    }
  }

  // Whether anything comes between a row's products and its softmax step: soft-capping, ALiBi, a
  // score modification, a relative bias or a block mask.
  bool modifies(const Problem& ps) const {
    return ps.transforms_scores() || relative_.defined() || !blocks_.empty();
  }

  // That, on the scores `s` of the item's row r against keys [j0, j0 + cols) of its sequence.
  void prepare_row(const Buffers& w, int64_t r, int64_t j0, int64_t cols, Acc* s) const {
    static const std::vector<int64_t> no_mask;
    const int64_t sequence = w.sequence[r], m = w.head[r], i = w.query[r];
    cpu::prepare_scores<Acc>(problems_[sequence], no_mask, m, i, 1, j0, cols, s, kScoresLd, nullptr,
                             relative_.defined() ? relative_.data_ptr<Acc>() : nullptr);
    if (!blocks_.empty()) blocks_[sequence].hide(m, i, 1, j0, cols, s, kScoresLd);
  }

  // Whether an item of `rows` rows meets its keys in matrix products.
  static bool takes_matrices(int64_t rows) {
    return rows >= kMatrixRows && rows % kMatrixRows == 0;
  }

  // Whether every row of the item sees all of the tile's columns [lo, hi) and no other.
  static bool every_row_sees(const Buffers& w, int64_t rows, int64_t lo, int64_t hi) {
    for (int64_t r = 0; r < rows; ++r) {
      if (w.lo[r] != lo || w.hi[r] != hi) return false;
    }
    return true;
  }

  // The next matrix tile's keys and values, from `from`, asked for while this tile's products run
  // (rows a page apart are in no order a hardware prefetcher follows), where the step reads them
  // once: a prompt chunk's items read the same keys one after another, from the cache.
  void prefetch_next_tile(const PagedItem& it, Buffers& w, const Problem& ps, const int64_t* table,
                          int64_t from) const {
    const int64_t next = std::min(kMatrixKeyTile, it.key_end - from);
    if (next <= 0 || (it.first_row < 0 && ps.t_q * p_.g > kMatrixItemRows)) return;
    // Into the pointers' upper half: the tile's own are still read after this.
    const In** k = w.k_ptr + kMatrixKeyTile;
    const In** v = w.v_ptr + kMatrixKeyTile;
    k_.rows(table, it.kv, from, next, k, nullptr);  // the scales' lines asked for
    v_.rows(table, it.kv, from, next, v, nullptr);
    prefetch_rows(k, next, p_.d);
    prefetch_rows(v, next, p_.dv);
  }

  // Keys [j0, j0 + cols), which every row of the item sees, through two matrix products: the keys
  // and values are widened into rows of their own (zero rows up to the products' granule, whose
  // weights are 0), the scores made as keys x queries^T and turned back to rows, the softmax step
  // taken for all rows at once, and the weighted values added as one product. No row meets a
  // value it does not see, so a NaN or inf there stays out of it, as the one-row products keep it.
  // 8-bit pages take the integer products instead, reading the codes where they lie: the keys
  // against coded queries for the scores, the values against coded weights.
  void matrix_tile(const PagedItem& it, Buffers& w, const Problem& ps, const int64_t* table,
                   int64_t j0, int64_t cols) const {
    if (bf16_ != nullptr) {
      bf16_matrix_tile(it, w, ps, table, j0, cols);
      return;
    }
    const int64_t rows = it.rows, d = p_.d, dv = p_.dv, ld = kScoresLd;
    const int64_t padded =
        (cols + cpu::kSmallGemmGranule - 1) / cpu::kSmallGemmGranule * cpu::kSmallGemmGranule;
    k_.rows(table, it.kv, j0, cols, w.k_ptr, w.k_scale);
    v_.rows(table, it.kv, j0, cols, w.v_ptr, w.v_scale);
    // 8-bit keys and values on integer products are read where they lie.
    const bool coded = coded_column_scores(w, rows, cols);
    for (int64_t j = 0; j < cols; ++j) {
      if (!coded) copy_row(w.k_ptr[j], w.k_scale[j], w.keys + j * d, d);
      if (!codes_values_) copy_row(w.v_ptr[j], w.v_scale[j], w.values + j * dv, dv);
    }
    // Zero rows up to the granule, for the float products only.
    if (!coded) std::fill(w.keys + cols * d, w.keys + padded * d, Acc(0));
    if (!codes_values_) std::fill(w.values + cols * dv, w.values + padded * dv, Acc(0));
    prefetch_next_tile(it, w, ps, table, j0 + cols);
    if (!coded) {
      cpu::gemm<Acc>(false, false, padded, rows, d, Acc(1), w.keys, d, w.q_t, rows, Acc(0), w.s_t,
                     rows);
    }
    cpu::transpose_scaled<Acc>(w.s_t, rows, cols, rows, Acc(1), w.s, ld);
    for (int64_t r = 0; r < rows; ++r) {
      Acc* row = w.s + r * ld;
      if (modifies(ps)) prepare_row(w, r, j0, cols, row);
      std::fill(row + cols, row + padded, Acc(0));
    }
    cpu::online_softmax_step(w.s, rows, cols, ld, false, 0, w.max, w.sum, w.acc, dv, dv);
    if (codes_values_) {
      vector_values(w.s, ld, rows, w.v_ptr, w.v_scale, cols, w.acc, nullptr, w.value_words);
    } else {
      cpu::gemm<Acc>(false, false, rows, dv, padded, Acc(1), w.s, ld, w.values, dv, Acc(1), w.acc,
                     dv, w.scratch);
    }
    ++matrix_tiles_;
  }

  // The same on the processor's bfloat16 products, for bfloat16 pages (bf16_ is set for them
  // only): the tile's keys and values gathered as they are and packed in pairs, the scores made
  // as queries x keys^T with the scale as the products' alpha, and the probabilities rounded to
  // bfloat16 once before they weight the values, as the fused kernels' bfloat16 route does.
  void bf16_matrix_tile(const PagedItem& it, Buffers& w, const Problem& ps, const int64_t* table,
                        int64_t j0, int64_t cols) const {
    if constexpr (std::is_same_v<Acc, float>) {
      const int64_t rows = it.rows, d = p_.d, dv = p_.dv, ld = kScoresLd;
      k_.rows(table, it.kv, j0, cols, w.k_ptr, w.k_scale);
      v_.rows(table, it.kv, j0, cols, w.v_ptr, w.v_scale);
      for (int64_t j = 0; j < cols; ++j) {
        std::memcpy(w.keys16 + j * d, w.k_ptr[j], static_cast<size_t>(d) * sizeof(uint16_t));
        std::memcpy(w.values16 + j * dv, w.v_ptr[j], static_cast<size_t>(dv) * sizeof(uint16_t));
      }
      bf16_->pack_column_pairs(w.keys16, d, cols, d, w.key_pairs, kMatrixKeyTile);
      cpu::pack_row_pairs(w.values16, dv, cols, dv, w.value_pairs, dv);
      prefetch_next_tile(it, w, ps, table, j0 + cols);
      bf16_->product(rows, cols, d, static_cast<float>(p_.scale), w.q16, d, w.key_pairs,
                     kMatrixKeyTile, false, w.s, ld);
      if (modifies(ps)) {
        for (int64_t r = 0; r < rows; ++r) prepare_row(w, r, j0, cols, w.s + r * ld);
      }
      cpu::online_softmax_step(w.s, rows, cols, ld, false, 0, w.max, w.sum, w.acc, dv, dv);
      bf16_->round(w.s, ld, rows, cols, w.p16, ld);
      bf16_->product(rows, dv, cols, 1, w.p16, ld, w.value_pairs, dv, true, w.acc, dv);
    }
    ++matrix_tiles_;
  }

  // The products on this processor's vector instructions (products_ is set for float, bfloat16
  // and 8-bit inputs only, whose bfloat16 is a uint16_t's bits).
  void vector_scores(const Acc* q, int64_t rows, const In* const* keys, const float* scales,
                     int64_t cols, Acc* s, int64_t ld) const {
    if constexpr (std::is_same_v<In, int8_t>) {
      products_->scores_i8(q, rows, p_.d, keys, scales, cols, s, ld);
    } else if constexpr (std::is_same_v<In, float>) {
      products_->scores(q, rows, p_.d, keys, cols, s, ld);
    } else if constexpr (std::is_same_v<In, c10::BFloat16>) {
      products_->scores_bf16(q, rows, p_.d, reinterpret_cast<const uint16_t* const*>(keys), cols, s,
                             ld);
    }
  }
  // `ahead`: the next tile's values, asked for on the way (all at once by the float products).
  // `scratch` (a matrix tile's value_words, or null): the coded products' with many rows.
  void vector_values(const Acc* weights, int64_t ld, int64_t rows, const In* const* values,
                     const float* scales, int64_t cols, Acc* acc, cpu::RowsAhead* ahead,
                     int32_t* scratch) const {
    if constexpr (std::is_same_v<In, int8_t>) {
      if (codes_values_) {
        products_->values_coded(weights, ld, rows, values, scales, cols, acc, p_.dv, ahead,
                                scratch);
      } else {
        if (ahead != nullptr) ahead->rest();
        products_->values_i8(weights, ld, rows, values, scales, cols, acc, p_.dv);
      }
    } else if constexpr (std::is_same_v<In, float>) {
      products_->values(weights, ld, rows, values, cols, acc, p_.dv);
    } else if constexpr (std::is_same_v<In, c10::BFloat16>) {
      products_->values_bf16(weights, ld, rows, reinterpret_cast<const uint16_t* const*>(values),
                             cols, acc, p_.dv);
    }
  }

  // A row's output from its state once all of its keys are in: the sink (if any) joins the
  // normalizer as a key without a value.
  void write_row(int64_t m, int64_t i, const Acc* acc, Acc max, Acc sum) const {
    Acc shrink = 1;
    if (!sinks_.empty()) {
      // At the larger maximum of the two, the keys' sum and values shrink by exp(max - top).
      const Acc sink = static_cast<Acc>(sinks_[m % p_.heads]);
      const Acc top = sum == Acc(0) || sink > max ? sink : max;
      shrink = sum == Acc(0) ? Acc(0) : cpu::exp_nonpositive(max - top);
      sum = sum * shrink + cpu::exp_nonpositive(sink - top);
    }
    const bool dead = sum == Acc(0);  // NaN sums are not dead: they stay NaN
    const Acc inverse = dead ? Acc(0) : shrink / sum;
    Acc* o = out_.row(m, i);
    for (int64_t c = 0; c < p_.dv; ++c) o[c] = acc[c] * inverse;
  }

  // The parts of an unsplit item's rows, merged: each part's sum and values rescaled to the
  // largest maximum of the parts (what their log-sum-exp weighs them by).
  void merge(int64_t b) const {
    const PagedItem& it = bases_[b];
    const int64_t rows = it.rows, width = p_.dv + 2, parts_b = slots(b);
    const int64_t q0 = p_.sequences->query_begin(it.sequence);
    const Acc* parts = partials_.data() + partial_offset_[b];
    std::vector<Acc> acc(p_.dv);
    constexpr Acc kInf = std::numeric_limits<Acc>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      Acc max = -kInf;
      for (int64_t c = 0; c < parts_b; ++c) {
        max = std::max(max, parts[(c * rows + r) * width + p_.dv]);
      }
      Acc sum = 0;
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t c = 0; c < parts_b; ++c) {
        const Acc* part = parts + (c * rows + r) * width;
        const Acc part_max = part[p_.dv], part_sum = part[p_.dv + 1];
        if (part_sum != part_sum) {  // a NaN score in the part: the row is NaN
          sum = part_sum;
          continue;
        }
        if (part_max == -kInf) continue;  // the part saw no key
        const Acc weight = cpu::exp_nonpositive(part_max - max);
        sum += part_sum * weight;
        for (int64_t k = 0; k < p_.dv; ++k) acc[k] += part[k] * weight;
      }
      const int64_t m = it.kv * p_.g + r / it.nq, i = q0 + it.i0 + r % it.nq;
      write_row(m, i, acc.data(), max, sum);
    }
  }

  const Problem& p_;
  cpu::Matrices<Acc> q_, out_;
  Pages<In> k_, v_;
  const int64_t* table_;
  int64_t table_ld_;
  int64_t num_splits_;
  bool share_prefixes_;
  const cpu::DecodeProducts* products_ = nullptr;  // nullptr: the portable loops
  bool coded_ = false;                       // 8-bit keys meet coded queries in integer products
  bool codes_values_ = false;                // and 8-bit values coded weights
  const cpu::Bf16Products* bf16_ = nullptr;  // bfloat16 pages' matrix products; nullptr: widened
  std::vector<double> sinks_;
  std::vector<Problem> problems_;
  std::vector<cpu::MaskBlocks> blocks_;  // each sequence's view of the block mask, if any
  Tensor relative_;                      // relative_bias_by_position, undefined without a table
  std::vector<PagedItem> bases_, items_;
  std::vector<PagedItem> shared_;       // the shared prefixes' units, before their split
  std::vector<SharedRow> shared_rows_;  // their rows
  std::vector<char> shared_base_;       // whether bases_[b]'s rows meet a shared prefix
  std::vector<int64_t> partial_offset_;
  std::vector<Acc> partials_;
  int64_t parts_ = 1, max_rows_ = 1;
  bool matrix_items_ = false;  // whether some item takes matrix products
  mutable std::atomic<int64_t> matrix_tiles_{0};
};

// Pages whose rows are contiguous, as the kernel reads them (a cache's pools are).
Tensor rows_in_place(const Tensor& pages) {
  return pages.stride(3) == 1 ? pages : pages.contiguous();
}

}  // namespace

int64_t paged_forward_last_parts() {
  return last_parts;
}

int64_t paged_forward_last_matrix_tiles() {
  return last_matrix_tiles;
}

int64_t paged_forward_last_shared_rows() {
  return last_shared_rows;
}

bool paged_codes_int8_queries(int64_t d, int64_t dv) {
  // 8-bit keys on integer products where a register of 16-bit codes divides the features.
  const cpu::DecodeProducts* set = products_for(d, dv);
  return set != nullptr && d % (2 * set->lanes) == 0 && cpu::int8_products_enabled();
}

bool paged_codes_int8_weights(int64_t d, int64_t dv) {
  const cpu::DecodeProducts* set = products_for(d, dv);
  return set != nullptr && dv % (2 * set->lanes) == 0 && cpu::int8_products_enabled();
}

bool paged_shares_prefixes() {
  static const bool shares = [] {
    const char* forced = std::getenv("ATTENTION_CPU_SHARED_PREFIXES");
    return forced == nullptr || std::string(forced) != "off";
  }();
  return shares;
}

bool paged_forward_applies(const Tensor& query) {
  const auto dtype = query.scalar_type();
  return query.device().is_cpu() &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

Tensor paged_forward(const Problem& p, const Tensor& query, const Tensor& key_pages,
                     const Tensor& value_pages, const Tensor& table, int64_t num_splits,
                     const Tensor& key_scales, const Tensor& value_scales, bool share_prefixes) {
  const auto dtype = query.scalar_type();
  const auto acc_dtype = dtype == at::kBFloat16 ? at::kFloat : dtype;
  // The queries in the computing dtype, (total_q, H, d) contiguous; read as (H, total_q, d).
  const Tensor q = cpu::converted(query, acc_dtype).contiguous();
  const Tensor out = torch::empty({query.size(0), query.size(1), p.dv}, q.options());
  const Tensor k = rows_in_place(key_pages), v = rows_in_place(value_pages);
  const Tensor q_heads = q.transpose(0, 1), out_heads = out.transpose(0, 1);
  if (key_pages.scalar_type() == at::kChar) {
    TORCH_INTERNAL_ASSERT(acc_dtype == at::kFloat, "8-bit pages are read for float queries");
    const Tensor ks = key_scales.stride(2) == 1 ? key_scales : key_scales.contiguous();
    const Tensor vs = value_scales.stride(2) == 1 ? value_scales : value_scales.contiguous();
    PagedForward<int8_t, float>(p, q_heads, k, ks, v, vs, out_heads, table, num_splits,
                                share_prefixes)
        .run();
  } else if (dtype == at::kBFloat16) {
    PagedForward<c10::BFloat16, float>(p, q_heads, k, {}, v, {}, out_heads, table, num_splits,
                                       share_prefixes)
        .run();
  } else if (dtype == at::kFloat) {
    PagedForward<float, float>(p, q_heads, k, {}, v, {}, out_heads, table, num_splits,
                               share_prefixes)
        .run();
  } else {
    PagedForward<double, double>(p, q_heads, k, {}, v, {}, out_heads, table, num_splits,
                                 share_prefixes)
        .run();
  }
  return acc_dtype == dtype ? out : out.to(dtype);
}

}  // namespace kernels
}  // namespace attention
