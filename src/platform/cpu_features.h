#pragma once

// What the processor running this process offers, asked once where a kernel picks its route at
// run time (the exponential passes, the paged forward's products, the projections' generated
// kernels).

#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

/// Whether the processor has AVX512_BF16 (vdpbf16ps, vcvtneps2bf16) with AVX-512F: AMD Zen 4 and
/// later, Intel Cooper Lake and Sapphire Rapids on. Asked of CPUID (leaf 7, subleaf 1, EAX bit 5),
/// which the compilers' __builtin_cpu_supports does not name in every version here.
inline bool processor_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!processor_has_avx512f() || __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0)
    return false;
  return (eax >> 5 & 1u) != 0;
#else
  return false;
#endif
}

/// Whether the processor is AMD's (CPUID's vendor "AuthenticAMD"): where AVX512_BF16's vdpbf16ps
/// runs at twice the float multiply-add's rate (Zen 4 and later). Intel's runs at the float rate,
/// so that its vector bfloat16 products lose to the widened route there
/// (kernels/cpu/bf16_products.h).
inline bool processor_is_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  char vendor[12];
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return std::memcmp(vendor, "AuthenticAMD", 12) == 0;
#else
  return false;
#endif
}

/// Whether this process may run AMX's bfloat16 tile products (Intel Sapphire Rapids and later):
/// CPUID's AMX-TILE and AMX-BF16 (leaf 7, subleaf 0, EDX bits 24 and 22), and Linux's leave to
/// use the tile registers, which a process must ask for (arch_prctl ARCH_REQ_XCOMP_PERM for
/// XTILEDATA, granted to every thread of the process). Asked once; false off Linux on x86-64.
inline bool processor_has_amx_bf16() {
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
  static const bool granted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx >> 24 & 1u) == 0 || (edx >> 22 & 1u) == 0) return false;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
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

/// Whether ATTENTION_CPU_VECTOR asks for `route` ("portable", or a route's name: "avx512",
/// "avx2", "sse4", "sve2", "sve", "neon"): the switch every run-time choice of vector code reads.
inline bool vector_route_asked(const char* route) {
  const char* forced = std::getenv("ATTENTION_CPU_VECTOR");
  return forced != nullptr && std::strcmp(forced, route) == 0;
}

/// The set of a kernel's vector code a process takes, of the sets this processor runs (each with a
/// `name`), best first: the one ATTENTION_CPU_VECTOR names if it is there, nullptr (the
/// compiler-vectorized loops) where it asks for "portable" or where there is none, else the best.
template <class Set>
const Set* chosen_vector_set(const std::vector<const Set*>& supported) {
  if (vector_route_asked("portable")) return nullptr;
  for (const Set* set : supported) {
    if (vector_route_asked(set->name)) return set;
  }
  return supported.empty() ? nullptr : supported.front();
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
