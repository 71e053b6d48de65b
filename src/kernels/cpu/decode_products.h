#pragma once

// The paged forward's products (kernels/cpu/paged.cpp): a few query rows against keys and values
// that lie one row here, one row there, in the pages of a cache, each reached through a pointer.
// A decoding step is bound by reading those keys and values once, so the products must keep up
// with memory: the compiler-vectorized loops (one dot product per row and key, summed lane after
// lane) do not. Here a row meets a group of keys at a time (16 on AVX-512F, 8 on AVX2, SSE4 and
// NEON), each key's partial sums kept in a register of its own and the group's sums gathered into
// one register by a tree of shuffles; the weighted values keep a row's output in registers while
// its keys go by. bfloat16 keys and values are widened on load (a bfloat16 is a float's upper
// half), 8-bit ones converted on load and their row's scale applied once per score and once per
// weight. 8-bit keys also meet queries held as 16-bit integer codes (kernels/cpu/query_codes.h) in
// integer products, exact in 32-bit sums: pairs of 16-bit products added into each 32-bit lane
// (AVX512_VNNI's vpdpwssd, one instruction for 32 products; vpmaddwd and an add on AVX-512 and
// AVX2 without it, and on SSE4; NEON's widening multiply-adds). One source
// (kernels/cpu/decode_products.cpp, through Google Highway) compiled for each instruction set and
// chosen at run time as the exponential passes are (kernels/cpu/softmax.h).

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

/// Keys scores_coded_columns() widens at a time.
constexpr int64_t kCodedColumnKeys = 8;

/// 8-bit rows (the next tile's keys or values) that a call of the integer products asks the
/// memory for while it runs, a few cache lines at each step of its loops. Asked for all at once,
/// a tile's lines (256 for 64 keys and values of 128 features) wait for the core's few miss
/// buffers and stall it there, and the memory then idles while the products run
/// (docs/PERFORMANCE.md, the 8-bit cache without int8 products).
class RowsAhead {
 public:
  RowsAhead() = default;
  /// `count` rows of `width` bytes each.
  RowsAhead(const int8_t* const* rows, int64_t count, int64_t width)
      : rows_(rows), count_(count), lines_per_row_((width + kLine - 1) / kLine) {}

  /// Spreads the lines not yet asked for over `steps` calls of step().
  void spread_over(int64_t steps) { per_step_ = steps > 0 ? (left() + steps - 1) / steps : left(); }
  /// Asks for the next few lines.
  void step() { ask(per_step_); }
  /// Asks for every line not yet asked for.
  void rest() { ask(left()); }
  /// The lines not yet asked for.
  int64_t left() const { return count_ * lines_per_row_ - asked_; }

 private:
  static constexpr int64_t kLine = 64;
  void ask(int64_t lines) {
    for (const int64_t end = std::min(asked_ + lines, count_ * lines_per_row_); asked_ < end;
         ++asked_) {
      __builtin_prefetch(rows_[asked_ / lines_per_row_] + asked_ % lines_per_row_ * kLine);
    }
  }
  const int8_t* const* rows_ = nullptr;
  int64_t count_ = 0, lines_per_row_ = 0, asked_ = 0, per_step_ = 0;
};

/// One instruction set's products. Feature counts (d, dv) must be multiples of `lanes`.
struct DecodeProducts {
  /// The route's name, as ATTENTION_CPU_VECTOR names it: "avx512_vnni", "avx512", "avx2", "neon"
  /// or "sse4".
  const char* name;
  /// The vector width in floats: d and dv must be multiples of it.
  int64_t lanes;

  /// s[r * ld + j] = sum_c q[r * d + c] * keys[j][c] for r < rows, j < cols.
  void (*scores)(const float* q, int64_t rows, int64_t d, const float* const* keys, int64_t cols,
                 float* s, int64_t ld);
  /// The same with bfloat16 keys (their bits as uint16_t).
  void (*scores_bf16)(const float* q, int64_t rows, int64_t d, const uint16_t* const* keys,
                      int64_t cols, float* s, int64_t ld);

  /// acc[r * dv + c] += sum_j p[r * ld + j] * values[j][c] for r < rows, c < dv, over j < cols
  /// with p[r * ld + j] != 0: a value a row gives no weight is never read for it (a NaN there
  /// stays out of the row, as in the kernels' other loops).
  void (*values)(const float* p, int64_t ld, int64_t rows, const float* const* values, int64_t cols,
                 float* acc, int64_t dv);
  /// The same with bfloat16 values.
  void (*values_bf16)(const float* p, int64_t ld, int64_t rows, const uint16_t* const* values,
                      int64_t cols, float* acc, int64_t dv);

  /// Scores against 8-bit keys: s[r * ld + j] = key_scales[j] * sum_c q[r * d + c] * keys[j][c].
  void (*scores_i8)(const float* q, int64_t rows, int64_t d, const int8_t* const* keys,
                    const float* key_scales, int64_t cols, float* s, int64_t ld);
  /// Weighted 8-bit values: acc[r * dv + c] += sum_j p[r * ld + j] * value_scales[j] *
  /// values[j][c], over the j with p[r * ld + j] != 0 (as `values`).
  void (*values_i8)(const float* p, int64_t ld, int64_t rows, const int8_t* const* values,
                    const float* value_scales, int64_t cols, float* acc, int64_t dv);

  /// Scores of coded query rows against 8-bit keys on integer products: s[r * ld + j] =
  /// q_scales[r] * key_scales[j] * (sum_c codes[r * d + c] * keys[j][c]), the sum exact in 32-bit
  /// integers, which codes within query_code_limit(d) guarantee. d must be a multiple of
  /// 2 * lanes (a register of 16-bit codes). `ahead` (may be null): rows asked for on the way,
  /// every one of them by the time it returns.
  void (*scores_coded)(const int16_t* codes, const float* q_scales, int64_t rows, int64_t d,
                       const int8_t* const* keys, const float* key_scales, int64_t cols, float* s,
                       int64_t ld, RowsAhead* ahead);
  /// The same for many rows, transposed: s_t[j * ld_t + r] = q_scales[r] * key_scales[j] *
  /// (sum_c codes[r][c] * keys[j][c]), with the codes as pack_code_pairs() lays them out (`pairs`)
  /// and rows a multiple of `lanes`. Each key is widened once (into `scratch`, room for
  /// kCodedColumnKeys * d / 2 words) for all rows, and no sum is gathered across lanes: a lane
  /// holds one row's sum.
  void (*scores_coded_columns)(const int32_t* pairs, const float* q_scales, int64_t rows, int64_t d,
                               const int8_t* const* keys, const float* key_scales, int64_t cols,
                               float* s_t, int64_t ld_t, int32_t* scratch);
  /// Weighted 8-bit values on integer products, as values_i8 where dv is a multiple of
  /// 2 * lanes: each row's weights times their keys' scales, over each run of up to 256 keys,
  /// coded in 16 bits with a scale of the row's own (its largest weight / 32767: every weight
  /// within 1/65534 of the largest), and the sums of weight codes times value codes exact in 32
  /// bits. A row whose weights are not all finite (a NaN or infinite scale of a key it weighs)
  /// takes values_i8's float products. `ahead` as scores_coded's. With `scratch` (room for
  /// coded_values_scratch_words(rows, dv)), rows a multiple of `lanes` and at least twice it take
  /// the products with the rows across lanes (each value widened once for all rows); null keeps
  /// blocks of a few rows. Both make the same integer sums, each scaled and added to acc once per
  /// run; a compiler may fuse that multiply and add in one and not the other (GCC on aarch64
  /// does), so they agree within a rounding per run.
  void (*values_coded)(const float* p, int64_t ld, int64_t rows, const int8_t* const* values,
                       const float* value_scales, int64_t cols, float* acc, int64_t dv,
                       RowsAhead* ahead, int32_t* scratch);
};

/// The scratch words values_coded() takes for `rows` rows of dv features: a run of up to 256
/// keys' values in pairs of keys, the rows' weight codes in pairs, and their scales.
constexpr int64_t coded_values_scratch_words(int64_t rows, int64_t dv) {
  return 128 * dv + 128 * rows + rows;
}

/// Coded query rows (rows x d, d even) as scores_coded_columns() reads them: pairs[p * rows + r]
/// holds codes[r][2p] in its low half and codes[r][2p + 1] in its high half.
void pack_code_pairs(const int16_t* codes, int64_t rows, int64_t d, int32_t* pairs);

/// Whether 8-bit keys meet coded queries in integer products (scores_coded) where the products and
/// the feature count allow: true unless ATTENTION_CPU_INT8=widened keeps the widened float
/// products (to compare the routes, and to test both on one machine). Read once.
bool int8_products_enabled();

/// The products the paged forward takes in this process, decided once as softmax_passes() is:
/// the first of supported_decode_products(), nullptr (the portable loops) where there is none.
/// ATTENTION_CPU_VECTOR=portable keeps the loops; ATTENTION_CPU_VECTOR=NAME takes the set of that
/// name where the processor runs it (avx2 or sse4 on an AVX-512 processor).
const DecodeProducts* decode_products();

/// Every set this processor runs, best first (for tests and benchmarks).
std::vector<const DecodeProducts*> supported_decode_products();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
