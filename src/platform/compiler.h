#pragma once

// Compiler attributes the CPU code uses: several copies of a loop chosen per processor, and
// helpers forced inline into those copies.

// Several copies of a loop, one per instruction set, chosen when the library loads.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTENTION_MULTIVERSION \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define ATTENTION_MULTIVERSION
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ATTENTION_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ATTENTION_ALWAYS_INLINE inline
#endif
