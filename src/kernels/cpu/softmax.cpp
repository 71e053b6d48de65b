#include "kernels/cpu/softmax.h"

#include <cstdlib>
#include <cstring>

namespace attention {
namespace kernels {
namespace cpu {

const SoftmaxPasses* softmax_passes() {
  static const SoftmaxPasses* const chosen = []() -> const SoftmaxPasses* {
    const char* forced = std::getenv("ATTENTION_CPU_VECTOR");
    if (forced != nullptr && std::strcmp(forced, "portable") == 0) return nullptr;
    const bool avx2_asked = forced != nullptr && std::strcmp(forced, "avx2") == 0;
    if (!avx2_asked && avx512_softmax_passes() != nullptr) return avx512_softmax_passes();
    return avx2_softmax_passes();
  }();
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
