#pragma once

// attention-bench's multiply-rates group: one core's rate of float, 16-bit and 8-bit vector
// products on AVX2, the instructions the decoding step's products take there.

#include <vector>

namespace attention_bench {

struct MultiplyRate {
  const char* instructions;  // the loop's instructions, one accumulation each
  const char* operands;      // "float", "16-bit" or "8-bit"
  double products_per_s;     // one thread's
};

/// The rates, each the best of `repeats` runs of eight independent accumulators; empty on a
/// processor without AVX2 and FMA, or off x86-64.
std::vector<MultiplyRate> multiply_rates(int repeats);

}  // namespace attention_bench
