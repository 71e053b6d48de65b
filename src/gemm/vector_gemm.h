#pragma once

// The fused CPU kernels' float tile products on the library's own vector code: a block of 6 rows
// of C by two vectors of columns held in registers while the contracted dimension goes by, B's
// columns for the block packed once into a contiguous panel that every 6 rows then read. Where it
// is taken (gemm/blas.cpp), it runs in place of libxsmm's generated kernels: on AVX2, where they
// reach less of the processor's rate on the fused kernels' shapes (docs/PERFORMANCE.md).
// ATTENTION_CPU_GEMM=vector takes it on every vector set; =libxsmm keeps the generated kernels.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// The product of cpu::gemm (row-major; C = op(A) B with beta 0, C += op(A) B with beta 1) on the
/// library's vector code, summed over k in order in registers and added to C once. Returns false
/// and leaves C untouched where it does not take the product: this process does not take it
/// (vector_gemm_enabled()), B transposed, alpha other than 1, beta other than 0 and 1, a side
/// not above 0 or above kMaxVectorGemmSide (larger products are BLAS's, whose packing pays
/// there), n not a multiple of the vector's lanes, or strides shorter than the rows they step
/// over or above 2^31 - 1.
bool vector_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc);

/// The largest side of a product vector_gemm() takes (the largest Chunked block size). B's panel
/// (k rows of two vectors) is a buffer of the thread's, of this many rows.
constexpr int64_t kMaxVectorGemmSide = 1024;

/// Whether vector_gemm() takes products in this process: the chosen vector set is AVX2's (that of
/// processors without AVX-512, or ATTENTION_CPU_VECTOR=avx2), or ATTENTION_CPU_GEMM=vector asks
/// for any set; never with ATTENTION_CPU_GEMM set to another route, or on the portable loops.
bool vector_gemm_enabled();

/// The vector set vector_gemm() runs on ("avx512", "avx2", "neon"), nullptr where it is not taken.
const char* vector_gemm_set();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
