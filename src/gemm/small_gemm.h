#pragma once

// The fused CPU kernels' tile products through libxsmm, where the build has it. A tile product
// is small (head dimension 64, blocks of 64 to 512) and a general BLAS spends a good part of it
// packing both operands and scaling C; libxsmm's generator writes, once per shape, a kernel that
// reads the operands in place, kept by the library (gemm/code_cache.h). Its kernels compute
// column-major C = A B and C = A B^T with alpha 1 and beta 0 or 1, which are the row-major products
// C = A B and C = A^T B: the kernels hand it keys and values already transposed
// (cpu::transpose_scaled) for the products that contract two operands' rows (scores = Q K^T), with
// the scale folded in. A generated kernel given beta 1 adds each term to C in turn, rounded at C's
// size, which loses digits where C accumulates many tiles (a key block's gradients over every query
// block): such a product is made in the caller's scratch and added to C once, as BLAS does.

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// The largest side of a product small_gemm() takes (the largest Chunked block size).
constexpr int64_t kMaxSmallGemmSide = 1024;

/// Every side of a product small_gemm() takes is a multiple of this: the kernels' full tiles and
/// aligned strips. The code of every shape generated stays for the process's lifetime,
/// so the ragged shapes of each sequence length's last block, which would add kernels for every
/// new length, go to BLAS instead and the generated code stays bounded.
constexpr int64_t kSmallGemmGranule = 16;

/// The product of cpu::gemm (same arguments, row-major) through a kernel libxsmm generated for
/// its shape; with beta 1, `scratch` (m x n elements) holds the product before it is added to C.
/// Returns false and leaves C untouched where it does not take the product: a build without
/// libxsmm, ATTENTION_CPU_GEMM set to blas or addmm, B transposed, alpha other than 1, beta
/// other than 0 and 1, beta 1 without scratch, a side above kMaxSmallGemmSide or not a multiple
/// of kSmallGemmGranule, a stride libxsmm cannot take, no kernel for this processor, or the kernel
/// cache full. For float and double.
template <typename T>
bool small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T* scratch);

/// Whether small_gemm() takes products in this process: libxsmm built in, not switched off by
/// ATTENTION_CPU_GEMM, and its kernels checked once against known results.
bool small_gemm_enabled();

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
