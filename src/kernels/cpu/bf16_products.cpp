// The choice of bfloat16 products and the packing of their right operands
// (kernels/cpu/bf16_products.h): plain loops, which the compiler vectorizes where it can; a key
// or value block is packed once for all the query rows that read it.

#include "kernels/cpu/bf16_products.h"
#include "platform/cpu_features.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

namespace {

const char* route_asked() {
  return std::getenv("ATTENTION_CPU_BF16");
}

bool widened_asked() {
  const char* route = route_asked();
  if (route != nullptr && std::strcmp(route, "widened") == 0) return true;
  // The narrower vector routes have no bfloat16 products either.
  return vector_route_asked("portable") || vector_route_asked("avx2") || vector_route_asked("sse4");
}

// Whether a set beats the widened route on this processor, unasked. AVX512_BF16's vector products
// do on AMD's Zen 4 and later (vdpbf16ps at twice the float rate: the core 1.56-1.66x float32),
// not on Intel's processors, whose vdpbf16ps runs at the float rate: on a Sapphire Rapids with its
// tiles left unused the core took 1.47-1.50x float32's time on them and 1.01-1.02x widened
// (docs/PERFORMANCE.md). Intel's processors take AMX's tiles where they have them, else widen.
bool vector_products_pay(const Bf16Products* set) {
  if (std::strcmp(set->name, "avx512_bf16") != 0) return true;
  return processor_is_amd();
}

}  // namespace

std::vector<const Bf16Products*> processor_bf16_product_sets() {
  std::vector<const Bf16Products*> sets;
  for (const Bf16Products* set :
       {amx_bf16_products(), avx512_bf16_products(), neon_bf16_products()}) {
    if (set != nullptr) sets.push_back(set);
  }
  return sets;
}

const Bf16Products* processor_bf16_products() {
  const auto sets = processor_bf16_product_sets();
  return sets.empty() ? nullptr : sets.front();
}

const Bf16Products* bf16_products() {
  static const Bf16Products* const chosen = []() -> const Bf16Products* {
    if (widened_asked()) return nullptr;
    const auto sets = processor_bf16_product_sets();
    const char* route = route_asked();
    for (const Bf16Products* set : sets) {
      if (route != nullptr && std::strcmp(route, set->name) == 0) return set;
    }
    for (const Bf16Products* set : sets) {
      if (vector_products_pay(set)) return set;
    }
    return nullptr;
  }();
  return chosen;
}

void pack_row_pairs(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint32_t* out,
                    int64_t ld_out) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const uint16_t* low = in + 2 * p * ld_in;
    uint32_t* o = out + p * ld_out;
    if (2 * p + 1 == rows) {
      for (int64_t c = 0; c < cols; ++c) o[c] = low[c];
      continue;
    }
    const uint16_t* high = low + ld_in;
    for (int64_t c = 0; c < cols; ++c) o[c] = low[c] | static_cast<uint32_t>(high[c]) << 16;
  }
}

void pack_column_pairs(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint32_t* out,
                       int64_t ld_out) {
  const int64_t whole = cols / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = in + r * ld_in;
    for (int64_t p = 0; p < whole; ++p) {
      out[p * ld_out + r] = row[2 * p] | static_cast<uint32_t>(row[2 * p + 1]) << 16;
    }
    if (cols % 2 != 0) out[whole * ld_out + r] = row[cols - 1];
  }
}

void transpose_16(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                  int64_t ld_out) {
  // In squares of 32, so that the rows written stay in the first-level cache while they fill.
  constexpr int64_t kSquare = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kSquare) {
    for (int64_t c0 = 0; c0 < cols; c0 += kSquare) {
      for (int64_t c = c0; c < std::min(cols, c0 + kSquare); ++c) {
        for (int64_t r = r0; r < std::min(rows, r0 + kSquare); ++r) {
          out[c * ld_out + r] = in[r * ld_in + c];
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
