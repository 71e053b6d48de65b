#pragma once

// Matrix products of the fused CPU kernels on raw row-major pointers. A tile's products are
// small (a few hundred KFLOP each) and many (tens of thousands per call), so the cost of
// reaching BLAS is part of the kernel's time: LibTorch's own raw entry (at::native::cpublas)
// is not exported by every generation, and addmm on views of the pointers spends 5-9 us of
// dispatch on every tile. Products libxsmm takes go there first (gemm/small_gemm.h); the
// Fortran BLAS that LibTorch itself loaded is called directly where the process has one, and
// addmm remains the route everywhere else.

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// Row-major C (m x n, row stride ldc) = alpha * op(A) * op(B) + beta * C, where op(A) is m x k
/// (A itself is k x m when trans_a) and op(B) is k x n; rows of A and B have strides lda and ldb.
/// With beta = 0, C is not read. `scratch` (m x n elements, optional) lets a product with beta 1
/// take the small-product route (gemm/small_gemm.h). For float and double.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T* scratch = nullptr);

/// out (cols x rows, row stride ld_out) = alpha * the transpose of `in` (rows x cols, row stride
/// ld_in). The kernels turn keys and values once per key block with it, so that their products
/// that contract over rows (scores = Q K^T) read both operands along rows, which the generated
/// small-product kernels need (gemm/small_gemm.h) and BLAS takes as well. For float and double,
/// and bfloat16 into float (widened as it is turned).
template <typename T, typename In = T>
void transpose_scaled(const In* in, int64_t ld_in, int64_t rows, int64_t cols, T alpha, T* out,
                      int64_t ld_out);

/// The same product through LibTorch's addmm on views of the pointers: the route gemm() takes
/// when the process has no usable BLAS symbol.
template <typename T>
void gemm_through_addmm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                        const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                        int64_t ldc);

/// Which route gemm() takes in this process for a tile's products: "libxsmm" (small_gemm(),
/// with the products it does not take on BLAS), "blas" (sgemm_/dgemm_ called directly) or
/// "addmm"; "vector+libxsmm" or "vector" where the float products go to vector_gemm() first.
/// ATTENTION_CPU_GEMM=blas in the environment keeps libxsmm and the vector code out, =addmm all
/// three, =libxsmm the vector code, =vector takes it on every vector set.
const char* gemm_route();

/// The kernel family the process's BLAS runs, where the BLAS names it: OpenBLAS's core name
/// (`openblas_get_corename()`, such as "Haswell", "SkylakeX" or "Cooperlake"), read once; nullptr
/// for a BLAS that does not say or a process without one.
const char* blas_core_name();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
