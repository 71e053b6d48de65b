// The chunked forward on the CPU, fused. Each thread takes (query head, query block) items and
// keeps one tile of scores in its cache while the scores, the online-softmax step and the
// weighted sum of values run over it; no LibTorch op works on more than one tile, so there is
// one pass over memory per product instead of one per element-wise op. The two products go to
// BLAS through LibTorch. The softmax step is a loop the compiler vectorizes, with a polynomial
// exp, built for several instruction sets and picked at run time on x86-64. Queries, keys and
// values are read in place through their strides, so heads split by a view/transpose are not
// copied, and the output is written in the queries' memory layout.

#include "kernels/chunked.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// Several copies of the softmax step, one per instruction set, chosen when the library loads.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_MULTIVERSION \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define ATTENTION_MULTIVERSION
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ATTENTION_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ATTENTION_ALWAYS_INLINE inline
#endif

namespace attention {
namespace kernels {
namespace {

using torch::Tensor;

// exp(x) for x <= 0 (NaN gives 0: callers check for NaN themselves), written with nothing but
// arithmetic and min/max so that every compiler vectorizes the loops calling it: Cephes'
// single-precision polynomial after a reduction by ln 2 (within 2 ulp of std::exp). Results
// below 2^-126 (x below about -87.3) come out as 0.
ATTENTION_ALWAYS_INLINE float exp_nonpositive(float x) {
  const float xc = x > -100.0f ? x : -100.0f;  // also -inf and NaN
  const float round = 12582912.0f;             // 1.5 * 2^23: adding it rounds to an integer
  float n = (xc * 1.44269504089f + round) - round;
  n = n > -127.0f ? n : -127.0f;  // 2^-127 is built as 0 below
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float y = poly * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (int32_t{1} << 23);
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

ATTENTION_ALWAYS_INLINE double exp_nonpositive(double x) {
  return std::exp(x);
}

// The online-softmax step of one tile: rows x cols scaled scores in `s` (row stride ld), of
// which row r sees its first valid + r columns when causal (all of them otherwise). Turns the
// scores into probabilities relative to each row's running maximum `max`, adds them to the
// running sum `sum` (NaN once a score was NaN), and rescales the row's accumulated values `acc`
// (rows x dv) to the new maximum.
template <typename T>
ATTENTION_ALWAYS_INLINE void softmax_step(T* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                                          int64_t valid, T* max, T* sum, T* acc, int64_t dv) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * ld;
    const int64_t seen = causal ? std::clamp<int64_t>(valid + r, 0, cols) : cols;
    T row_max = -kInf;
    int nan = 0;
#pragma omp simd reduction(max : row_max) reduction(| : nan)
    for (int64_t j = 0; j < seen; ++j) {
      row_max = row[j] > row_max ? row[j] : row_max;
      nan |= row[j] != row[j];
    }
    const T new_max = row_max > max[r] ? row_max : max[r];
    // A NaN score, or a +inf one (whose exp relative to itself is inf/inf), leaves the row's
    // softmax undefined: NaN, as the whole-matrix softmax gives.
    if (nan || row_max == kInf) sum[r] = std::numeric_limits<T>::quiet_NaN();
    if (new_max == -kInf) {  // every key masked so far: nothing to add
      std::fill(row, row + cols, T(0));
      continue;
    }
    T added = 0;
#pragma omp simd reduction(+ : added)
    for (int64_t j = 0; j < seen; ++j) {
      const T e = exp_nonpositive(row[j] - new_max);
      row[j] = e;
      added += e;
    }
    std::fill(row + seen, row + cols, T(0));
    const T correction = exp_nonpositive(max[r] - new_max);
    sum[r] = sum[r] * correction + added;
    max[r] = new_max;
    if (correction != T(1)) {
      T* a = acc + r * dv;
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) a[c] *= correction;
    }
  }
}

ATTENTION_MULTIVERSION void softmax_step_f32(float* s, int64_t rows, int64_t cols, int64_t ld,
                                             bool causal, int64_t valid, float* max, float* sum,
                                             float* acc, int64_t dv) {
  softmax_step(s, rows, cols, ld, causal, valid, max, sum, acc, dv);
}

void dispatch_softmax_step(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                           int64_t valid, float* max, float* sum, float* acc, int64_t dv) {
  softmax_step_f32(s, rows, cols, ld, causal, valid, max, sum, acc, dv);
}

void dispatch_softmax_step(double* s, int64_t rows, int64_t cols, int64_t ld, bool causal,
                           int64_t valid, double* max, double* sum, double* acc, int64_t dv) {
  softmax_step(s, rows, cols, ld, causal, valid, max, sum, acc, dv);
}

// The element offset of every matrix (the last two dims) of `t`, in flattened leading order.
std::vector<int64_t> matrix_offsets(const Tensor& t) {
  const int64_t lead = t.dim() - 2;
  int64_t count = 1;
  for (int64_t i = 0; i < lead; ++i) count *= t.size(i);
  std::vector<int64_t> offsets(count);
  for (int64_t m = 0; m < count; ++m) {
    int64_t rest = m, offset = 0;
    for (int64_t i = lead - 1; i >= 0; --i) {
      offset += (rest % t.size(i)) * t.stride(i);
      rest /= t.size(i);
    }
    offsets[m] = offset;
  }
  return offsets;
}

// An empty tensor of `sizes` whose dims lie in memory in the order of `like`'s strides.
Tensor empty_in_layout_of(const Tensor& like, c10::IntArrayRef sizes) {
  std::vector<int64_t> order(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end() - 1,
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> permuted(like.dim()), inverse(like.dim());
  for (int64_t i = 0; i < like.dim(); ++i) {
    permuted[i] = sizes[order[i]];
    inverse[order[i]] = i;
  }
  return torch::empty(permuted, like.options()).permute(inverse);
}

// The user's mask applied to a tile of scaled scores: bool true = -inf, or added.
template <typename T>
void apply_mask(const Tensor& mask, int64_t offset, int64_t i0, int64_t j0, T* s, int64_t rows,
                int64_t cols, int64_t ld) {
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

// Query blocks in the order cheap, dear, cheap, dear... so that the contiguous ranges of items
// that at::parallel_for hands each thread carry equal causal work.
int64_t interleaved(int64_t k, int64_t blocks) {
  return k % 2 == 0 ? k / 2 : blocks - 1 - k / 2;
}

// Where a tile crosses the causal diagonal, it is done in strips of this many query rows, each
// strip only as wide as its last row sees: most of the tile's upper triangle is never computed.
constexpr int64_t kDiagonalStrip = 64;

// One operand's matrices: the data, the element offset of each flattened leading index, and the
// row stride (rows are contiguous).
template <typename T>
struct Matrices {
  T* data;
  std::vector<int64_t> at;
  int64_t row_stride;
  explicit Matrices(const Tensor& t)
      : data(t.data_ptr<T>()), at(matrix_offsets(t)), row_stride(t.stride(-2)) {}
  T* row(int64_t index, int64_t r) const { return data + at[index] + r * row_stride; }
};

template <typename T>
class Forward {
 public:
  Forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
          Tensor& lse)
      : p_(p), q_(q), k_(k), v_(v), out_(out), lse_(lse.data_ptr<T>()), options_(q.options()) {
    if (p.mask.defined()) mask_at_ = matrix_offsets(p.mask);
  }

  void run() {
    const int64_t blocks = (p_.t_q + p_.block - 1) / p_.block;
    at::parallel_for(0, p_.n * p_.g * blocks, 1, [&](int64_t begin, int64_t end) {
      Workspace w(p_, options_);
      for (int64_t item = begin; item < end; ++item) {
        query_block(item / blocks, interleaved(item % blocks, blocks) * p_.block, w);
      }
    });
  }

 private:
  // One thread's buffers, reused for every item it takes.
  struct Workspace {
    Tensor scores, acc;
    std::vector<T> max, sum;
    Workspace(const Problem& p, const torch::TensorOptions& options)
        : scores(torch::empty({p.block * p.block}, options)),
          acc(torch::empty({p.block * p.dv}, options)),
          max(p.block),
          sum(p.block) {}
  };

  Tensor matrix(const T* data, int64_t rows, int64_t cols, int64_t stride) const {
    return torch::from_blob(const_cast<T*>(data), {rows, cols}, {stride, 1}, options_);
  }

  // Query head h, queries [i0, i0 + rows): every key block, then the output rows.
  void query_block(int64_t h, int64_t i0, Workspace& w) const {
    const int64_t rows = std::min(p_.block, p_.t_q - i0), kv = h / p_.g;
    std::fill(w.max.begin(), w.max.end(), -std::numeric_limits<T>::infinity());
    std::fill(w.sum.begin(), w.sum.end(), T(0));
    T* acc = w.acc.template data_ptr<T>();
    std::fill(acc, acc + rows * p_.dv, T(0));
    const int64_t keys = keys_end(p_, i0, rows);
    for (int64_t j0 = 0; j0 < keys; j0 += p_.block) {
      const int64_t cols = std::min(p_.block, keys - j0);
      // Keys of the tile that the first row sees (visible_end before its clamp: rows above the
      // first visible one count down from it).
      const int64_t seen = i0 + 1 + p_.causal_offset - j0;
      const int64_t strip = p_.causal && seen < cols ? kDiagonalStrip : rows;
      for (int64_t r0 = 0; r0 < rows; r0 += strip) {
        const int64_t sr = std::min(strip, rows - r0);
        const int64_t width = p_.causal ? std::clamp<int64_t>(seen + r0 + sr - 1, 0, cols) : cols;
        if (width > 0) tile(h, kv, i0 + r0, sr, j0, width, cols, seen + r0, w, r0);
      }
    }
    T* lse = lse_ + h * p_.t_q + i0;
    for (int64_t r = 0; r < rows; ++r) {
      const bool dead = w.sum[r] == T(0);  // NaN sums are not dead: they stay NaN
      const T inverse = dead ? T(0) : T(1) / w.sum[r];
      T* o = out_.row(h, i0 + r);
      for (int64_t c = 0; c < p_.dv; ++c) o[c] = acc[r * p_.dv + c] * inverse;
      lse[r] = dead ? std::numeric_limits<T>::infinity() : w.max[r] + std::log(w.sum[r]);
    }
  }

  // Queries [i, i + rows) against keys [j0, j0 + cols): scores in a (rows, cols) window of the
  // workspace with row stride ld, the softmax step, and the weighted values into the rows of
  // the accumulator from `first` on.
  void tile(int64_t h, int64_t kv, int64_t i, int64_t rows, int64_t j0, int64_t cols, int64_t ld,
            int64_t seen, Workspace& w, int64_t first) const {
    T* scores = w.scores.template data_ptr<T>() + first * ld;
    T* acc = w.acc.template data_ptr<T>() + first * p_.dv;
    Tensor s = matrix(scores, rows, cols, ld);
    at::addmm_out(s, s, matrix(q_.row(h, i), rows, p_.d, q_.row_stride),
                  matrix(k_.row(kv, j0), cols, p_.d, k_.row_stride).t(), /*beta=*/0,
                  /*alpha=*/p_.scale);
    if (p_.mask.defined()) apply_mask<T>(p_.mask, mask_at_[h], i, j0, scores, rows, cols, ld);
    dispatch_softmax_step(scores, rows, cols, ld, p_.causal, seen, w.max.data() + first,
                          w.sum.data() + first, acc, p_.dv);
    Tensor a = matrix(acc, rows, p_.dv, p_.dv);
    a.addmm_(s, matrix(v_.row(kv, j0), cols, p_.dv, v_.row_stride));
  }

  const Problem& p_;
  Matrices<T> q_, k_, v_, out_;
  T* lse_;
  torch::TensorOptions options_;
  std::vector<int64_t> mask_at_;
};

}  // namespace

bool cpu_forward_applies(const Tensor& query) {
  return query.device().is_cpu() &&
         (query.scalar_type() == at::kFloat || query.scalar_type() == at::kDouble);
}

std::pair<Tensor, Tensor> cpu_forward(const Problem& p, const Tensor& query, const Tensor& key,
                                      const Tensor& value) {
  // BLAS reads rows through their stride but wants each row contiguous.
  const auto rows_contiguous = [](const Tensor& t) {
    return t.stride(-1) == 1 ? t : t.contiguous();
  };
  const Tensor q = rows_contiguous(query), k = rows_contiguous(key), v = rows_contiguous(value);
  auto sizes = q.sizes().vec();
  sizes.back() = p.dv;
  Tensor out = empty_in_layout_of(q, sizes);
  Tensor lse = torch::empty({p.n, p.g, p.t_q}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention::kernels::cpu_forward",
                             [&] { Forward<scalar_t>(p, q, k, v, out, lse).run(); });
  return {out, lse};
}

}  // namespace kernels
}  // namespace attention
