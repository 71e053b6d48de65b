#pragma once

// Tile products on the processor's own bfloat16 dot products (AVX512_BF16's vdpbf16ps, the ARM
// BF16 extension's BFDOT: in each float lane, two bfloat16 products summed into a float
// accumulator, so twice the products of a float multiply-add per instruction; AMX's tdpbf16ps, the
// same sums over tiles of 16 x 16 floats, 256 times vdpbf16ps's work per instruction). The fused
// forward and backward take them for bfloat16 inputs where the processor has them
// (kernels/cpu/forward.cpp, kernels/cpu/backward.cpp), and so do the paged kernel's matrix products
// for bfloat16 pages (kernels/cpu/paged.cpp); elsewhere bfloat16 is widened to float and runs the
// float kernels. The products accumulate in float: a product of two bfloat16 values is exact in
// float, so the only roundings beyond float's own are of the operands, the probabilities among them
// (rounded once to bfloat16 before they weight the values, as PyTorch's CPU flash kernel and the
// GPU flash kernels do).
//
// The instruction pairs two neighbours along the contracted dimension, so the right operand is
// kept as pairs: a "pair row" p holds, for each column j, the 32-bit word of rows 2p and 2p + 1
// (row 2p in the low half). pack_row_pairs() makes it of a matrix that is contracted along its
// rows (values: weighted sum over keys), pack_column_pairs() of one contracted along its columns
// (keys: scores = Q K^T contract the feature dimension of both).

#include <cstdint>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

/// One instruction set's bfloat16 products. bfloat16 values are passed as their bits (uint16_t).
struct Bf16Products {
  /// "amx_bf16", "avx512_bf16" or "neon_bf16": the name ATTENTION_CPU_BF16 takes to choose it.
  const char* name;

  /// C (m x n floats, row stride ldc) = alpha * A B, plus C's old value when `accumulate`. A is
  /// m x k bfloat16 (row stride lda; row r's k values from a + r * lda, nothing beyond them is
  /// read); B is k x n in pair rows (ceil(k / 2) of them, ldb words apart; with k odd the last
  /// pair row's high halves are not read). Sums run in float.
  void (*product)(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                  const uint32_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

  /// out (rows x cols bfloat16, row stride ld_out) = in (floats, row stride ld_in) rounded to
  /// nearest even, subnormal floats included; NaN stays NaN (on AVX-512 LibTorch's bits for every
  /// value, NaN as 0x7FC0).
  void (*round)(const float* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ld_out);

  /// The pair rows (as pack_row_pairs() makes them) of `in` (rows x cols floats, row stride
  /// ld_in) rounded to bfloat16 as round() rounds: the backward's probabilities and score
  /// gradients, contracted over their query rows.
  void (*round_row_pairs)(const float* in, int64_t ld_in, int64_t rows, int64_t cols, uint32_t* out,
                          int64_t ld_out);

  /// round() into `out` and round_row_pairs() into `pairs` of the same values in one pass: the
  /// backward's score gradients, which weight both the keys and the queries.
  void (*round_both)(const float* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                     int64_t ld_out, uint32_t* pairs, int64_t ld_pairs);

  /// pack_column_pairs() (below), the same words: the keys' pairs, once per key block.
  void (*pack_column_pairs)(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols,
                            uint32_t* out, int64_t ld_out);

  /// out (cols x rows 16-bit values, row stride ld_out) = the transpose of `in` (rows x cols,
  /// row stride ld_in): the backward's queries and output gradient, features by rows.
  void (*transpose)(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                    int64_t ld_out);
};

/// The products the fused kernels take for bfloat16 in this process, decided once: AMX's tiles
/// where the processor has them (and Linux grants them), AVX512_BF16's vectors on AMD's processors
/// (Intel's run them at float's rate: slower than widening there), the ARM BF16 extension's, else
/// nullptr (bfloat16 widened to float).
/// ATTENTION_CPU_BF16 names another of the processor's sets ("avx512_bf16" keeps AMX's tiles
/// unused), or "widened" to keep the widened route on a processor with products too (to compare
/// the routes, and to test each on one machine); ATTENTION_CPU_VECTOR=portable, avx2 or sse4 widens
/// as well. A name this processor does not run leaves the best set.
const Bf16Products* bf16_products();

/// Every set of bfloat16 products this processor runs, best first (for tests and benchmarks):
/// AMX's tiles, AVX512_BF16's vectors, the ARM BF16 extension's.
std::vector<const Bf16Products*> processor_bf16_product_sets();

/// The best of them whatever bf16_products() took, else nullptr.
const Bf16Products* processor_bf16_products();

/// Each instruction set's products where this processor runs them, else nullptr. AMX's set takes
/// AVX512_BF16's for the tiles' edges and for every pass other than the product.
const Bf16Products* amx_bf16_products();
const Bf16Products* avx512_bf16_products();
const Bf16Products* neon_bf16_products();

/// Pair rows of `in` (rows x cols bfloat16, row stride ld_in), contracted along its rows:
/// out[p * ld_out + c] holds in[2p][c] low and in[2p + 1][c] high, for p < ceil(rows / 2); with
/// rows odd the last pair row's high halves are 0.
void pack_row_pairs(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint32_t* out,
                    int64_t ld_out);

/// Pair rows of the transpose of `in` (rows x cols bfloat16, row stride ld_in), contracted along
/// its columns: out[p * ld_out + r] holds in[r][2p] low and in[r][2p + 1] high, for
/// p < ceil(cols / 2); with cols odd the last pair row's high halves are 0.
void pack_column_pairs(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint32_t* out,
                       int64_t ld_out);

/// out (cols x rows, row stride ld_out) = the transpose of `in` (rows x cols 16-bit values, row
/// stride ld_in), in plain loops: Bf16Products::transpose where no vector form is written.
void transpose_16(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                  int64_t ld_out);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
