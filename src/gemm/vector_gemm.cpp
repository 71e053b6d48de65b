// The float tile products of gemm/vector_gemm.h, written once with Google Highway and compiled for
// AVX-512F, AVX2 with FMA and NEON (which SVE processors run as well: scalable vectors cannot be
// kept in the arrays of registers these blocks hold).

#ifndef HWY_DISABLED_TARGETS
// The x86 targets above AVX3 (bits 0 to 7) add instructions these loops do not use; SSSE3 and
// SSE4 are the portable loops' processors.
#define HWY_DISABLED_TARGETS \
  (((1LL << 8) - 1) | HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gemm/vector_gemm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "gemm/vector_gemm.h"

#include <cstddef>

// The targets above; the others Highway compiles this file for (the baseline's) have no use for
// it.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_NEON

// The blocks' registers are arrays indexed by loops of constant bounds: unrolled whole, they stay
// in registers.
#define ATTENTION_UNROLL _Pragma("GCC unroll 16")

HWY_BEFORE_NAMESPACE();
namespace attention {
namespace kernels {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// Rows of C a block holds: 6 rows by 2 vectors are 12 sums, with the 2 vectors of B's row and
// the broadcast of A's value 15 of AVX2's 16 registers.
constexpr size_t kBlockRows = 6;

// C's rows [0, R) by W vectors of columns, = or += the sum over k of A's values (row r, column p
// at a[r * lda + p], or a[p * lda + r] with A transposed) times the panel's row p (W vectors).
template <size_t R, size_t W, bool kTransA>
HWY_INLINE void block(size_t k, const float* HWY_RESTRICT a, size_t lda,
                      const float* HWY_RESTRICT panel, float* HWY_RESTRICT c, size_t ldc,
                      bool add) {
  const D d;
  const size_t lanes = hn::Lanes(d);
  V sum[R][W];
  ATTENTION_UNROLL
  for (size_t r = 0; r < R; ++r) {
    ATTENTION_UNROLL
    for (size_t w = 0; w < W; ++w) sum[r][w] = hn::Zero(d);
  }
  for (size_t p = 0; p < k; ++p) {
    V columns[W];
    ATTENTION_UNROLL
    for (size_t w = 0; w < W; ++w) columns[w] = hn::Load(d, panel + (p * W + w) * lanes);
    ATTENTION_UNROLL
    for (size_t r = 0; r < R; ++r) {
      const V value = hn::Set(d, kTransA ? a[p * lda + r] : a[r * lda + p]);
      ATTENTION_UNROLL
      for (size_t w = 0; w < W; ++w) sum[r][w] = hn::MulAdd(value, columns[w], sum[r][w]);
    }
  }
  ATTENTION_UNROLL
  for (size_t r = 0; r < R; ++r) {
    ATTENTION_UNROLL
    for (size_t w = 0; w < W; ++w) {
      float* out = c + r * ldc + w * lanes;
      hn::StoreU(add ? hn::Add(hn::LoadU(d, out), sum[r][w]) : sum[r][w], d, out);
    }
  }
}

// C's columns [0, W vectors): B's rows packed into the panel once (contiguous and aligned: B's
// own rows may be a stride of a power of two apart, which maps them to a few cache sets), then
// every block of rows.
template <size_t W, bool kTransA>
void strip(size_t m, size_t k, const float* a, size_t lda, const float* b, size_t ldb,
           float* HWY_RESTRICT panel, float* c, size_t ldc, bool add) {
  const D d;
  const size_t lanes = hn::Lanes(d);
  for (size_t p = 0; p < k; ++p) {
    ATTENTION_UNROLL
    for (size_t w = 0; w < W; ++w) {
      hn::Store(hn::LoadU(d, b + p * ldb + w * lanes), d, panel + (p * W + w) * lanes);
    }
  }
  const auto rows_of_a = [&](size_t i) { return kTransA ? a + i : a + i * lda; };
  size_t i = 0;
  for (; i + kBlockRows <= m; i += kBlockRows) {
    block<kBlockRows, W, kTransA>(k, rows_of_a(i), lda, panel, c + i * ldc, ldc, add);
  }
  float* rest = c + i * ldc;
  switch (m - i) {
    case 5:
      return block<5, W, kTransA>(k, rows_of_a(i), lda, panel, rest, ldc, add);
    case 4:
      return block<4, W, kTransA>(k, rows_of_a(i), lda, panel, rest, ldc, add);
    case 3:
      return block<3, W, kTransA>(k, rows_of_a(i), lda, panel, rest, ldc, add);
    case 2:
      return block<2, W, kTransA>(k, rows_of_a(i), lda, panel, rest, ldc, add);
    case 1:
      return block<1, W, kTransA>(k, rows_of_a(i), lda, panel, rest, ldc, add);
    default:
      return;
  }
}

template <bool kTransA>
void columns(size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b, size_t ldb,
             float* panel, float* c, size_t ldc, bool add) {
  const size_t lanes = hn::Lanes(D());
  size_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    strip<2, kTransA>(m, k, a, lda, b + j, ldb, panel, c + j, ldc, add);
  }
  if (j < n) strip<1, kTransA>(m, k, a, lda, b + j, ldb, panel, c + j, ldc, add);
}

// The product on checked sizes (vector_gemm): n a multiple of lanes(), k at most
// kMaxVectorGemmSide, the panel that many rows of two vectors.
void product(bool trans_a, size_t m, size_t n, size_t k, const float* a, size_t lda, const float* b,
             size_t ldb, float* panel, float* c, size_t ldc, bool add) {
  if (trans_a) return columns<true>(m, n, k, a, lda, b, ldb, panel, c, ldc, add);
  columns<false>(m, n, k, a, lda, b, ldb, panel, c, ldc, add);
}

size_t lanes() {
  return hn::Lanes(D());
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace attention
HWY_AFTER_NAMESPACE();

#undef ATTENTION_UNROLL

#endif  // the targets above

#if HWY_ONCE

#include "platform/cpu_features.h"

#include <hwy/aligned_allocator.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

struct VectorGemm {
  const char* name;
  void (*product)(bool trans_a, size_t m, size_t n, size_t k, const float* a, size_t lda,
                  const float* b, size_t ldb, float* panel, float* c, size_t ldc, bool add);
  size_t (*lanes)();
};

std::vector<const VectorGemm*> supported_sets() {
  std::vector<const VectorGemm*> supported;
  const int64_t runs = hwy::SupportedTargets();
#define ATTENTION_VECTOR_GEMM_ROUTE(TARGET, NAMESPACE, NAME)                       \
  if ((runs & (TARGET)) != 0) {                                                    \
    static constexpr VectorGemm set{NAME, &NAMESPACE::product, &NAMESPACE::lanes}; \
    supported.push_back(&set);                                                     \
  }
  // Best first.
#if HWY_TARGETS & HWY_AVX3
  ATTENTION_VECTOR_GEMM_ROUTE(HWY_AVX3, N_AVX3, "avx512")
#endif
#if HWY_TARGETS & HWY_AVX2
  ATTENTION_VECTOR_GEMM_ROUTE(HWY_AVX2, N_AVX2, "avx2")
#endif
#if HWY_TARGETS & HWY_NEON
  ATTENTION_VECTOR_GEMM_ROUTE(HWY_NEON, N_NEON, "neon")
#endif
#undef ATTENTION_VECTOR_GEMM_ROUTE
  return supported;
}

// The set this process takes, nullptr for none. By default AVX2's only: there the generated
// kernels reach less of the processor's rate on the tiles' shapes; on AVX-512 they do better
// than these blocks, and the other sets have not been measured against BLAS.
const VectorGemm* taken_set() {
  static const VectorGemm* const taken = []() -> const VectorGemm* {
    const char* forced = std::getenv("ATTENTION_CPU_GEMM");
    const bool asked = forced != nullptr && std::strcmp(forced, "vector") == 0;
    if (forced != nullptr && *forced != '\0' && !asked) return nullptr;
    const VectorGemm* chosen = chosen_vector_set(supported_sets());
    if (chosen == nullptr) return nullptr;
    return asked || std::strcmp(chosen->name, "avx2") == 0 ? chosen : nullptr;
  }();
  return taken;
}

// The widest vector of the sets above, in floats (AVX-512's). HWY_MAX_BYTES is no help here: in
// this part of the file it is the baseline target's.
constexpr size_t kWidestLanes = 16;

// The thread's panel: kMaxVectorGemmSide rows of two of the widest vectors, allocated on the
// thread's first product and kept until it ends.
float* thread_panel() {
  thread_local hwy::AlignedFreeUniquePtr<float[]> panel;
  if (!panel) panel = hwy::AllocateAligned<float>(kMaxVectorGemmSide * 2 * kWidestLanes);
  return panel.get();
}

}  // namespace

bool vector_gemm_enabled() {
  return taken_set() != nullptr;
}

const char* vector_gemm_set() {
  const VectorGemm* set = taken_set();
  return set != nullptr ? set->name : nullptr;
}

bool vector_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  const VectorGemm* set = taken_set();
  if (set == nullptr || trans_b || alpha != 1.0f || (beta != 0.0f && beta != 1.0f)) return false;
  for (const int64_t side : {m, n, k}) {
    if (side <= 0 || side > kMaxVectorGemmSide) return false;
  }
  constexpr int64_t kMaxStride = (int64_t{1} << 31) - 1;
  if (lda > kMaxStride || ldb > kMaxStride || ldc > kMaxStride) return false;
  const size_t lanes = set->lanes();
  if (lanes > kWidestLanes || n % static_cast<int64_t>(lanes) != 0) return false;
  if (lda < (trans_a ? m : k) || ldb < n || ldc < n) return false;
  float* panel = thread_panel();
  if (panel == nullptr) return false;
  set->product(trans_a, static_cast<size_t>(m), static_cast<size_t>(n), static_cast<size_t>(k), a,
               static_cast<size_t>(lda), b, static_cast<size_t>(ldb), panel, c,
               static_cast<size_t>(ldc), beta == 1.0f);
  return true;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention

#endif  // HWY_ONCE
