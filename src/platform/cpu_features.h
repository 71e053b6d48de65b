#pragma once

// What the processor running this process offers, asked once where a kernel picks its route at
// run time (the exponential passes, the projections' generated kernels).

namespace attention {
namespace kernels {
namespace cpu {

/// Whether the processor has AVX-512F; false where the compiler cannot ask (off x86-64, or a
/// compiler without __builtin_cpu_supports).
inline bool processor_has_avx512f() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f") != 0;
#else
  return false;
#endif
}

/// Whether the processor has AVX2 and FMA (x86-64-v3's vector arithmetic); false where the
/// compiler cannot ask.
inline bool processor_has_avx2_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
#else
  return false;
#endif
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
