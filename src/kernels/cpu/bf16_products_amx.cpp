// The bfloat16 products on AMX tiles (Intel Sapphire Rapids and later:
// kernels/cpu/bf16_products.h). tdpbf16ps multiplies a tile of 16 rows by 32 bfloat16 values (A)
// with a tile of 16 pair rows by 16 words (B, the very layout of our pair rows) into 16 x 16 floats
// (C): 8192 products in one instruction, where vdpbf16ps makes 32. C is computed in blocks of 32 x
// 32 floats, four tiles held while the contracted dimension goes by 32 values at a time; A and B
// are read in place, each tile load striding over their rows.
//
// Tiles are whole: the rows of C below the last multiple of 16, its columns right of the last
// multiple of 16 and the contracted values past the last multiple of 32 are left to the AVX-512
// products, which the processor has beside AMX. A tile load would read whole rows, and the
// contract reads nothing past m rows, n columns or k values.
//
// The tile configuration is thread state that other libraries (oneDNN, under LibTorch's own
// bfloat16 matmuls) set and release between our calls, so each product loads its own and releases
// it when done; loading it takes a few tens of cycles against the thousands of a product here.
// Linux hands a process the tile registers only once it asks for them (arch_prctl
// ARCH_REQ_XCOMP_PERM): processor_has_amx_bf16() asks, and the route exists only where it was
// granted.

#include "kernels/cpu/bf16_products.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_HAS_AMX_CODE 1
#include <immintrin.h>
#else
#define ATTENTION_HAS_AMX_CODE 0
#endif

namespace attention {
namespace kernels {
namespace cpu {

#if ATTENTION_HAS_AMX_CODE

namespace {

#define ATTENTION_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int64_t kTileRows = 16;    // rows of every tile
constexpr int64_t kTileFloats = 16;  // floats (or words: pairs) in a row of a C (or B) tile
constexpr int64_t kTileDepth = 32;   // bfloat16 values in a row of an A tile

// The layout ldtilecfg reads (palette 1): tiles 0 to 7 all 16 rows of 64 bytes. Tiles 0 to 3 hold
// C's four tiles, 4 and 5 A's two, 6 and 7 B's two.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};

  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      bytes_per_row[t] = 64;
      rows[t] = static_cast<uint8_t>(kTileRows);
    }
  }
};

// C's tile (r, c) of a block, as float rows: scaled by alpha and added to C's old value where the
// tile could not start from it.
ATTENTION_AMX ATTENTION_ALWAYS_INLINE void finish_tile(const float* sums, float alpha,
                                                       bool accumulate, float* c, int64_t ldc) {
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int64_t r = 0; r < kTileRows; ++r) {
    __m512 result = _mm512_mul_ps(_mm512_load_ps(sums + r * kTileFloats), scale);
    if (accumulate) result = _mm512_add_ps(result, _mm512_loadu_ps(c + r * ldc));
    _mm512_storeu_ps(c + r * ldc, result);
  }
}

// C's block (rows x cols, cols a multiple of 16) times alpha, in place.
ATTENTION_AMX ATTENTION_ALWAYS_INLINE void scale_block(float alpha, int64_t rows, int64_t cols,
                                                       float* c, int64_t ldc) {
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; j += kTileFloats) {
      float* at = c + r * ldc + j;
      _mm512_storeu_ps(at, _mm512_mul_ps(_mm512_loadu_ps(at), scale));
    }
  }
}

// One block of C: `Rows` x `Cols` tiles (each 1 or 2) at c, over k (a multiple of 32). With alpha
// 1 the tiles start from C's old value (or zero) and are stored to it; otherwise their sums are
// scaled on the way out.
template <int Rows, int Cols>
ATTENTION_AMX void block(int64_t k, float alpha, const uint16_t* a, int64_t lda, const uint32_t* b,
                         int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const int64_t a_stride = lda * 2, b_stride = ldb * 4, c_stride = ldc * 4;
  const bool in_place = alpha == 1.0f;
  float* c01 = c + kTileFloats;
  float* c10 = c + kTileRows * ldc;
  float* c11 = c10 + kTileFloats;
  if (in_place && accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (Cols > 1) _tile_loadd(1, c01, c_stride);
    if constexpr (Rows > 1) _tile_loadd(2, c10, c_stride);
    if constexpr (Rows > 1 && Cols > 1) _tile_loadd(3, c11, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (Cols > 1) _tile_zero(1);
    if constexpr (Rows > 1) _tile_zero(2);
    if constexpr (Rows > 1 && Cols > 1) _tile_zero(3);
  }
  for (int64_t p = 0; p < k; p += kTileDepth) {
    _tile_loadd(4, a + p, a_stride);
    if constexpr (Rows > 1) _tile_loadd(5, a + kTileRows * lda + p, a_stride);
    _tile_loadd(6, b + p / 2 * ldb, b_stride);
    if constexpr (Cols > 1) _tile_loadd(7, b + p / 2 * ldb + kTileFloats, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Cols > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (Rows > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (Rows > 1 && Cols > 1) _tile_dpbf16ps(3, 5, 7);
  }
  if (in_place || !accumulate) {
    _tile_stored(0, c, c_stride);
    if constexpr (Cols > 1) _tile_stored(1, c01, c_stride);
    if constexpr (Rows > 1) _tile_stored(2, c10, c_stride);
    if constexpr (Rows > 1 && Cols > 1) _tile_stored(3, c11, c_stride);
    if (!in_place) scale_block(alpha, Rows * kTileRows, Cols * kTileFloats, c, ldc);
    return;
  }
  alignas(64) float sums[4][kTileRows * kTileFloats];
  constexpr int64_t kSumsStride = kTileFloats * 4;
  _tile_stored(0, sums[0], kSumsStride);
  finish_tile(sums[0], alpha, accumulate, c, ldc);
  if constexpr (Cols > 1) {
    _tile_stored(1, sums[1], kSumsStride);
    finish_tile(sums[1], alpha, accumulate, c01, ldc);
  }
  if constexpr (Rows > 1) {
    _tile_stored(2, sums[2], kSumsStride);
    finish_tile(sums[2], alpha, accumulate, c10, ldc);
  }
  if constexpr (Rows > 1 && Cols > 1) {
    _tile_stored(3, sums[3], kSumsStride);
    finish_tile(sums[3], alpha, accumulate, c11, ldc);
  }
}

// C's whole tiles (m and n multiples of 16) over k (a multiple of 32), in blocks of 2 x 2 tiles
// and their edges of 1.
ATTENTION_AMX void whole_tiles(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                               int64_t lda, const uint32_t* b, int64_t ldb, bool accumulate,
                               float* c, int64_t ldc) {
  static const TileConfig config;
  _tile_loadconfig(&config);
  constexpr int64_t kBlock = 2 * kTileRows;
  for (int64_t j = 0; j < n; j += kBlock) {
    const bool two_cols = j + kBlock <= n;
    for (int64_t i = 0; i < m; i += kBlock) {
      const bool two_rows = i + kBlock <= m;
      const uint16_t* a_i = a + i * lda;
      const uint32_t* b_j = b + j;
      float* c_ij = c + i * ldc + j;
      if (two_rows && two_cols) {
        block<2, 2>(k, alpha, a_i, lda, b_j, ldb, accumulate, c_ij, ldc);
      } else if (two_rows) {
        block<2, 1>(k, alpha, a_i, lda, b_j, ldb, accumulate, c_ij, ldc);
      } else if (two_cols) {
        block<1, 2>(k, alpha, a_i, lda, b_j, ldb, accumulate, c_ij, ldc);
      } else {
        block<1, 1>(k, alpha, a_i, lda, b_j, ldb, accumulate, c_ij, ldc);
      }
    }
  }
  _tile_release();
}

const Bf16Products* avx512_set = nullptr;  // the edges' products and every other pass

void product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
             const uint32_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const int64_t m_tiles = m / kTileRows * kTileRows;
  const int64_t n_tiles = n / kTileFloats * kTileFloats;
  const int64_t k_tiles = k / kTileDepth * kTileDepth;
  if (m_tiles == 0 || n_tiles == 0 || k_tiles == 0) {
    return avx512_set->product(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  }
  whole_tiles(m_tiles, n_tiles, k_tiles, alpha, a, lda, b, ldb, accumulate, c, ldc);
  if (k_tiles < k) {  // the rest of the contracted values, added to the tiles' sums
    avx512_set->product(m_tiles, n_tiles, k - k_tiles, alpha, a + k_tiles, lda,
                        b + k_tiles / 2 * ldb, ldb, true, c, ldc);
  }
  if (n_tiles < n) {  // the columns right of the tiles, down to the tiles' last row
    avx512_set->product(m_tiles, n - n_tiles, k, alpha, a, lda, b + n_tiles, ldb, accumulate,
                        c + n_tiles, ldc);
  }
  if (m_tiles < m) {  // the rows below the tiles, every column
    avx512_set->product(m - m_tiles, n, k, alpha, a + m_tiles * lda, lda, b, ldb, accumulate,
                        c + m_tiles * ldc, ldc);
  }
}

Bf16Products amx_set_over(const Bf16Products& avx512) {
  Bf16Products set = avx512;  // its roundings, packing and transposes
  set.name = "amx_bf16";
  set.product = product;
  return set;
}

}  // namespace

const Bf16Products* amx_bf16_products() {
  static const Bf16Products* const set = []() -> const Bf16Products* {
    const Bf16Products* avx512 = avx512_bf16_products();
    if (avx512 == nullptr || !processor_has_amx_bf16()) return nullptr;
    avx512_set = avx512;
    static const Bf16Products amx = amx_set_over(*avx512);
    return &amx;
  }();
  return set;
}

#else

const Bf16Products* amx_bf16_products() {
  return nullptr;
}

#endif

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
