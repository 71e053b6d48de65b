#include "gemm/large_gemm.h"

#include "gemm/blas.h"
#include "gemm/small_gemm.h"
#include "platform/cpu_features.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

// Tiles of C: 128 rows of A (384 KiB at 768 features in float) stay in the core's L2 while the
// columns of B pass; 64 columns keep the kernels' accumulators in registers. Sizes 64 to 128 on
// either side measured within the machine's noise of one another for the Raschka training step.
constexpr int64_t kTileRows = 128;
constexpr int64_t kTileCols = 64;
// Contractions up to the generated kernels' bound are taken whole (one kernel, beta 0); longer
// ones (the weight gradient sums over every token) in pieces of this many.
constexpr int64_t kPiece = 512;

bool takes(bool trans_a, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  const auto granular = [](int64_t side) { return side > 0 && side % kSmallGemmGranule == 0; };
  return small_gemm_enabled() && granular(m) && granular(n) && granular(k) &&
         lda >= (trans_a ? m : k) && ldb >= n && ldc >= n;
}

}  // namespace

bool generated_beats_blas(bool processor_has_avx512, const char* openblas_core) {
  // No name (another BLAS, or an OpenBLAS that does not say) is trusted to pick its own kernels.
  if (!processor_has_avx512 || openblas_core == nullptr || *openblas_core == '\0') return false;
  std::string core(openblas_core);
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  // OpenBLAS's x86-64 cores with AVX-512 kernels (0.3.21 has the first two; 0.3.22 added the
  // third). Every other core name on an AVX-512 processor is an older family's kernels.
  for (const char* wide : {"skylakex", "cooperlake", "sapphirerapids"}) {
    if (core == wide) return false;
  }
  return true;
}

bool large_gemm_preferred() {
  static const bool preferred = [] {
    if (!small_gemm_enabled()) return false;
    const char* forced = std::getenv("ATTENTION_CPU_PROJECTIONS");
    if (forced != nullptr && std::strcmp(forced, "generated") == 0) return true;
    if (forced != nullptr && std::strcmp(forced, "blas") == 0) return false;
    return generated_beats_blas(processor_has_avx512f(), blas_core_name());
  }();
  return preferred;
}

template <typename T>
bool large_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if (!takes(trans_a, m, n, k, lda, ldb, ldc)) return false;
  const int64_t piece = k <= kMaxSmallGemmSide ? k : kPiece;
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (n + kTileCols - 1) / kTileCols;
  // Row tiles outermost: a thread's consecutive tiles share their rows of A.
  at::parallel_for(0, row_tiles * col_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(kTileRows * kTileCols);  // a piece's product before it is added
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = tile / col_tiles * kTileRows, c0 = tile % col_tiles * kTileCols;
      const int64_t rows = std::min(kTileRows, m - r0), cols = std::min(kTileCols, n - c0);
      for (int64_t k0 = 0; k0 < k; k0 += piece) {
        const T* a_piece = trans_a ? a + k0 * lda + r0 : a + r0 * lda + k0;
        gemm<T>(trans_a, false, rows, cols, std::min(piece, k - k0), T(1), a_piece, lda,
                b + k0 * ldb + c0, ldb, k0 == 0 && !accumulate ? T(0) : T(1), c + r0 * ldc + c0,
                ldc, scratch.data());
      }
    }
  });
  return true;
}

template bool large_gemm<float>(bool, int64_t, int64_t, int64_t, const float*, int64_t,
                                const float*, int64_t, float*, int64_t, bool);
template bool large_gemm<double>(bool, int64_t, int64_t, int64_t, const double*, int64_t,
                                 const double*, int64_t, double*, int64_t, bool);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
