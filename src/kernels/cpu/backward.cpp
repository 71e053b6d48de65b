// The chunked backward on the CPU, fused (FlashAttention-2's backward). Each work item owns one
// key/value head and a set of its key blocks: for each key block it walks every query block of
// every query head of the group that can see it, rebuilds the tile's probabilities from the saved
// log-sum-exp, and accumulates the key and value gradients of the block in place, so no two
// threads ever write the same key row and no atomics are needed. Query gradients accumulate in
// the item's own rows: one item per key/value head when there are enough heads for the threads,
// otherwise the key blocks of a head are split between items, each with its own copy of the
// query gradients, summed at the end (one extra copy per split, at most one per thread).
// Tiles above the causal diagonal are skipped; each tile is five products (gemm/blas.h; the key
// block's keys and values transposed once for all of its tiles) and two vectorized element-wise
// passes over a block of scores that stays in the cache.
//
// bfloat16 takes the processor's bfloat16 products where it has them (kernels/cpu/bf16_products.h),
// as the forward does. Their right operand is kept in pairs along the contracted dimension, so the
// products that contract over queries (the key and value gradients) are computed transposed, as
// Q^T dS and dO^T P, into float buffers of the key block that are turned into its gradient rows
// once at its end; queries and output gradients are transposed once per call for them. The
// probabilities and score gradients are rounded to bfloat16 once per tile; every sum is in float.

#include "kernels/chunked.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/tile.h"
#include "memory/empty_large.h"
#include "memory/tile_pool.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace attention {
namespace kernels {
namespace {

using cpu::bits;
using torch::Tensor;

// The probabilities of a tile of rows x cols scaled scores `s` (row stride cols), of which row r
// sees its first valid + r columns when causal (all of them otherwise), from the rows' log-sum-exp
// `lse`. A hidden key (masked to -inf, or beyond the causal limit, which is marked -inf in `s`
// here) gets probability 0 even in a row whose log-sum-exp is NaN; visible keys of such a row get
// NaN, as the whole-matrix softmax gives.
template <typename T>
ATTENTION_ALWAYS_INLINE void probabilities(T* s, T* prob, int64_t rows, int64_t cols, bool causal,
                                           int64_t valid, const T* lse) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* score = s + r * cols;
    T* pr = prob + r * cols;
    const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
    const T row_lse = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < seen; ++j) {
      const T x = score[j] - row_lse;
      const T e = cpu::exp_nonpositive(x);
      pr[j] = score[j] == -kInf ? T(0) : (x != x ? x : e);
    }
    std::fill(score + seen, score + cols, -kInf);
    std::fill(pr + seen, pr + cols, T(0));
  }
}

// The gradient of the tile's scaled scores times the scale, written over the gradient of its
// probabilities `dp`: scale * prob * (dp - delta) row by row, 0 at hidden keys (where delta may
// be NaN). With the scale in it, it is the gradient of the products q . k, and the two products
// that take it need no alpha (which the small-product route cannot apply).
template <typename T>
ATTENTION_ALWAYS_INLINE void score_gradients(const T* s, const T* prob, T* dp, int64_t rows,
                                             int64_t cols, const T* delta, T scale) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const T* score = s + r * cols;
    const T* pr = prob + r * cols;
    T* g = dp + r * cols;
    const T row_delta = delta[r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      g[j] = score[j] == -kInf ? T(0) : pr[j] * (g[j] - row_delta) * scale;
    }
  }
}

ATTENTION_MULTIVERSION void probabilities_f32(float* s, float* prob, int64_t rows, int64_t cols,
                                              bool causal, int64_t valid, const float* lse) {
  probabilities(s, prob, rows, cols, causal, valid, lse);
}

ATTENTION_MULTIVERSION void score_gradients_f32(const float* s, const float* prob, float* dp,
                                                int64_t rows, int64_t cols, const float* delta,
                                                float scale) {
  score_gradients(s, prob, dp, rows, cols, delta, scale);
}

void dispatch_probabilities(float* s, float* prob, int64_t rows, int64_t cols, bool causal,
                            int64_t valid, const float* lse) {
  if (const cpu::SoftmaxPasses* passes = cpu::softmax_passes()) {
    passes->probabilities(s, prob, rows, cols, causal, valid, lse);
    return;
  }
  probabilities_f32(s, prob, rows, cols, causal, valid, lse);
}

void dispatch_probabilities(double* s, double* prob, int64_t rows, int64_t cols, bool causal,
                            int64_t valid, const double* lse) {
  probabilities(s, prob, rows, cols, causal, valid, lse);
}

void dispatch_score_gradients(const float* s, const float* prob, float* dp, int64_t rows,
                              int64_t cols, const float* delta, float scale) {
  score_gradients_f32(s, prob, dp, rows, cols, delta, scale);
}

void dispatch_score_gradients(const double* s, const double* prob, double* dp, int64_t rows,
                              int64_t cols, const double* delta, double scale) {
  score_gradients(s, prob, dp, rows, cols, delta, scale);
}

// How many items share the key blocks of one key/value head: one when the heads alone keep
// every thread busy, else enough to give each thread about two items.
int64_t splits_per_head(const Problem& p, int64_t key_blocks) {
  const int64_t threads = at::get_num_threads();
  if (p.n >= 2 * threads) return 1;
  return std::clamp<int64_t>(std::min(threads, (2 * threads + p.n - 1) / p.n), 1, key_blocks);
}

// delta: each query row's dot product of its output and output gradient, (N * G, Tq), without
// a temporary of the output's size.
// T: delta's type; In: the output's and its gradient's (bfloat16, summed in float).
template <typename T, typename In = T>
void output_dots(const Problem& p, const Tensor& out, const Tensor& grad_out, Tensor& delta) {
  const cpu::Matrices<In> o(out), g(grad_out);
  T* d = delta.data_ptr<T>();
  at::parallel_for(0, p.n * p.g * p.t_q, 256, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const In* a = o.row(row / p.t_q, row % p.t_q);
      const In* b = g.row(row / p.t_q, row % p.t_q);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < p.dv; ++c) sum += static_cast<T>(a[c]) * static_cast<T>(b[c]);
      d[row] = sum;
    }
  });
}

// What a bfloat16 call prepares once for every key block: on the bfloat16 products the queries and
// the output gradient transposed (last two dims swapped, contiguous), without them the two
// widened to float (each is read by every key block; keys and values are widened where the key
// block is turned). Undefined where unused.
struct Prepared {
  Tensor queries_t, upstream_t, queries, upstream;
};

// T: the scores, gradients and states. In: the queries, keys, values and output gradient, T itself
// or bfloat16 (then T is float, and the gradients are summed in float). bfloat16 takes the
// processor's bfloat16 products where it has them; elsewhere the float products, on the prepared
// widened queries and output gradient and on each key block's keys and values widened as they
// are turned (the sums of widening every tensor first, without the copies of the others).
template <typename T, typename In = T>
class Backward {
  static constexpr bool kBf16 = !std::is_same<T, In>::value;
  static_assert(!kBf16 || (std::is_same<T, float>::value && std::is_same<In, c10::BFloat16>::value),
                "bfloat16 inputs are worked on in float");

 public:
  // The key and value gradients' type: for bfloat16 inputs each key block's are summed in float
  // (in the thread's buffers) and rounded once into the caller's bfloat16 tensors, so no float
  // tensor of them is made and converted.
  using Grad = std::conditional_t<kBf16, In, T>;

  // lse and delta: (N * G, Tq), contiguous; dq_parts: one tensor per split shaped as q, zeros;
  // dk and dv shaped as k and v, every row written here. Gradients have contiguous rows.
  Backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
           const Tensor& grad_out, const Tensor& lse, const Tensor& delta,
           const std::vector<Tensor>& dq_parts, const Tensor& dk, const Tensor& dv,
           const Prepared& prepared = {})
      : p_(p),
        q_(q),
        k_(k),
        v_(v),
        go_(grad_out),
        q_t_(cpu::Matrices<In>::of(prepared.queries_t)),
        go_t_(cpu::Matrices<In>::of(prepared.upstream_t)),
        q_wide_(cpu::Matrices<T>::of(prepared.queries)),
        go_wide_(cpu::Matrices<T>::of(prepared.upstream)),
        lse_(lse.data_ptr<T>()),
        delta_(delta.data_ptr<T>()),
        dq_(dq_parts.begin(), dq_parts.end()),
        dk_(dk),
        dv_(dv),
        splits_(static_cast<int64_t>(dq_parts.size())),
        row_ld_(p.t_q),
        blocks_(p),
        relative_(relative_bias_by_position(p, c10::CppTypeToScalarType<T>::value)) {
    if (p.mask.defined()) mask_at_ = cpu::matrix_offsets(p.mask);
    if (relative_.defined()) relative_sum_ = torch::zeros_like(relative_);
  }

  // The gradient of the bias by relative position, (H, relative_count()), once run() has run;
  // undefined without a table.
  Tensor relative_gradient() const { return relative_sum_; }

  // One sequence of a packed problem: its matrices (and each split's query gradients) start at
  // its first query and key row, and its rows of the log-sum-exp and of delta lie row_ld apart.
  // `relative`: the packed problem's relative_bias_by_position, which every sequence shares (its
  // gradient is summed from the threads' buffers by the caller).
  struct Sequence {
    cpu::Matrices<In> q, k, v, grad_out, q_t, grad_out_t;
    cpu::Matrices<T> q_wide, grad_out_wide;
    const T *lse, *delta;
    int64_t row_ld;
    std::vector<cpu::Matrices<T>> dq_parts;
    cpu::Matrices<Grad> dk, dv;
    Tensor relative;
  };

  // `one` is the sequence's problem (Problem::sequence).
  Backward(const Problem& one, Sequence s)
      : p_(one),
        q_(std::move(s.q)),
        k_(std::move(s.k)),
        v_(std::move(s.v)),
        go_(std::move(s.grad_out)),
        q_t_(std::move(s.q_t)),
        go_t_(std::move(s.grad_out_t)),
        q_wide_(std::move(s.q_wide)),
        go_wide_(std::move(s.grad_out_wide)),
        lse_(s.lse),
        delta_(s.delta),
        dq_(std::move(s.dq_parts)),
        dk_(std::move(s.dk)),
        dv_(std::move(s.dv)),
        splits_(static_cast<int64_t>(dq_.size())),
        row_ld_(s.row_ld),
        blocks_(one),
        relative_(std::move(s.relative)) {}

  void run() {
    at::parallel_for(0, p_.n * splits_, 1, [&](int64_t begin, int64_t end) {
      TileBuffers w(p_);
      for (int64_t item = begin; item < end; ++item) keys(item / splits_, item % splits_, w);
      if (!w.relative_grad.empty()) {
        // Each range of items kept its own gradient by relative position: added once, in turn.
        std::lock_guard<std::mutex> lock(*relative_mutex_);
        T* sum = relative_sum_.data_ptr<T>();
        for (size_t e = 0; e < w.relative_grad.size(); ++e) sum[e] += w.relative_grad[e];
      }
    });
  }

  int64_t key_blocks() const { return (p_.t_k + p_.block - 1) / p_.block; }

  // One thread's tiles, from memory kept between calls: scores, probabilities, the gradient of
  // the probabilities (then of the scores), with soft-capping the cap's slope, the key block's
  // with a score modification the scores it was applied to, the key block's keys (scaled) and
  // values transposed, and a product before it is added to a gradient. For bfloat16 inputs the
  // block's key and value gradients in float (transposed on the bfloat16 products), and on the
  // bfloat16 products: the block's keys and values in pair rows of their features (where the
  // transposed ones would be), its keys in pair rows of keys (from key 0 and from key 1, for
  // strips that start at an odd key), a tile's probabilities and score gradients rounded (score
  // gradients in rows and in pair rows), and the gradients rounded; without them the block's keys
  // widened.
  struct TileBuffers {
    cpu::TileLease lease;
    T *s, *prob, *dp, *cap_slope, *score_in, *keys_t, *values_t, *product;
    uint32_t *key_rows[2] = {nullptr, nullptr}, *prob_pairs = nullptr, *ds_pairs = nullptr;
    uint16_t *ds = nullptr, *rounded = nullptr;
    T *dk_t = nullptr, *dv_t = nullptr;
    T* keys = nullptr;
    // With a relative bias: the gradient of its bias by relative position from these tiles.
    std::vector<T> relative_grad;
    explicit TileBuffers(const Problem& p)
        : lease((3 + (p.softcap > 0.0) + static_cast<bool>(p.score_mod)) *
                    cpu::TileLease::tile_bytes<T>(p.block * p.block) +
                cpu::TileLease::tile_bytes<T>(p.d * p.block) +
                cpu::TileLease::tile_bytes<T>(p.dv * p.block) +
                cpu::TileLease::tile_bytes<T>(p.block * std::max(p.d, p.dv)) + low_input_bytes(p)),
          s(lease.take<T>(p.block * p.block)),
          prob(lease.take<T>(p.block * p.block)),
          dp(lease.take<T>(p.block * p.block)),
          cap_slope(p.softcap > 0.0 ? lease.take<T>(p.block * p.block) : nullptr),
          score_in(p.score_mod ? lease.take<T>(p.block * p.block) : nullptr),
          keys_t(lease.take<T>(p.d * p.block)),
          values_t(lease.take<T>(p.dv * p.block)),
          product(lease.take<T>(p.block * std::max(p.d, p.dv))),
          relative_grad(p.relative_bias.defined()
                            ? static_cast<size_t>(p.heads * p.relative_count())
                            : size_t{0},
                        T(0)) {
      if (!kBf16) return;
      dk_t = lease.take<T>(p.d * p.block);
      dv_t = lease.take<T>(p.dv * p.block);
      if (cpu::bf16_products() == nullptr) {
        keys = lease.take<T>(p.block * p.d);
      } else {
        for (auto*& rows : key_rows) rows = lease.take<uint32_t>(pair_rows(p) * p.d);
        prob_pairs = lease.take<uint32_t>(pair_rows(p) * p.block);
        ds_pairs = lease.take<uint32_t>(pair_rows(p) * p.block);
        ds = lease.take<uint16_t>(p.block * p.block);
        rounded = lease.take<uint16_t>(std::max(p.d, p.dv) * p.block);
      }
    }
    static int64_t pair_rows(const Problem& p) { return (p.block + 1) / 2; }
    static size_t low_input_bytes(const Problem& p) {
      if (!kBf16) return 0;
      const size_t sums = cpu::TileLease::tile_bytes<T>(p.d * p.block) +
                          cpu::TileLease::tile_bytes<T>(p.dv * p.block);
      if (cpu::bf16_products() == nullptr)
        return sums + cpu::TileLease::tile_bytes<T>(p.block * p.d);
      return sums + 2 * cpu::TileLease::tile_bytes<uint32_t>(pair_rows(p) * p.d) +
             2 * cpu::TileLease::tile_bytes<uint32_t>(pair_rows(p) * p.block) +
             cpu::TileLease::tile_bytes<uint16_t>(p.block * p.block) +
             cpu::TileLease::tile_bytes<uint16_t>(std::max(p.d, p.dv) * p.block);
    }
    // The block's keys and values in pair rows of their features: they fit the transposed ones.
    uint32_t* key_pairs() const { return reinterpret_cast<uint32_t*>(keys_t); }
    uint32_t* value_pairs() const { return reinterpret_cast<uint32_t*>(values_t); }
  };

  // The key blocks split, split + splits, ... of key/value head kv.
  void keys(int64_t kv, int64_t split, TileBuffers& w) const {
    for (int64_t b = split; b < key_blocks(); b += splits_) {
      key_block(kv, b * p_.block, dq_[split], w);
    }
  }

 private:
  // Keys [j0, j0 + block) of key/value head kv: their gradients, from every query that sees them.
  void key_block(int64_t kv, int64_t j0, const cpu::Matrices<T>& dq, TileBuffers& w) const {
    const int64_t cols = std::min(p_.block, p_.t_k - j0);
    if constexpr (kBf16) {
      if (bf16_) {
        turn_bf16(kv, j0, cols, w);
      } else {
        turn_widened(kv, j0, cols, w);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        std::fill_n(dk_.row(kv, j0 + c), p_.d, T(0));
        std::fill_n(dv_.row(kv, j0 + c), p_.dv, T(0));
      }
      // Turned once for every query block that sees them: the scores and the probabilities'
      // gradient then read both operands along rows.
      cpu::transpose_scaled<T>(k_.row(kv, j0), k_.row_stride, cols, p_.d, static_cast<T>(p_.scale),
                               w.keys_t, p_.block);
      cpu::transpose_scaled<T>(v_.row(kv, j0), v_.row_stride, cols, p_.dv, T(1), w.values_t,
                               p_.block);
    }
    // The queries that see a key of the block (causal: query i sees keys j <= i + diagonal;
    // a window: keys j >= i + left_diagonal).
    // With a block mask, query blocks lie on the lattice of block multiples, as the forward's
    // (rows above the first that sees a key of the block see none of it: the strips skip them).
    int64_t first = queries_begin(p_, j0);
    if (blocks_.defined()) first -= first % p_.block;
    const int64_t last = queries_end(p_, j0, cols);
    for (int64_t h = kv * p_.g; h < (kv + 1) * p_.g; ++h) {
      for (int64_t i0 = first; i0 < last; i0 += p_.block) {
        const int64_t rows = std::min(p_.block, last - i0);
        // A block mask's empty tile is skipped, a full one masks nothing, a partial one its pairs.
        const auto visibility = blocks_.tile(h, i0, rows, j0, cols);
        if (visibility == BlockMask::Block::Empty) continue;
        const bool partial = visibility == BlockMask::Block::Partial;
        // Where the diagonal or the window's left edge crosses the tile, it is done in strips of
        // rows, each only over the keys its rows see.
        const int64_t strip =
            cpu::crosses_edge(p_, i0, rows, j0, cols) ? cpu::kDiagonalStrip : rows;
        for (int64_t r0 = 0; r0 < rows; r0 += strip) {
          const int64_t sr = std::min(strip, rows - r0);
          const auto c = cpu::strip_columns(p_, i0 + r0, sr, j0, cols);
          if (c.end > c.begin) {
            tile(h, kv, i0 + r0, sr, j0, c.begin, c.end - c.begin, partial, dq, w);
          }
        }
      }
    }
    if constexpr (kBf16) round_key_gradients(kv, j0, cols, w);
  }

  // The key block of `cols` keys from j0 as the bfloat16 products read it, once for every query
  // block that sees it, and its transposed gradients zeroed.
  void turn_bf16(int64_t kv, int64_t j0, int64_t cols, TileBuffers& w) const {
    const uint16_t* keys = bits(k_.row(kv, j0));
    bf16_->pack_column_pairs(keys, k_.row_stride, cols, p_.d, w.key_pairs(), p_.block);
    bf16_->pack_column_pairs(bits(v_.row(kv, j0)), v_.row_stride, cols, p_.dv, w.value_pairs(),
                             p_.block);
    cpu::pack_row_pairs(keys, k_.row_stride, cols, p_.d, w.key_rows[0], p_.d);
    if (cols > 1) {  // paired from key 1, for strips that start at an odd key
      cpu::pack_row_pairs(keys + k_.row_stride, k_.row_stride, cols - 1, p_.d, w.key_rows[1], p_.d);
    }
    std::fill_n(w.dk_t, p_.d * p_.block, T(0));
    std::fill_n(w.dv_t, p_.dv * p_.block, T(0));
  }

  // The same without the bfloat16 products: the float kernel's transposed keys and values, and
  // the keys' rows, widened as they are turned; the block's gradients zeroed in float rows.
  void turn_widened(int64_t kv, int64_t j0, int64_t cols, TileBuffers& w) const {
    if constexpr (kBf16) {
      cpu::transpose_scaled<T, In>(k_.row(kv, j0), k_.row_stride, cols, p_.d,
                                   static_cast<T>(p_.scale), w.keys_t, p_.block);
      cpu::transpose_scaled<T, In>(v_.row(kv, j0), v_.row_stride, cols, p_.dv, T(1), w.values_t,
                                   p_.block);
      cpu::widen_bf16_rows(bits(k_.row(kv, j0)), k_.row_stride, cols, p_.d, w.keys, p_.d);
      std::fill_n(w.dk_t, p_.d * p_.block, T(0));
      std::fill_n(w.dv_t, p_.dv * p_.block, T(0));
    }
  }

  // The key block's gradients, summed in float in the thread's buffers, rounded into the bfloat16
  // gradients: transposed on the bfloat16 products, in rows without them.
  void round_key_gradients(int64_t kv, int64_t j0, int64_t cols, TileBuffers& w) const {
    if constexpr (kBf16) {
      uint16_t* dk = bits(dk_.row(kv, j0));
      uint16_t* dv = bits(dv_.row(kv, j0));
      if (bf16_) {
        bf16_->round(w.dk_t, p_.block, p_.d, cols, w.rounded, p_.block);
        bf16_->transpose(w.rounded, p_.block, p_.d, cols, dk, dk_.row_stride);
        bf16_->round(w.dv_t, p_.block, p_.dv, cols, w.rounded, p_.block);
        bf16_->transpose(w.rounded, p_.block, p_.dv, cols, dv, dv_.row_stride);
        return;
      }
      cpu::round_to_bf16_rows(w.dk_t, p_.d, cols, p_.d, dk, dk_.row_stride);
      cpu::round_to_bf16_rows(w.dv_t, p_.dv, cols, p_.dv, dv, dv_.row_stride);
    }
  }

  // Float rows of a tile's operands, and their row stride: the inputs and gradients themselves,
  // or for bfloat16 inputs without the bfloat16 products the widened queries and output gradient,
  // the key block's widened keys and its gradients' float sums in the thread's rows.
  struct FloatRows {
    const T *q = nullptr, *go = nullptr, *k = nullptr;
    int64_t q_ld = 0, go_ld = 0, k_ld = 0;
    T *dk = nullptr, *dv = nullptr;
    int64_t dk_ld = 0, dv_ld = 0;
  };

  // Those of queries from i0 of head h and keys from j0 = the key block's first + `first`.
  FloatRows float_rows(int64_t h, int64_t kv, int64_t i0, int64_t j0, int64_t first,
                       const TileBuffers& w) const {
    FloatRows f;
    if constexpr (kBf16) {
      f.q = q_wide_.row(h, i0);
      f.q_ld = q_wide_.row_stride;
      f.go = go_wide_.row(h, i0);
      f.go_ld = go_wide_.row_stride;
      f.k = w.keys + first * p_.d;
      f.k_ld = p_.d;
      f.dk = w.dk_t + first * p_.d;
      f.dk_ld = p_.d;
      f.dv = w.dv_t + first * p_.dv;
      f.dv_ld = p_.dv;
    } else {
      (void)first;
      (void)w;
      f.q = q_.row(h, i0);
      f.q_ld = q_.row_stride;
      f.go = go_.row(h, i0);
      f.go_ld = go_.row_stride;
      f.k = k_.row(kv, j0);
      f.k_ld = k_.row_stride;
      f.dk = dk_.row(kv, j0);
      f.dk_ld = dk_.row_stride;
      f.dv = dv_.row(kv, j0);
      f.dv_ld = dv_.row_stride;
    }
    return f;
  }

  // Queries [i0, i0 + rows) of query head h against keys [block + first, block + first + cols)
  // of head kv, the key block whose transposed keys and values `w` holds. `partial`: the block
  // mask hides some of the tile's pairs.
  void tile(int64_t h, int64_t kv, int64_t i0, int64_t rows, int64_t block, int64_t first,
            int64_t cols, bool partial, const cpu::Matrices<T>& dq, TileBuffers& w) const {
    const T scale = static_cast<T>(p_.scale);
    const int64_t j0 = block + first;
    T *s = w.s, *prob = w.prob, *dp = w.dp, *cap_slope = w.cap_slope;
    FloatRows f{};
    if (bf16_) {
      bf16_scores(h, i0, rows, first, cols, w);
    } else {
      f = float_rows(h, kv, i0, j0, first, w);
      cpu::gemm<T>(false, false, rows, cols, p_.d, 1, f.q, f.q_ld, w.keys_t + first, p_.block, 0, s,
                   cols);
    }
    cpu::prepare_scores<T>(p_, mask_at_, h, i0, rows, j0, cols, s, cols, cap_slope,
                           relative_.defined() ? relative_.data_ptr<T>() : nullptr, w.score_in);
    if (partial) blocks_.hide(h, i0, rows, j0, cols, s, cols);
    dispatch_probabilities(s, prob, rows, cols, p_.bounded_right(), i0 + 1 + p_.diagonal() - j0,
                           lse_ + h * row_ld_ + i0);
    // dV^T += dO^T P, dP = dO V^T.
    if (bf16_) {
      bf16_value_products(h, i0, rows, first, cols, w);
    } else {
      cpu::gemm<T>(true, false, cols, p_.dv, rows, 1, prob, cols, f.go, f.go_ld, 1, f.dv, f.dv_ld,
                   w.product);
      cpu::gemm<T>(false, false, rows, cols, p_.dv, 1, f.go, f.go_ld, w.values_t + first, p_.block,
                   0, dp, cols);
    }
    // With a relative bias or a score modification the gradient of the scores themselves is
    // wanted first: the scale is applied after the bias's gradient by relative position has
    // taken it, and after the modification's derivative.
    const bool relative = relative_.defined(), modified = p_.score_mod.has_value();
    dispatch_score_gradients(s, prob, dp, rows, cols, delta_ + h * row_ld_ + i0,
                             relative || modified ? T(1) : scale);
    if (relative) {
      T* grad = w.relative_grad.data() + (h % p_.heads) * p_.relative_count() - p_.relative_first;
      cpu::accumulate_relative_bias(dp, cols, grad + j0 - (i0 + p_.query_offset), rows,
                                    modified ? T(1) : scale);
    }
    if (modified) cpu::modify_gradients(p_, h, i0, rows, j0, cols, w.score_in, s, dp, scale);
    if (cap_slope) {  // through softcap * tanh(s / softcap)
      for (int64_t e = 0; e < rows * cols; ++e) dp[e] *= cap_slope[e];
    }
    // dQ += dS K, dK += dS^T Q.
    if (bf16_) {
      bf16_key_products(h, i0, rows, first, cols, dq, w);
    } else {
      cpu::gemm<T>(false, false, rows, p_.d, cols, 1, dp, cols, f.k, f.k_ld, 1, dq.row(h, i0),
                   dq.row_stride, w.product);
      cpu::gemm<T>(true, false, cols, p_.d, rows, 1, dp, cols, f.q, f.q_ld, 1, f.dk, f.dk_ld,
                   w.product);
    }
  }

  // The tile's scores on the bfloat16 products, the scale applied to the sums.
  void bf16_scores(int64_t h, int64_t i0, int64_t rows, int64_t first, int64_t cols,
                   TileBuffers& w) const {
    if constexpr (kBf16) {
      bf16_->product(rows, cols, p_.d, static_cast<float>(p_.scale), bits(q_.row(h, i0)),
                     q_.row_stride, w.key_pairs() + first, p_.block, false, w.s, cols);
    }
  }

  // dV^T += dO^T P and dP = dO V^T on the bfloat16 products.
  void bf16_value_products(int64_t h, int64_t i0, int64_t rows, int64_t first, int64_t cols,
                           TileBuffers& w) const {
    if constexpr (kBf16) {
      bf16_->round_row_pairs(w.prob, cols, rows, cols, w.prob_pairs, cols);
      bf16_->product(p_.dv, cols, rows, 1, bits(go_t_.row(h, 0) + i0), go_t_.row_stride,
                     w.prob_pairs, cols, true, w.dv_t + first, p_.block);
      bf16_->product(rows, cols, p_.dv, 1, bits(go_.row(h, i0)), go_.row_stride,
                     w.value_pairs() + first, p_.block, false, w.dp, cols);
    }
  }

  // dQ += dS K (the keys paired from the strip's first key) and dK^T += Q^T dS on the bfloat16
  // products.
  void bf16_key_products(int64_t h, int64_t i0, int64_t rows, int64_t first, int64_t cols,
                         const cpu::Matrices<T>& dq, TileBuffers& w) const {
    if constexpr (kBf16) {
      bf16_->round_both(w.dp, cols, rows, cols, w.ds, cols, w.ds_pairs, cols);
      bf16_->product(rows, p_.d, cols, 1, w.ds, cols, w.key_rows[first % 2] + first / 2 * p_.d,
                     p_.d, true, dq.row(h, i0), dq.row_stride);
      bf16_->product(p_.d, cols, rows, 1, bits(q_t_.row(h, 0) + i0), q_t_.row_stride, w.ds_pairs,
                     cols, true, w.dk_t + first, p_.block);
    }
  }

  const Problem& p_;
  // The bfloat16 products for bfloat16 inputs, where the processor has them (else nullptr).
  const cpu::Bf16Products* bf16_ = kBf16 ? cpu::bf16_products() : nullptr;
  cpu::Matrices<In> q_, k_, v_, go_;
  // On the bfloat16 products: the queries and the output gradient transposed (features by rows);
  // for bfloat16 without them, the two widened.
  cpu::Matrices<In> q_t_, go_t_;
  cpu::Matrices<T> q_wide_, go_wide_;
  const T* lse_;
  const T* delta_;
  std::vector<cpu::Matrices<T>> dq_;
  cpu::Matrices<Grad> dk_, dv_;
  int64_t splits_;
  int64_t row_ld_;
  std::vector<int64_t> mask_at_;
  cpu::MaskBlocks blocks_;
  Tensor relative_;  // relative_bias_by_position, undefined without a table
  // The sum of the items' gradients by relative position, and the lock that guards it.
  Tensor relative_sum_;
  std::unique_ptr<std::mutex> relative_mutex_ = std::make_unique<std::mutex>();
};

// How many items share the key blocks of one sequence's key/value head in a packed problem: as
// splits_per_head, counting (sequence, key/value head) pairs for the heads.
int64_t packed_splits(const Problem& p) {
  const Sequences& sequences = *p.sequences;
  int64_t pairs = 0;
  for (int64_t s = 0; s < sequences.count(); ++s) {
    if (sequences.keys(s) > 0) pairs += p.n;
  }
  const int64_t threads = at::get_num_threads();
  if (pairs == 0 || pairs >= 2 * threads) return 1;
  const int64_t key_blocks = (sequences.max_keys + p.block - 1) / p.block;
  return std::clamp<int64_t>(std::min(threads, (2 * threads + pairs - 1) / pairs), 1, key_blocks);
}

// A packed problem: each sequence's key blocks as a one-sequence Backward computes them. Work
// items are (sequence, key/value head, split), taken dearest first from a shared counter. Every
// key row belongs to one sequence, so every row of dk and dv is written (zeros for a sequence
// without queries).
// Returns the gradient of the relative bias by relative position, summed over the threads'
// buffers; undefined without a table.
template <typename T, typename In>
Tensor run_packed(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& grad_out, const Tensor& lse, const Tensor& delta,
                  const std::vector<Tensor>& dq_parts, const Tensor& dk, const Tensor& dv,
                  const Prepared& prepared) {
  const Sequences& sequences = *p.sequences;
  const cpu::Matrices<In> queries(q), keys(k), values(v), upstream(grad_out);
  const cpu::Matrices<typename Backward<T, In>::Grad> key_grads(dk), value_grads(dv);
  const auto queries_t = cpu::Matrices<In>::of(prepared.queries_t),
             upstream_t = cpu::Matrices<In>::of(prepared.upstream_t);
  const auto queries_wide = cpu::Matrices<T>::of(prepared.queries),
             upstream_wide = cpu::Matrices<T>::of(prepared.upstream);
  const std::vector<cpu::Matrices<T>> query_grads(dq_parts.begin(), dq_parts.end());
  const int64_t splits = static_cast<int64_t>(dq_parts.size());
  struct Item {
    int64_t part, kv, split;
    double cost;
  };
  const Tensor relative = relative_bias_by_position(p, c10::CppTypeToScalarType<T>::value);
  std::vector<Problem> problems;  // each part's problem, which its Backward refers to
  std::vector<Backward<T, In>> parts;
  problems.reserve(sequences.count());
  parts.reserve(sequences.count());
  std::vector<Item> items;
  for (int64_t s = 0; s < sequences.count(); ++s) {
    if (sequences.keys(s) == 0) continue;
    const int64_t q0 = sequences.query_begin(s), k0 = sequences.key_begin(s);
    problems.push_back(p.sequence(s));
    const Problem& one = problems.back();
    std::vector<cpu::Matrices<T>> dq;
    for (const auto& part : query_grads) dq.push_back(part.from_row(q0));
    parts.emplace_back(
        one,
        typename Backward<T, In>::Sequence{
            queries.from_row(q0), keys.from_row(k0), values.from_row(k0), upstream.from_row(q0),
            queries_t.from_column(q0), upstream_t.from_column(q0), queries_wide.from_row(q0),
            upstream_wide.from_row(q0), lse.data_ptr<T>() + q0, delta.data_ptr<T>() + q0, p.t_q,
            std::move(dq), key_grads.from_row(k0), value_grads.from_row(k0), relative});
    const int64_t part = static_cast<int64_t>(parts.size()) - 1;
    // The pairs of scores of the sequence's query heads, shared by its splits, and the key rows
    // that are written either way.
    double pairs = 0;
    for (int64_t i0 = 0; i0 < one.t_q; i0 += p.block) {
      pairs += cpu::block_pairs(one, i0, std::min(p.block, one.t_q - i0));
    }
    const int64_t used = std::min(splits, parts.back().key_blocks());
    const double cost = (pairs * static_cast<double>(p.g) + static_cast<double>(one.t_k)) /
                        static_cast<double>(used);
    for (int64_t kv = 0; kv < p.n; ++kv) {
      for (int64_t split = 0; split < used; ++split) items.push_back({part, kv, split, cost});
    }
  }
  Tensor relative_sum = relative.defined() ? torch::zeros_like(relative) : Tensor();
  std::mutex relative_mutex;
  cpu::run_dearest_first(
      items, [&] { return typename Backward<T, In>::TileBuffers(p); },
      [&](const Item& item, typename Backward<T, In>::TileBuffers& w) {
        parts[item.part].keys(item.kv, item.split, w);
      },
      [&](typename Backward<T, In>::TileBuffers& w) {
        if (w.relative_grad.empty()) return;
        // Each thread kept its own gradient by relative position: added once, in turn.
        std::lock_guard<std::mutex> lock(relative_mutex);
        T* sum = relative_sum.data_ptr<T>();
        for (size_t e = 0; e < w.relative_grad.size(); ++e) sum[e] += w.relative_grad[e];
      });
  return relative_sum;
}

// `t` (bfloat16, rows contiguous) with its last two dims swapped, contiguous, in memory the
// large-buffer cache keeps between calls: each matrix transposed by the bfloat16 products' own
// transposition, a few times faster than LibTorch's copy of a transposed view.
Tensor transposed_matrices(const Tensor& t) {
  auto sizes = t.sizes().vec();
  const int64_t rows = sizes[sizes.size() - 2], cols = sizes[sizes.size() - 1];
  std::swap(sizes[sizes.size() - 1], sizes[sizes.size() - 2]);
  Tensor out = detail::empty_large(sizes, t.options());
  if (t.numel() == 0) return out;
  const cpu::Matrices<c10::BFloat16> from(t);
  uint16_t* to = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const cpu::Bf16Products* products = cpu::bf16_products();
  at::parallel_for(0, static_cast<int64_t>(from.at.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      products->transpose(cpu::bits(from.row(m, 0)), from.row_stride, rows, cols,
                          to + m * rows * cols, rows);
    }
  });
  return out;
}

// The gradients of `p` from inputs of In into dq_parts, dk and dv of T (see cpu_backward).
template <typename T, typename In = T>
void run(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
         const Tensor& go, const Tensor& lse_rows, const std::vector<Tensor>& dq_parts,
         const Tensor& dk, const Tensor& dv, Tensor* relative_grad) {
  Tensor delta = torch::empty({p.n * p.g, p.t_q}, q.options().dtype(lse_rows.scalar_type()));
  output_dots<T, In>(p, o, go, delta);
  // The bfloat16 products contract over queries with the queries and the output gradient
  // transposed; without them the float products read the two widened. Either is made once for
  // every key block, in memory the large-buffer cache keeps between calls.
  Prepared prepared;
  if constexpr (!std::is_same<T, In>::value) {
    if (cpu::bf16_products()) {
      prepared.queries_t = transposed_matrices(q);
      prepared.upstream_t = transposed_matrices(go);
    } else {
      prepared.queries = cpu::widened(q);
      prepared.upstream = cpu::widened(go);
    }
  }
  if (p.packed()) {
    const Tensor sum =
        run_packed<T, In>(p, q, k, v, go, lse_rows, delta, dq_parts, dk, dv, prepared);
    if (relative_grad) *relative_grad = sum;
  } else {
    Backward<T, In> backward(p, q, k, v, go, lse_rows, delta, dq_parts, dk, dv, prepared);
    backward.run();
    if (relative_grad) *relative_grad = backward.relative_gradient();
  }
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> cpu_backward(const Problem& p, const Tensor& query,
                                                const Tensor& key, const Tensor& value,
                                                const Tensor& out, const Tensor& lse,
                                                const Tensor& grad_out, Tensor* relative_grad) {
  const bool bf16 = cpu::widened_to_float(query);
  const Tensor q = cpu::rows_contiguous(query), k = cpu::rows_contiguous(key),
               v = cpu::rows_contiguous(value);
  const Tensor go = cpu::rows_contiguous(grad_out), o = cpu::rows_contiguous(out);
  const Tensor lse_rows = lse.reshape({p.n * p.g, p.t_q}).contiguous();
  const int64_t splits =
      p.packed() ? packed_splits(p) : splits_per_head(p, (p.t_k + p.block - 1) / p.block);
  // The gradients are fresh tensors on every call (autograd keeps them), in the memory layout
  // of their inputs: heads split from a (B, T, H * d) projection by a view get gradients that
  // fold back into it without a copy. Large ones on huge pages (cpu::empty_in_layout_of). For
  // bfloat16 the query gradients, summed over key blocks, are made in float and rounded once; the
  // key and value gradients are rounded as each key block's are done.
  const auto dtype = bf16 ? at::kFloat : q.scalar_type();
  std::vector<Tensor> dq_parts(splits);
  for (auto& part : dq_parts) part = cpu::empty_in_layout_of(q, q.sizes(), dtype).zero_();
  const Tensor dk = cpu::empty_in_layout_of(k, k.sizes());
  const Tensor dv = cpu::empty_in_layout_of(v, v.sizes());
  if (bf16) {
    run<float, c10::BFloat16>(cpu::with_float_mask(p), q, k, v, o, go, lse_rows, dq_parts, dk, dv,
                              relative_grad);
  } else {
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention::kernels::cpu_backward", [&] {
      run<scalar_t>(p, q, k, v, o, go, lse_rows, dq_parts, dk, dv, relative_grad);
    });
  }
  for (int64_t s = 1; s < splits; ++s) dq_parts[0].add_(dq_parts[s]);
  if (!bf16) return {dq_parts[0], dk, dv};
  return {cpu::converted(dq_parts[0], query.scalar_type()), dk, dv};
}

}  // namespace kernels
}  // namespace attention
