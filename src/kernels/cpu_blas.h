#pragma once

// Matrix products of the fused CPU kernels on raw row-major pointers. A tile's products are
// small (a few hundred KFLOP each) and many (tens of thousands per call), so the cost of
// reaching BLAS is part of the kernel's time: LibTorch's own raw entry (at::native::cpublas)
// is not exported by every generation, and addmm on views of the pointers spends 5-9 us of
// dispatch on every tile. The Fortran BLAS that LibTorch itself loaded is called directly
// where the process has one, and addmm remains the route everywhere else.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// Row-major C (m x n, row stride ldc) = alpha * op(A) * op(B) + beta * C, where op(A) is m x k
/// (A itself is k x m when trans_a) and op(B) is k x n; rows of A and B have strides lda and ldb.
/// With beta = 0, C is not read. For float and double.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

/// The same product through LibTorch's addmm on views of the pointers: the route gemm() takes
/// when the process has no usable BLAS symbol.
template <typename T>
void gemm_through_addmm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                        const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                        int64_t ldc);

/// Which route gemm() takes in this process: "blas" (sgemm_/dgemm_ called directly) or
/// "addmm". ATTENTION_CPU_GEMM=addmm in the environment forces the second.
const char* gemm_route();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
