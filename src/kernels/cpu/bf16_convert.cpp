#include "kernels/cpu/bf16_convert.h"
#include "platform/compiler.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

// Elements per piece of work: a few hundred KiB each way, enough to hide a task's start.
constexpr int64_t kGrain = 1 << 16;

// Loops the compiler vectorizes, inlined into each function below, which is built for the
// baseline and for the wider instruction sets.
ATTENTION_ALWAYS_INLINE void widen_elements(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, sizeof bits);
  }
}

ATTENTION_ALWAYS_INLINE void round_elements(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, sizeof bits);
    const uint32_t nearest_even = bits + 0x7FFFu + ((bits >> 16) & 1u);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    out[i] = nan ? uint16_t{0x7FC0} : static_cast<uint16_t>(nearest_even >> 16);
  }
}

ATTENTION_MULTIVERSION void widen_run(const uint16_t* in, float* out, int64_t n) {
  widen_elements(in, out, n);
}

ATTENTION_MULTIVERSION void round_run(const float* in, uint16_t* out, int64_t n) {
  round_elements(in, out, n);
}

ATTENTION_MULTIVERSION void widen_rows(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t n,
                                       float* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) widen_elements(in + r * ld_in, out + r * ld_out, n);
}

ATTENTION_MULTIVERSION void round_rows(const float* in, int64_t ld_in, int64_t rows, int64_t n,
                                       uint16_t* out, int64_t ld_out) {
  for (int64_t r = 0; r < rows; ++r) round_elements(in + r * ld_in, out + r * ld_out, n);
}

}  // namespace

void widen_bf16_rows(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t n, float* out,
                     int64_t ld_out) {
  widen_rows(in, ld_in, rows, n, out, ld_out);
}

void round_to_bf16_rows(const float* in, int64_t ld_in, int64_t rows, int64_t n, uint16_t* out,
                        int64_t ld_out) {
  round_rows(in, ld_in, rows, n, out, ld_out);
}

void widen_bf16(const uint16_t* in, float* out, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { widen_run(in + b, out + b, e - b); });
}

void round_to_bf16(const float* in, uint16_t* out, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { round_run(in + b, out + b, e - b); });
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
