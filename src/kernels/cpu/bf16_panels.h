#pragma once

// The blocking that the bfloat16 products share on every instruction set
// (kernels/cpu/bf16_products_avx512.cpp, kernels/cpu/bf16_products_neon.cpp): C in panels of 4
// vectors of columns, outside, and blocks of up to 4 rows of each panel, inside, so that a panel of
// B stays in the first-level cache while every row of A meets it; a panel's last vector may be
// partial. A set provides its block kernel as Block<Rows, Vectors>::run(k, alpha, a, lda, b, ldb,
// accumulate, c, ldc, tail), `tail` what tail_of(count) makes of the last vector's column count.

#include <algorithm>
#include <cstdint>

namespace attention {
namespace kernels {
namespace cpu {

constexpr int kBf16BlockRows = 4;     // rows of C per block
constexpr int kBf16BlockVectors = 4;  // vectors of C per block row

// Block<rows, vectors>::run, rows and vectors from 1 to 4.
template <template <int, int> class Block, int Rows>
auto bf16_block_of(int vectors) -> decltype(&Block<Rows, 1>::run) {
  switch (vectors) {
    case 1:
      return &Block<Rows, 1>::run;
    case 2:
      return &Block<Rows, 2>::run;
    case 3:
      return &Block<Rows, 3>::run;
    default:
      return &Block<Rows, 4>::run;
  }
}

template <template <int, int> class Block>
auto bf16_block_of(int rows, int vectors) -> decltype(&Block<1, 1>::run) {
  switch (rows) {
    case 1:
      return bf16_block_of<Block, 1>(vectors);
    case 2:
      return bf16_block_of<Block, 2>(vectors);
    case 3:
      return bf16_block_of<Block, 3>(vectors);
    default:
      return bf16_block_of<Block, 4>(vectors);
  }
}

// The contract of Bf16Products::product over vectors of `Lanes` floats.
template <template <int, int> class Block, int64_t Lanes, typename TailOf>
void bf16_product_in_panels(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                            int64_t lda, const uint32_t* b, int64_t ldb, bool accumulate, float* c,
                            int64_t ldc, TailOf tail_of) {
  constexpr int64_t kPanel = Lanes * kBf16BlockVectors;
  for (int64_t j = 0; j < n; j += kPanel) {
    const int64_t cols = std::min(kPanel, n - j);
    const int vectors = static_cast<int>((cols + Lanes - 1) / Lanes);
    const auto tail = tail_of(cols - Lanes * (vectors - 1));
    const auto full = bf16_block_of<Block>(kBf16BlockRows, vectors);
    int64_t i = 0;
    for (; i + kBf16BlockRows <= m; i += kBf16BlockRows) {
      full(k, alpha, a + i * lda, lda, b + j, ldb, accumulate, c + i * ldc + j, ldc, tail);
    }
    if (i < m) {
      bf16_block_of<Block>(static_cast<int>(m - i), vectors)(
          k, alpha, a + i * lda, lda, b + j, ldb, accumulate, c + i * ldc + j, ldc, tail);
    }
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
