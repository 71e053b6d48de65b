#pragma once

// Large row-major products (a module's projections and their gradients) on the generated
// small-product kernels (gemm/small_gemm.h), tile by tile across LibTorch's threads. A system BLAS
// picks its kernels by the processor models it knows: Debian 12's OpenBLAS 0.3.21 takes its AVX2
// (Haswell) kernels on AMD Zen 5, which has AVX-512, and reaches about half of what its own
// AVX-512 kernels reach there; libxsmm's generator writes code for the processor found at run
// time, whatever its age relative to the BLAS. Where the BLAS does run AVX-512 kernels (the same
// OpenBLAS on Intel Sapphire Rapids and on AMD Zen 4), it is as fast or faster for these shapes,
// and the projections stay there (large_gemm_preferred()).

#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

/// Row-major C (m x n, row stride ldc) = op(A) B with op(A) m x k (A itself k x m when trans_a),
/// or C += op(A) B when `accumulate`; rows of A and B have strides lda and ldb. Without
/// `accumulate` C is written, not read. Tiles of C go to generated
/// kernels, each through cpu::gemm (so a tile without a kernel takes BLAS); contractions longer
/// than kMaxSmallGemmSide are summed in pieces, as BLAS sums its panels. Returns false and
/// leaves C untouched where it does not take the product: generated kernels unavailable or
/// switched off (small_gemm_enabled()), a side not a positive multiple of kSmallGemmGranule, or a
/// stride shorter than its row. For float and double.
/// Whether the modules' projections take large_gemm() in this process, decided once: where the
/// generated kernels are available and generated_beats_blas() says so for this processor and
/// BLAS. ATTENTION_CPU_PROJECTIONS=generated or =blas in the environment decides instead
/// (generated still needs the kernels).
bool large_gemm_preferred();

/// The rule large_gemm_preferred() applies: the generated kernels beat the BLAS for large
/// products where the processor has AVX-512F and the BLAS is OpenBLAS on kernels without it
/// (`openblas_core` is its core name, nullptr for another BLAS, which is trusted to pick its own).
bool generated_beats_blas(bool processor_has_avx512, const char* openblas_core);

template <typename T>
bool large_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                int64_t ldb, T* c, int64_t ldc, bool accumulate = false);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
