// The exponential passes (kernels/cpu/softmax.h), written once with Google Highway and compiled
// for each instruction set below (hwy/foreach_target.h includes this file once per target):
// AVX-512F and AVX2 with FMA on x86-64, NEON, SVE and SVE2 on aarch64. The process takes the best
// one its processor runs (hwy::SupportedTargets(), which also asks whether the operating system
// saves the wider registers), unless ATTENTION_CPU_VECTOR names another.

// The routes of this file: the x86 ones the library has always had, and ARM's. SSSE3 and SSE4
// would add two compiles for processors that the portable loops serve as well; the fixed-width
// SVE variants add nothing to the scalable ones here. The x86 targets above AVX3 (bits 0 to 7:
// AVX3_DL, and AVX3_ZEN4 and AVX3_SPR of Highway's later versions) add instructions these passes
// do not use.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | ((1LL << 8) - 1) | HWY_SVE_256 | HWY_SVE2_128)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/softmax_rows.h"

#include <cstring>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace attention {
namespace kernels {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
using M = hn::Mask<D>;

// Whether a masked load or store touches only its lanes. x86's and SVE's do; NEON's and the
// emulated target's load and store the whole vector, which past a row's last partial vector
// could run off its buffer, so there the partial vector goes through a copy on the stack.
#if HWY_ARCH_X86 || (HWY_TARGET & (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128))
constexpr bool kMaskedMemory = true;
#else
constexpr bool kMaskedMemory = false;
#endif

// The first `count` floats at p (0 < count < Lanes(d)), the other lanes 0.
HWY_INLINE V load_first(D d, const float* p, size_t count) {
  if (kMaskedMemory) return hn::MaskedLoad(hn::FirstN(d, count), d, p);
  HWY_ALIGN float part[HWY_MAX_BYTES / sizeof(float)] = {};
  std::memcpy(part, p, count * sizeof(float));
  return hn::Load(d, part);
}

// Stores the first `count` lanes of v at p, and nothing past them.
HWY_INLINE void store_first(D d, V v, float* p, size_t count) {
  if (kMaskedMemory) return hn::BlendedStore(v, hn::FirstN(d, count), d, p);
  HWY_ALIGN float part[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, part);
  std::memcpy(p, part, count * sizeof(float));
}

// The larger of a score and an accumulator that is never NaN, leaving a NaN score out.
HWY_INLINE V max_leaving_nan(V score, V acc) {
#if HWY_ARCH_X86
  return hn::Max(score, acc);  // vmaxps gives its second operand where either is NaN
#else
  return hn::IfThenElse(hn::Gt(score, acc), score, acc);  // NEON's and SVE's max give NaN
#endif
}

// e * 2^n for whole n in [-126, 1] (other lanes are cleared by the caller). AVX-512 has it in one
// instruction; elsewhere n + 127 goes into the exponent field: n plus 1.5 * 2^23 + 127 is exact and
// leaves n + 127 in the low bits of the sum, which the shift moves into the field. A NaN lane's
// field is garbage, and NaN times it stays NaN.
HWY_INLINE V times_power_of_two(D d, V e, V n) {
#if HWY_TARGET == HWY_AVX3
  (void)d;
  return V{_mm512_scalef_ps(e.raw, n.raw)};
#else
  const hn::RebindToSigned<D> di;
  const auto field = hn::ShiftLeft<23>(hn::BitCast(di, hn::Add(n, hn::Set(d, 12583039.0f))));
  return hn::Mul(e, hn::BitCast(d, field));
#endif
}

// exp(x) for x <= 0 (small positive x, from rounding, are fine): 0 where x is below -87 (results
// near 2^-126 and below, as exp_nonpositive gives) or where `keep` is clear, NaN where x is NaN.
// x = n ln 2 + r with n = round(x / ln 2) and ln 2 in two parts (Cody and Waite's, as in Cephes:
// n ln2_hi is exact for every n here), then e^r on [-ln 2 / 2, ln 2 / 2] as 1 + r q(r), q of
// degree 5 fitted for the least largest relative error (2.2e-9). Within 1.04 ulp of exp over
// [-87, 0]; exp(0) is exactly 1.
HWY_INLINE V exp_nonpositive(D d, V x, M keep) {
  // "Not less than": NaN lanes are kept, and stay NaN through every step.
  const M kept = hn::AndNot(hn::Lt(x, hn::Set(d, -87.0f)), keep);
  const V n = hn::Round(hn::Mul(x, hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V q = hn::Set(d, 0.0013847306836396456f);
  q = hn::MulAdd(q, r, hn::Set(d, 0.00837505143135786f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.04166798293590546f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.16666419804096222f));
  q = hn::MulAdd(q, r, hn::Set(d, 0.4999999403953552f));
  q = hn::MulAdd(q, r, hn::Set(d, 1.0f));
  const V e = hn::MulAdd(q, r, hn::Set(d, 1.0f));
  return hn::IfThenElseZero(kept, times_power_of_two(d, e, n));
}

// The row primitives of kernels/cpu/softmax_rows.h.
struct Lanes {
  // Four accumulators, so that the pass is not one chain of maxima.
  static float row_maximum(const float* row, int64_t seen) {
    const D d;
    const size_t n = hn::Lanes(d);
    const V none = hn::Set(d, -std::numeric_limits<float>::infinity());
    V m0 = none, m1 = none, m2 = none, m3 = none;
    size_t j = 0;
    const size_t count = static_cast<size_t>(seen);
    for (; j + 4 * n <= count; j += 4 * n) {
      m0 = max_leaving_nan(hn::LoadU(d, row + j), m0);
      m1 = max_leaving_nan(hn::LoadU(d, row + j + n), m1);
      m2 = max_leaving_nan(hn::LoadU(d, row + j + 2 * n), m2);
      m3 = max_leaving_nan(hn::LoadU(d, row + j + 3 * n), m3);
    }
    for (; j + n <= count; j += n) m0 = max_leaving_nan(hn::LoadU(d, row + j), m0);
    if (j < count) {
      const V x = hn::IfThenElse(hn::FirstN(d, count - j), load_first(d, row + j, count - j), none);
      m1 = max_leaving_nan(x, m1);
    }
    return hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
  }

  static float exponentials(float* row, int64_t seen, float shift) {
    const D d;
    const size_t n = hn::Lanes(d);
    const V by = hn::Set(d, shift);
    const M all = hn::FirstN(d, n);
    V a0 = hn::Zero(d), a1 = hn::Zero(d);
    size_t j = 0;
    const size_t count = static_cast<size_t>(seen);
    for (; j + 2 * n <= count; j += 2 * n) {
      const V e0 = exp_nonpositive(d, hn::Sub(hn::LoadU(d, row + j), by), all);
      const V e1 = exp_nonpositive(d, hn::Sub(hn::LoadU(d, row + j + n), by), all);
      hn::StoreU(e0, d, row + j);
      hn::StoreU(e1, d, row + j + n);
      a0 = hn::Add(a0, e0);
      a1 = hn::Add(a1, e1);
    }
    for (; j + n <= count; j += n) {
      const V e = exp_nonpositive(d, hn::Sub(hn::LoadU(d, row + j), by), all);
      hn::StoreU(e, d, row + j);
      a0 = hn::Add(a0, e);
    }
    if (j < count) {
      const size_t rest = count - j;
      const V x = hn::Sub(load_first(d, row + j, rest), by);
      const V e = exp_nonpositive(d, x, hn::FirstN(d, rest));  // lanes past the row give 0
      store_first(d, e, row + j, rest);
      a1 = hn::Add(a1, e);
    }
    return hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  }

  static void scale_row(float* a, int64_t count, float by) {
    const D d;
    const size_t n = hn::Lanes(d);
    const V b = hn::Set(d, by);
    size_t c = 0;
    const size_t total = static_cast<size_t>(count);
    for (; c + n <= total; c += n) hn::StoreU(hn::Mul(hn::LoadU(d, a + c), b), d, a + c);
    if (c < total) store_first(d, hn::Mul(load_first(d, a + c, total - c), b), a + c, total - c);
  }

  static void probabilities_row(const float* score, float* prob, int64_t seen, float lse) {
    const D d;
    const size_t n = hn::Lanes(d);
    const V hidden = hn::Set(d, -std::numeric_limits<float>::infinity());
    const V row_lse = hn::Set(d, lse);
    size_t j = 0;
    const size_t count = static_cast<size_t>(seen);
    // A hidden key gets 0 even where the row's log-sum-exp is NaN; a NaN score stays NaN.
    for (; j + n <= count; j += n) {
      const V x = hn::LoadU(d, score + j);
      hn::StoreU(exp_nonpositive(d, hn::Sub(x, row_lse), hn::Not(hn::Eq(x, hidden))), d, prob + j);
    }
    if (j < count) {
      const size_t rest = count - j;
      const V x = load_first(d, score + j, rest);
      const M visible = hn::AndNot(hn::Eq(x, hidden), hn::FirstN(d, rest));
      store_first(d, exp_nonpositive(d, hn::Sub(x, row_lse), visible), prob + j, rest);
    }
  }
};

void softmax_step(float* s, int64_t rows, int64_t cols, int64_t ld, bool causal, int64_t valid,
                  float* max, float* sum, float* acc, int64_t dv, int64_t acc_ld) {
  softmax_step_rows<Lanes>(s, rows, cols, ld, causal, valid, max, sum, acc, dv, acc_ld);
}

void probabilities(float* s, float* prob, int64_t rows, int64_t cols, bool causal, int64_t valid,
                   const float* lse) {
  probabilities_rows<Lanes>(s, prob, rows, cols, causal, valid, lse);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace kernels
}  // namespace attention
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include "platform/cpu_features.h"

namespace attention {
namespace kernels {
namespace cpu {

std::vector<const SoftmaxPasses*> supported_softmax_passes() {
  std::vector<const SoftmaxPasses*> supported;
  const int64_t runs = hwy::SupportedTargets();
  // A route compiled for TARGET (in Highway's namespace of it), where this processor runs it.
#define ATTENTION_SOFTMAX_ROUTE(TARGET, NAMESPACE, NAME)                  \
  if ((runs & (TARGET)) != 0) {                                           \
    static constexpr SoftmaxPasses passes{NAME, &NAMESPACE::softmax_step, \
                                          &NAMESPACE::probabilities};     \
    supported.push_back(&passes);                                         \
  }
  // Best first.
#if HWY_TARGETS & HWY_AVX3
  ATTENTION_SOFTMAX_ROUTE(HWY_AVX3, N_AVX3, "avx512")
#endif
#if HWY_TARGETS & HWY_AVX2
  ATTENTION_SOFTMAX_ROUTE(HWY_AVX2, N_AVX2, "avx2")
#endif
#if HWY_TARGETS & HWY_SVE2
  ATTENTION_SOFTMAX_ROUTE(HWY_SVE2, N_SVE2, "sve2")
#endif
#if HWY_TARGETS & HWY_SVE
  ATTENTION_SOFTMAX_ROUTE(HWY_SVE, N_SVE, "sve")
#endif
#if HWY_TARGETS & HWY_NEON
  ATTENTION_SOFTMAX_ROUTE(HWY_NEON, N_NEON, "neon")
#endif
#undef ATTENTION_SOFTMAX_ROUTE
  return supported;
}

const SoftmaxPasses* softmax_passes_named(const char* name) {
  for (const SoftmaxPasses* passes : supported_softmax_passes()) {
    if (std::strcmp(passes->name, name) == 0) return passes;
  }
  return nullptr;
}

const SoftmaxPasses* softmax_passes() {
  static const SoftmaxPasses* const chosen = chosen_vector_set(supported_softmax_passes());
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention

#endif  // HWY_ONCE
