#pragma once

// What the fused CPU forward (kernels/cpu/forward.cpp) and backward (kernels/cpu/backward.cpp)
// share: reading strided heads in place, BLAS on raw row-major pointers, the user's mask on a tile,
// and an exp the compiler vectorizes.

#include "gemm/blas.h"
#include "kernels/cpu/exp.h"
#include "kernels/cpu/soft_cap.h"
#include "kernels/problem.h"
#include "platform/compiler.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

/// bfloat16 runs the float kernels: its inputs are widened once, the products and the softmax
/// accumulate in float, and the results are rounded once.
inline bool widened_to_float(const torch::Tensor& t) {
  return t.scalar_type() == at::kBFloat16;
}

/// `p` with an additive mask widened to float, for widened inputs.
Problem with_float_mask(const Problem& p);

/// `t` in `dtype`: `t` itself when it has it, else a copy in `t`'s memory layout whose memory,
/// when large, comes from the large-buffer cache (empty_in_layout_of): a fresh copy of each
/// input and result on every call would cost its page faults every time.
torch::Tensor converted(const torch::Tensor& t, at::ScalarType dtype);

/// out = t in out's dtype (the same sizes): the library's own conversion where bfloat16 and float
/// lie densely in the same order or are matrices of contiguous rows (a column block of a wider
/// matrix, say), LibTorch's copy_ elsewhere.
void copy_converted(torch::Tensor& out, const torch::Tensor& t);

/// The float copy of an input that widened_to_float().
inline torch::Tensor widened(const torch::Tensor& t) {
  return converted(t, at::kFloat);
}

/// `t` when each of its rows is contiguous, else a contiguous copy: BLAS reads rows through
/// their stride but wants the elements of a row next to each other.
inline torch::Tensor rows_contiguous(const torch::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

/// An uninitialized tensor of `sizes` whose dims lie in memory in the order of `like`'s strides
/// (its last dim last), large ones on huge pages: outputs written in their input's layout.
torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes);

/// The same in `dtype` instead of `like`'s.
torch::Tensor empty_in_layout_of(const torch::Tensor& like, c10::IntArrayRef sizes,
                                 at::ScalarType dtype);

/// The element offset of every matrix (the last two dims) of `t`, in flattened leading order.
std::vector<int64_t> matrix_offsets(const torch::Tensor& t);

/// A bfloat16 pointer as the bfloat16 products (kernels/cpu/bf16_products.h) take it: its bits.
inline const uint16_t* bits(const c10::BFloat16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}
inline uint16_t* bits(c10::BFloat16* p) {
  return reinterpret_cast<uint16_t*>(p);
}

/// One operand's matrices: the data, the element offset of each flattened leading index, and
/// the row stride (rows are contiguous).
template <typename T>
struct Matrices {
  T* data;
  std::vector<int64_t> at;
  int64_t row_stride;
  /// No matrices (data nullptr): what an operand a route does not read holds.
  Matrices() : data(nullptr), row_stride(0) {}
  explicit Matrices(const torch::Tensor& t)
      : data(t.data_ptr<T>()), at(matrix_offsets(t)), row_stride(t.stride(-2)) {}
  /// The matrices of `t`, or none where `t` is undefined.
  static Matrices of(const torch::Tensor& t) { return t.defined() ? Matrices(t) : Matrices(); }
  T* row(int64_t index, int64_t r) const { return data + at[index] + r * row_stride; }
  /// The same matrices from row r on: the rows of one packed sequence, in every head.
  Matrices from_row(int64_t r) const {
    Matrices rest = *this;
    rest.data += r * row_stride;
    return rest;
  }
  /// The same matrices from column c on: a packed sequence's positions in transposed matrices
  /// (none stay none).
  Matrices from_column(int64_t c) const {
    Matrices rest = *this;
    if (rest.data) rest.data += c;
    return rest;
  }
};

/// The user's mask (its matrix at element `offset`) applied to a tile of scaled scores of
/// queries [i0, i0 + rows) and keys [j0, j0 + cols), row stride ld: bool true = -inf, or added.
template <typename T>
void apply_mask(const torch::Tensor& mask, int64_t offset, int64_t i0, int64_t j0, T* s,
                int64_t rows, int64_t cols, int64_t ld) {
  const int64_t row_stride = mask.stride(-2), col_stride = mask.stride(-1);
  if (mask.scalar_type() == at::kBool) {
    const bool* m = mask.data_ptr<bool>() + offset + i0 * row_stride + j0 * col_stride;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        if (m[r * row_stride + j * col_stride]) s[r * ld + j] = -std::numeric_limits<T>::infinity();
      }
    }
    return;
  }
  const T* m = mask.data_ptr<T>() + offset + i0 * row_stride + j0 * col_stride;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) s[r * ld + j] += m[r * row_stride + j * col_stride];
  }
}

/// The relative position bias on a tile of scores `s` (row stride ld): row r gains the bias by
/// relative position from `at - r` on (the next query is one position further from each key).
/// Built per instruction set (ATTENTION_MULTIVERSION): the kernels' own files are compiled for
/// the baseline.
void add_relative_bias(float* s, int64_t ld, const float* at, int64_t rows, int64_t cols);
void add_relative_bias(double* s, int64_t ld, const double* at, int64_t rows, int64_t cols);

/// The backward's counterpart: row r of the score gradients `g` (row stride cols) is added to the
/// bias's gradient by relative position from `at - r` on, then scaled by `scale`.
void accumulate_relative_bias(float* g, int64_t cols, float* at, int64_t rows, float scale);
void accumulate_relative_bias(double* g, int64_t cols, double* at, int64_t rows, double scale);

/// Where the tile of query matrix m, queries from i0 and keys from j0, lies for a score_mod.
inline ScoreTile score_tile(const Problem& p, int64_t m, int64_t i0, int64_t j0) {
  return {p.tile_batch(m), m % p.heads, i0, j0, p.query_offset};
}

/// The problem's score modification on a tile of scores `s` (row stride ld) of query matrix m,
/// queries [i0, i0 + rows) and keys [j0, j0 + cols), in place. With `saved`, the scores are first
/// copied there (row stride cols) for the derivative.
template <typename T>
void modify_scores(const Problem& p, int64_t m, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                   T* s, int64_t ld, T* saved) {
  if (saved) {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(s + r * ld, cols, saved + r * cols);
  }
  const auto scores = torch::from_blob(s, {rows, cols}, {ld, 1}, torch::dtype<T>());
  p.score_mod->apply(scores, score_tile(p, m, i0, j0), p.caller);
}

/// The backward's counterpart on a tile of rows x cols (row stride cols): `grad`, the gradient of
/// the modified scores, becomes that of the scores `saved` it was applied to, times `scale`, and
/// 0 where `s` (the tile's masked scores) is -inf, whatever the derivative says of hidden pairs.
template <typename T>
void modify_gradients(const Problem& p, int64_t m, int64_t i0, int64_t rows, int64_t j0,
                      int64_t cols, T* saved, const T* s, T* grad, T scale) {
  const auto options = torch::dtype<T>();
  p.score_mod->apply_derivative(torch::from_blob(saved, {rows, cols}, options),
                                torch::from_blob(grad, {rows, cols}, options),
                                score_tile(p, m, i0, j0), p.caller);
  constexpr T kHidden = -std::numeric_limits<T>::infinity();
  for (int64_t e = 0; e < rows * cols; ++e) grad[e] = s[e] == kHidden ? T(0) : grad[e] * scale;
}

/// A block mask as the fused kernels read it (Problem::block_mask): the class of a tile, whose
/// blocks need not be the mask's (a tile's class combines those of the mask blocks under it),
/// and the pairs it hides.
class MaskBlocks {
 public:
  using Block = BlockMask::Block;

  explicit MaskBlocks(const Problem& p)
      : mask_(p.block_mask ? &*p.block_mask : nullptr), rows_(block_mask_rows(p)) {}

  bool defined() const { return mask_ != nullptr; }

  /// The tile of query matrix m, queries [i0, i0 + rows) and keys [j0, j0 + cols) (both > 0):
  /// Empty when every mask block under it is empty, Full when every one is full (or there is no
  /// mask), Partial otherwise.
  Block tile(int64_t m, int64_t i0, int64_t rows, int64_t j0, int64_t cols) const {
    if (!mask_) return Block::Full;
    const int64_t side = mask_->block_size(), b = rows_[m] / mask_->heads(),
                  h = rows_[m] % mask_->heads();
    bool any_full = false, any_empty = false;
    for (int64_t qb = i0 / side; qb <= (i0 + rows - 1) / side; ++qb) {
      for (int64_t kb = j0 / side; kb <= (j0 + cols - 1) / side; ++kb) {
        const Block which = mask_->block(b, h, qb, kb);
        if (which == Block::Partial) return Block::Partial;
        (which == Block::Full ? any_full : any_empty) = true;
      }
    }
    if (any_full && any_empty) return Block::Partial;
    return any_full ? Block::Full : Block::Empty;
  }

  /// Writes -inf over the scores `s` (row stride ld) of the tile's pairs that the mask hides.
  template <typename T>
  void hide(int64_t m, int64_t i0, int64_t rows, int64_t j0, int64_t cols, T* s, int64_t ld) const {
    constexpr T kHidden = -std::numeric_limits<T>::infinity();
    const int64_t side = mask_->block_size(), b = rows_[m] / mask_->heads(),
                  h = rows_[m] % mask_->heads(), stride = mask_->pair_stride();
    for (int64_t qb = i0 / side; qb <= (i0 + rows - 1) / side; ++qb) {
      const int64_t q0 = std::max(i0, qb * side), q1 = std::min(i0 + rows, (qb + 1) * side);
      for (int64_t kb = j0 / side; kb <= (j0 + cols - 1) / side; ++kb) {
        const int64_t k0 = std::max(j0, kb * side), k1 = std::min(j0 + cols, (kb + 1) * side);
        const Block which = mask_->block(b, h, qb, kb);
        if (which == Block::Full) continue;
        const uint8_t* pairs =
            which == Block::Partial ? mask_->partial_pairs(b, h, qb, kb) : nullptr;
        for (int64_t q = q0; q < q1; ++q) {
          T* row = s + (q - i0) * ld - j0;
          if (!pairs) {
            std::fill(row + k0, row + k1, kHidden);
            continue;
          }
          const uint8_t* seen = pairs + (q - qb * side) * stride - kb * side;
#pragma omp simd
          for (int64_t kv = k0; kv < k1; ++kv) row[kv] = seen[kv] ? row[kv] : kHidden;
        }
      }
    }
  }

 private:
  const BlockMask* mask_;
  std::vector<int64_t> rows_;  // block_mask_rows
};

/// What comes between the product of queries and keys and the softmax, on a tile of scaled
/// scores `s` (row stride ld) of query matrix h, queries [i0, i0 + rows), keys [j0, j0 + cols):
/// soft-capping (writing its derivative 1 - tanh^2 to `cap_slope`, row stride cols, when given),
/// ALiBi, the score modification (first copying the scores to `score_in`, row stride cols, when
/// given), the relative position bias (`relative`: relative_bias_by_position's (H,
/// relative_count()) rows, or nullptr), the user's mask (its matrices at `mask_at`), and -inf for
/// keys left of the window. Keys right of the causal diagonal or the window are the caller's: it
/// never reads them.
template <typename T>
void prepare_scores(const Problem& p, const std::vector<int64_t>& mask_at, int64_t h, int64_t i0,
                    int64_t rows, int64_t j0, int64_t cols, T* s, int64_t ld, T* cap_slope,
                    const T* relative = nullptr, T* score_in = nullptr) {
  if (p.softcap > 0.0) soft_cap(s, ld, rows, cols, static_cast<T>(p.softcap), cap_slope);
  if (!p.alibi.empty()) {
    const T slope = static_cast<T>(p.alibi[h % p.heads]);
    for (int64_t r = 0; r < rows; ++r) {
      T* row = s + r * ld;
      const int64_t position = i0 + r + p.query_offset - j0;  // relative to key j0
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t distance = position > j ? position - j : j - position;
        row[j] -= slope * static_cast<T>(distance);
      }
    }
  }
  if (p.score_mod) modify_scores(p, h, i0, rows, j0, cols, s, ld, score_in);
  if (relative) {
    // Row h of the bias by relative position, indexed by j - pos(i) - relative_first.
    const T* bias = relative + (h % p.heads) * p.relative_count() - p.relative_first;
    add_relative_bias(s, ld, bias + j0 - (i0 + p.query_offset), rows, cols);
  }
  if (p.mask.defined()) apply_mask<T>(p.mask, mask_at[h], i0, j0, s, rows, cols, ld);
  if (p.bounded_left()) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t hidden = std::clamp<int64_t>(i0 + r + p.left_diagonal() - j0, 0, cols);
      std::fill(s + r * ld, s + r * ld + hidden, -std::numeric_limits<T>::infinity());
    }
  }
}

/// Where a tile crosses the causal diagonal or the window's left edge, it is done in strips of
/// this many query rows, each only as wide as its rows see: most of the tile's hidden triangles
/// are never computed.
constexpr int64_t kDiagonalStrip = 64;

/// Whether the causal diagonal (or the window's right end) or the window's left edge crosses the
/// tile of queries [i0, i0 + rows) and keys [j0, j0 + cols).
inline bool crosses_edge(const Problem& p, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  const bool right = p.bounded_right() && i0 + 1 + p.diagonal() - j0 < cols;
  const bool left = p.bounded_left() && i0 + rows - 1 + p.left_diagonal() > j0;
  return right || left;
}

/// The columns [begin, end) of the tile (keys [j0, j0 + cols)) that some query of the strip
/// [i, i + rows) sees: up to its last row's right limit, from its first row's left limit.
struct Columns {
  int64_t begin, end;
};

inline Columns strip_columns(const Problem& p, int64_t i, int64_t rows, int64_t j0, int64_t cols) {
  const int64_t end =
      p.bounded_right() ? std::clamp<int64_t>(i + rows + p.diagonal() - j0, 0, cols) : cols;
  const int64_t begin =
      p.bounded_left() ? std::clamp<int64_t>(i + p.left_diagonal() - j0, 0, end) : 0;
  return {begin, end};
}

/// The query-key pairs that the query block [i0, i0 + rows) of a one-sequence problem computes,
/// counted by block edges (keys_begin to keys_end for every row): what a work item costs, for
/// ordering the items of packed sequences dearest first.
inline double block_pairs(const Problem& p, int64_t i0, int64_t rows) {
  const int64_t keys = std::max<int64_t>(0, keys_end(p, i0, rows) - keys_begin(p, i0));
  return static_cast<double>(rows) * static_cast<double>(keys);
}

/// Runs the work items of packed sequences on every thread, dearest first (by their `cost`), so
/// that a long sequence's items start early and the short ones fill in around them: the contiguous
/// ranges of at::parallel_for would leave one thread with the long ones. Each thread makes its
/// buffers once (`make_buffers()`), then takes the next item from a shared counter and runs
/// `run(item, buffers)`.
template <typename Item, typename MakeBuffers, typename Run>
void run_dearest_first(std::vector<Item>& items, const MakeBuffers& make_buffers, const Run& run) {
  run_dearest_first(items, make_buffers, run, [](auto&) {});
}

/// The same, then `finish(buffers)` on each thread once it has run its items.
template <typename Item, typename MakeBuffers, typename Run, typename Finish>
void run_dearest_first(std::vector<Item>& items, const MakeBuffers& make_buffers, const Run& run,
                       const Finish& finish) {
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    auto buffers = make_buffers();
    for (size_t i = next++; i < items.size(); i = next++) run(items[i], buffers);
    finish(buffers);
  });
}

/// Query blocks in the order cheap, dear, cheap, dear... so that the contiguous ranges of items
/// that at::parallel_for hands each thread carry equal causal work.
inline int64_t interleaved(int64_t k, int64_t blocks) {
  return k % 2 == 0 ? k / 2 : blocks - 1 - k / 2;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
