// The chunked forward on the CPU, fused. Each thread takes items of a query head and up to four
// of its query blocks, and keeps one tile of scores in its cache while the scores, the
// online-softmax step and the weighted sum of values run over it; no LibTorch op works on more
// than one tile, so there is one pass over memory per product instead of one per element-wise
// op. Each key block's keys are transposed (and scaled) once for the item's query blocks, so
// both products read their operands along rows, as the generated small-product kernels want
// (gemm/blas.h, gemm/small_gemm.h). The softmax step is a loop the compiler vectorizes, with a
// polynomial exp, built for several instruction sets and picked at run time on x86-64 (written
// with AVX-512's or AVX2's intrinsics where the processor has them: kernels/cpu/softmax.h).
// Queries, keys and values are read in place through their strides, so heads split by a
// view/transpose are not copied, and the output is written in the queries' memory layout.
// bfloat16 is read as it is and worked on in float: the same loop over float scores and states,
// the output accumulated in the thread's float rows and rounded once into the bfloat16 output. On
// the processor's bfloat16 products (kernels/cpu/bf16_products.h) keys and values are packed in
// pairs as the products read them and each tile's probabilities are rounded to bfloat16 before
// they weight the values; elsewhere an item's queries, and each key block's keys and values, are
// widened where they are turned, and the float products run on them (the same sums as widening
// the whole tensors first, without their copies in memory).

#include "gemm/small_gemm.h"
#include "kernels/chunked.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/softmax_step.h"
#include "kernels/cpu/tile.h"
#include "memory/tile_pool.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace attention {
namespace kernels {
namespace {

using cpu::bits;
using cpu::Matrices;
using torch::Tensor;

// T: the scores, the softmax's states and the output. In: the queries, keys and values, T itself
// or bfloat16 (then T is float).
template <typename T, typename In = T>
class Forward {
  static constexpr bool kBf16 = !std::is_same<T, In>::value;
  static_assert(!kBf16 || (std::is_same<T, float>::value && std::is_same<In, c10::BFloat16>::value),
                "bfloat16 inputs are worked on in float");

 public:
  // The output's type: T, or for bfloat16 inputs bfloat16 (rounded once from T's sums).
  using Out = std::conditional_t<kBf16, In, T>;

  Forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
          Tensor& lse)
      : p_(p),
        q_(q),
        k_(k),
        v_(v),
        out_(out),
        lse_(lse.defined() ? lse.data_ptr<T>() : nullptr),
        lse_ld_(p.t_q),
        blocks_(p),
        relative_(relative_bias_by_position(p, c10::CppTypeToScalarType<T>::value)) {
    if (p.mask.defined()) mask_at_ = cpu::matrix_offsets(p.mask);
  }

  // One sequence of a packed problem: `one` is its problem (Problem::sequence), the matrices
  // start at its first query and key row, and its log-sum-exp rows (if any) lie lse_ld apart.
  // `relative`: the packed problem's relative_bias_by_position, which every sequence shares.
  Forward(const Problem& one, Matrices<In> q, Matrices<In> k, Matrices<In> v, Matrices<Out> out,
          T* lse, int64_t lse_ld, const Tensor& relative)
      : p_(one),
        q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        out_(std::move(out)),
        lse_(lse),
        lse_ld_(lse_ld),
        blocks_(one),
        relative_(relative) {}

  void run() {
    const int64_t blocks = (p_.t_q + p_.block - 1) / p_.block;
    const int64_t group = group_size(blocks);
    const int64_t groups = (blocks + group - 1) / group;
    at::parallel_for(0, p_.n * p_.g * groups, 1, [&](int64_t begin, int64_t end) {
      TileBuffers w(p_, group);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t first = cpu::interleaved(item % groups, groups) * group;
        query_blocks(item / groups, first, std::min(group, blocks - first), w);
      }
    });
  }

 private:
  // Query blocks per item: each key block is then turned once for all of them. Every query block
  // splits its keys into key blocks on the same lattice (first_key_block), so the results do not
  // depend on the grouping. Enough items are left to keep every thread busy.
  int64_t group_size(int64_t blocks) const {
    const int64_t threads = at::get_num_threads();
    return std::clamp<int64_t>(p_.n * p_.g * blocks / (8 * threads), 1, kMaxGroup);
  }

 public:
  static constexpr int64_t kMaxGroup = 4;

  // One thread's buffers, reused for every item it takes, from memory kept between calls: the
  // scores, each row's running maximum and sum for the query blocks of a group, the key block's
  // keys transposed (and scaled), and a tile's weighted values before they are added to the
  // accumulated ones. The accumulated values are the output's own rows. For bfloat16 inputs:
  // the group's accumulated values (the output is rounded once from them), and on the bfloat16
  // products the keys in pair rows (where the transposed keys would be), the values in pair rows
  // and a tile's probabilities rounded to bfloat16; without them the group's queries and the key
  // block's values widened.
  struct TileBuffers {
    cpu::TileLease lease;
    T *scores, *max, *sum, *keys_t, *product;
    T* acc = nullptr;
    uint32_t* value_pairs = nullptr;
    uint16_t* probabilities = nullptr;
    T *queries = nullptr, *values = nullptr;
    int64_t queries_from = 0;  // the first query row that `queries` holds
    TileBuffers(const Problem& p, int64_t group)
        : lease(2 * cpu::TileLease::tile_bytes<T>(group * p.block) +
                cpu::TileLease::tile_bytes<T>(p.block * p.block) +
                cpu::TileLease::tile_bytes<T>(p.d * p.block) +
                cpu::TileLease::tile_bytes<T>(p.block * p.dv) + low_input_bytes(p, group)),
          scores(lease.take<T>(p.block * p.block)),
          max(lease.take<T>(group * p.block)),
          sum(lease.take<T>(group * p.block)),
          keys_t(lease.take<T>(p.d * p.block)),
          product(lease.take<T>(p.block * p.dv)) {
      if (!kBf16) return;
      acc = lease.take<T>(group * p.block * p.dv);
      if (cpu::bf16_products()) {
        value_pairs = lease.take<uint32_t>(pair_rows(p) * p.dv);
        probabilities = lease.take<uint16_t>(p.block * p.block);
      } else {
        queries = lease.take<T>(group * p.block * p.d);
        values = lease.take<T>(p.block * p.dv);
      }
    }
    static size_t low_input_bytes(const Problem& p, int64_t group) {
      if (!kBf16) return 0;
      const size_t acc = cpu::TileLease::tile_bytes<T>(group * p.block * p.dv);
      if (cpu::bf16_products()) {
        return acc + cpu::TileLease::tile_bytes<uint32_t>(pair_rows(p) * p.dv) +
               cpu::TileLease::tile_bytes<uint16_t>(p.block * p.block);
      }
      return acc + cpu::TileLease::tile_bytes<T>(group * p.block * p.d) +
             cpu::TileLease::tile_bytes<T>(p.block * p.dv);
    }
    // The pair rows of a key block's values.
    static int64_t pair_rows(const Problem& p) { return (p.block + 1) / 2; }
    // The key block's keys in pair rows: ceil(d / 2) rows of block words fit the transposed keys.
    uint32_t* key_pairs() const { return reinterpret_cast<uint32_t*>(keys_t); }
  };

  // The running state of one query block's rows: accumulated values (in the output, rows
  // acc_ld apart), maximum and sum.
  struct Rows {
    T* acc;
    int64_t acc_ld;
    T *max, *sum;
  };

  // Query head h, the `count` query blocks from block `first` on: every key block they see, each
  // turned once and taken by every query block that sees it, then their output rows.
  void query_blocks(int64_t h, int64_t first, int64_t count, TileBuffers& w) const {
    const int64_t kv = h / p_.g, i0 = first * p_.block;
    const int64_t rows = std::min(count * p_.block, p_.t_q - i0);
    const auto [acc, acc_ld] = accumulated(h, i0, w);
    std::fill(w.max, w.max + rows, -std::numeric_limits<T>::infinity());
    std::fill(w.sum, w.sum + rows, T(0));
    for (int64_t r = 0; r < rows; ++r) std::fill_n(acc + r * acc_ld, p_.dv, T(0));
    if constexpr (kBf16) {
      if (!bf16_) {  // the group's queries widened once for all of its key blocks
        cpu::widen_bf16_rows(bits(q_.row(h, i0)), q_.row_stride, rows, p_.d, w.queries, p_.d);
        w.queries_from = i0;
      }
    }
    const int64_t keys = keys_end(p_, i0, rows);
    for (int64_t j0 = first_key_block(i0); j0 < keys; j0 += p_.block) {
      if (blocks_.defined() && hidden_from_all(h, i0, rows, j0, std::min(p_.block, keys - j0))) {
        continue;
      }
      turn(kv, j0, std::min(p_.block, keys - j0), w);
      for (int64_t b = 0; b < count; ++b) {
        const int64_t offset = b * p_.block;
        const Rows state{acc + offset * acc_ld, acc_ld, w.max + offset, w.sum + offset};
        key_block(h, kv, i0 + offset, std::min(p_.block, p_.t_q - i0 - offset), j0, state, w);
      }
    }
    T* lse = lse_ ? lse_ + h * lse_ld_ + i0 : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const bool dead = w.sum[r] == T(0);  // NaN sums are not dead: they stay NaN
      const T inverse = dead ? T(0) : T(1) / w.sum[r];
      T* o = acc + r * acc_ld;
      for (int64_t c = 0; c < p_.dv; ++c) o[c] *= inverse;
      if (lse) lse[r] = dead ? std::numeric_limits<T>::infinity() : w.max[r] + std::log(w.sum[r]);
    }
    if constexpr (kBf16) {
      if (bf16_) {
        bf16_->round(acc, acc_ld, rows, p_.dv, cpu::bits(out_.row(h, i0)), out_.row_stride);
      } else {
        cpu::round_to_bf16_rows(acc, acc_ld, rows, p_.dv, cpu::bits(out_.row(h, i0)),
                                out_.row_stride);
      }
    }
  }

 private:
  // Where the rows of query head h from i0 accumulate their weighted values, and their row
  // stride: the output's own rows, or for bfloat16 inputs the thread's float rows.
  std::pair<T*, int64_t> accumulated(int64_t h, int64_t i0, const TileBuffers& w) const {
    if constexpr (kBf16) {
      return {w.acc, p_.dv};
    } else {
      return {out_.row(h, i0), out_.row_stride};
    }
  }

  // The key block of `cols` keys from j0, turned once for the group's tiles. The scores read both
  // operands along rows: the keys transposed, with the scale folded in. The bfloat16 products
  // read keys and values in pair rows, and apply the scale to the scores; without them bfloat16
  // keys are widened as they are transposed, and values into the thread's rows.
  void turn(int64_t kv, int64_t j0, int64_t cols, TileBuffers& w) const {
    if constexpr (kBf16) {
      if (bf16_) {
        bf16_->pack_column_pairs(bits(k_.row(kv, j0)), k_.row_stride, cols, p_.d, w.key_pairs(),
                                 p_.block);
        cpu::pack_row_pairs(bits(v_.row(kv, j0)), v_.row_stride, cols, p_.dv, w.value_pairs, p_.dv);
        return;
      }
      cpu::transpose_scaled<T, In>(k_.row(kv, j0), k_.row_stride, cols, p_.d,
                                   static_cast<T>(p_.scale), w.keys_t, p_.block);
      cpu::widen_bf16_rows(bits(v_.row(kv, j0)), v_.row_stride, cols, p_.dv, w.values, p_.dv);
    } else {
      cpu::transpose_scaled<T>(k_.row(kv, j0), k_.row_stride, cols, p_.d, static_cast<T>(p_.scale),
                               w.keys_t, p_.block);
    }
  }

  // Whether the block mask hides the keys [j0, j0 + cols) from every query block of the group
  // [i0, i0 + rows): then nothing turns them.
  bool hidden_from_all(int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols) const {
    for (int64_t r0 = 0; r0 < rows; r0 += p_.block) {
      const int64_t r = std::min(p_.block, rows - r0);
      if (blocks_.tile(h, i0 + r0, r, j0, cols) != BlockMask::Block::Empty) return false;
    }
    return true;
  }

  // Where the key blocks of query block i0 begin: on the lattice of block multiples, which every
  // query block shares, so that a group's query blocks take the same key blocks as they would
  // alone (a window's left edge falls inside a block, whose hidden keys its strips mask), and a
  // tile's sides stay multiples of the block.
  int64_t first_key_block(int64_t i0) const { return keys_begin(p_, i0) / p_.block * p_.block; }

  // Queries [i0, i0 + rows) of head h against the key block from j0 (whose transposed keys `w`
  // holds), where they see it: tiles, or strips of rows where an edge crosses it.
  void key_block(int64_t h, int64_t kv, int64_t i0, int64_t rows, int64_t j0, const Rows& state,
                 TileBuffers& w) const {
    const int64_t keys = keys_end(p_, i0, rows);
    if (j0 >= keys || j0 < first_key_block(i0)) return;  // a group's other query blocks see it
    const int64_t cols = std::min(p_.block, keys - j0);
    // A block mask's empty tile is skipped, a full one masks nothing, a partial one its pairs.
    const auto visibility = blocks_.tile(h, i0, rows, j0, cols);
    if (visibility == BlockMask::Block::Empty) return;
    const bool partial = visibility == BlockMask::Block::Partial;
    const int64_t strip = cpu::crosses_edge(p_, i0, rows, j0, cols) ? cpu::kDiagonalStrip : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += strip) {
      const int64_t sr = std::min(strip, rows - r0);
      auto c = cpu::strip_columns(p_, i0 + r0, sr, j0, cols);
      // A window's left edge starts where it falls; the strip starts at the granule below (the
      // few keys between are masked), so that its products keep generated kernels.
      c.begin -= c.begin % cpu::kSmallGemmGranule;
      // Keys of the strip's columns that its first row sees (visible_end before its clamp:
      // rows above the first visible one count down from it).
      const int64_t seen = i0 + r0 + 1 + p_.diagonal() - (j0 + c.begin);
      if (c.end > c.begin) {
        const Rows strip_state{state.acc + r0 * state.acc_ld, state.acc_ld, state.max + r0,
                               state.sum + r0};
        tile(h, kv, i0 + r0, sr, j0, c.begin, c.end - c.begin, cols, seen, partial, strip_state,
             w.scores + r0 * cols, w);
      }
    }
  }

  // Queries [i, i + rows) against keys [block + from, block + from + cols), of the key block
  // whose transposed keys `w` holds: scores in `scores` (row stride ld), the softmax step, and
  // the weighted values into the rows' accumulated values. `partial`: the block mask hides some
  // of the tile's pairs.
  void tile(int64_t h, int64_t kv, int64_t i, int64_t rows, int64_t block, int64_t from,
            int64_t cols, int64_t ld, int64_t seen, bool partial, const Rows& state, T* scores,
            const TileBuffers& w) const {
    const int64_t j0 = block + from;
    if (bf16_) {
      bf16_scores(h, i, rows, from, cols, scores, ld, w);
    } else {
      const auto [queries, ldq] = query_rows(h, i, w);
      cpu::gemm<T>(false, false, rows, cols, p_.d, 1, queries, ldq, w.keys_t + from, p_.block, 0,
                   scores, ld);
    }
    cpu::prepare_scores<T>(p_, mask_at_, h, i, rows, j0, cols, scores, ld, nullptr,
                           relative_.defined() ? relative_.data_ptr<T>() : nullptr);
    if (partial) blocks_.hide(h, i, rows, j0, cols, scores, ld);
    cpu::online_softmax_step(scores, rows, cols, ld, p_.bounded_right(), seen, state.max, state.sum,
                             state.acc, p_.dv, state.acc_ld);
    if (bf16_) {
      bf16_values(rows, from, cols, scores, ld, state, w);
    } else {
      const auto [values, ldv] = value_rows(kv, j0, from, w);
      cpu::gemm<T>(false, false, rows, p_.dv, cols, 1, scores, ld, values, ldv, 1, state.acc,
                   state.acc_ld, w.product);
    }
  }

  // The scores of queries [i, i + rows) of head h against the key block's keys from `from` on the
  // bfloat16 products, the scale applied to the sums.
  void bf16_scores(int64_t h, int64_t i, int64_t rows, int64_t from, int64_t cols, T* scores,
                   int64_t ld, const TileBuffers& w) const {
    if constexpr (kBf16) {
      bf16_->product(rows, cols, p_.d, static_cast<float>(p_.scale), bits(q_.row(h, i)),
                     q_.row_stride, w.key_pairs() + from, p_.block, false, scores, ld);
    }
  }

  // The tile's probabilities, rounded to bfloat16, weighting the key block's values from `from` on
  // the bfloat16 products, added to the rows' accumulated values.
  void bf16_values(int64_t rows, int64_t from, int64_t cols, const T* scores, int64_t ld,
                   const Rows& state, const TileBuffers& w) const {
    if constexpr (kBf16) {
      // `from` is a multiple of the granule, so its keys start a pair row.
      bf16_->round(scores, ld, rows, cols, w.probabilities, p_.block);
      bf16_->product(rows, p_.dv, cols, 1, w.probabilities, p_.block,
                     w.value_pairs + from / 2 * p_.dv, p_.dv, true, state.acc, state.acc_ld);
    }
  }

  // The float rows the products read for query row i of head h, and their stride: the queries
  // themselves, or bfloat16 queries widened (the group's, in the thread's rows).
  std::pair<const T*, int64_t> query_rows(int64_t h, int64_t i, const TileBuffers& w) const {
    if constexpr (kBf16) {
      return {w.queries + (i - w.queries_from) * p_.d, p_.d};
    } else {
      return {q_.row(h, i), q_.row_stride};
    }
  }

  // The same for the values of keys from j0 = the key block's first + `from`.
  std::pair<const T*, int64_t> value_rows(int64_t kv, int64_t j0, int64_t from,
                                          const TileBuffers& w) const {
    if constexpr (kBf16) {
      return {w.values + from * p_.dv, p_.dv};
    } else {
      return {v_.row(kv, j0), v_.row_stride};
    }
  }

  const Problem& p_;
  // The bfloat16 products for bfloat16 inputs, where the processor has them (else nullptr).
  const cpu::Bf16Products* bf16_ = kBf16 ? cpu::bf16_products() : nullptr;
  Matrices<In> q_, k_, v_;
  Matrices<Out> out_;
  T* lse_;
  int64_t lse_ld_;
  std::vector<int64_t> mask_at_;
  cpu::MaskBlocks blocks_;
  Tensor relative_;  // relative_bias_by_position, undefined without a table
};

// A packed problem: each sequence's query blocks as a one-sequence Forward computes them. Work
// items are (sequence, query head, up to four query blocks), taken dearest first.
template <typename T, typename In>
void run_packed(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const Tensor& lse) {
  const Sequences& sequences = *p.sequences;
  const Matrices<In> queries(q), keys(k), values(v);
  const Matrices<typename Forward<T, In>::Out> outputs(out);
  T* lse_data = lse.defined() ? lse.data_ptr<T>() : nullptr;
  const int64_t threads = at::get_num_threads();
  int64_t blocks = 0;
  for (int64_t s = 0; s < sequences.count(); ++s) {
    blocks += (sequences.queries(s) + p.block - 1) / p.block;
  }
  const int64_t group =
      std::clamp<int64_t>(p.n * p.g * blocks / (8 * threads), 1, Forward<T, In>::kMaxGroup);
  const Tensor relative = relative_bias_by_position(p, c10::CppTypeToScalarType<T>::value);

  struct Item {
    int64_t part, h, first, count;
    double cost;
  };
  std::vector<Problem> problems;  // each part's problem, which its Forward refers to
  std::vector<Forward<T, In>> parts;
  problems.reserve(sequences.count());
  parts.reserve(sequences.count());
  std::vector<Item> items;
  for (int64_t s = 0; s < sequences.count(); ++s) {
    const int64_t t_q = sequences.queries(s);
    if (t_q == 0) continue;
    const int64_t q0 = sequences.query_begin(s), k0 = sequences.key_begin(s);
    problems.push_back(p.sequence(s));
    const Problem& one = problems.back();
    parts.emplace_back(one, queries.from_row(q0), keys.from_row(k0), values.from_row(k0),
                       outputs.from_row(q0), lse_data ? lse_data + q0 : nullptr, p.t_q, relative);
    const int64_t part = static_cast<int64_t>(parts.size()) - 1;
    const int64_t sequence_blocks = (t_q + p.block - 1) / p.block;
    for (int64_t first = 0; first < sequence_blocks; first += group) {
      const int64_t count = std::min(group, sequence_blocks - first);
      double cost = 0;  // the pairs of scores, and the output rows that are written either way
      for (int64_t b = first; b < first + count; ++b) {
        const int64_t rows = std::min(p.block, t_q - b * p.block);
        cost += cpu::block_pairs(one, b * p.block, rows) + static_cast<double>(rows);
      }
      for (int64_t h = 0; h < p.n * p.g; ++h) items.push_back({part, h, first, count, cost});
    }
  }
  cpu::run_dearest_first(
      items, [&] { return typename Forward<T, In>::TileBuffers(p, group); },
      [&](const Item& item, typename Forward<T, In>::TileBuffers& w) {
        parts[item.part].query_blocks(item.h, item.first, item.count, w);
      });
}

// The forward of `p` into `out` (and `lse`, where defined), both of T, from inputs of In.
template <typename T, typename In = T>
void run(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
         Tensor& lse) {
  if (p.packed()) {
    run_packed<T, In>(p, q, k, v, out, lse);
  } else {
    Forward<T, In>(p, q, k, v, out, lse).run();
  }
}

}  // namespace

bool fused_cpu_applies(const Tensor& query) {
  const auto dtype = query.scalar_type();
  return query.device().is_cpu() &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

std::pair<Tensor, Tensor> cpu_forward(const Problem& p, const Tensor& query, const Tensor& key,
                                      const Tensor& value, bool with_lse) {
  if (cpu::widened_to_float(query)) {
    // The inputs are read as they are; the output is summed in float and rounded once.
    const Problem float_problem = cpu::with_float_mask(p);
    const Tensor q = cpu::rows_contiguous(query), k = cpu::rows_contiguous(key),
                 v = cpu::rows_contiguous(value);
    auto sizes = q.sizes().vec();
    sizes.back() = p.dv;
    Tensor out = cpu::empty_in_layout_of(q, sizes);
    Tensor lse =
        with_lse ? torch::empty({p.n, p.g, p.t_q}, q.options().dtype(at::kFloat)) : Tensor();
    run<float, c10::BFloat16>(float_problem, q, k, v, out, lse);
    return {out, lse};
  }
  const Tensor q = cpu::rows_contiguous(query), k = cpu::rows_contiguous(key),
               v = cpu::rows_contiguous(value);
  auto sizes = q.sizes().vec();
  sizes.back() = p.dv;
  Tensor out = cpu::empty_in_layout_of(q, sizes);
  Tensor lse = with_lse ? torch::empty({p.n, p.g, p.t_q}, q.options()) : Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention::kernels::cpu_forward",
                             [&] { run<scalar_t>(p, q, k, v, out, lse); });
  return {out, lse};
}

}  // namespace kernels
}  // namespace attention
