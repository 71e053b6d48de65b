#include "kernels/cpu/softmax.h"
#include "platform/cpu_features.h"

namespace attention {
namespace kernels {
namespace cpu {

const SoftmaxPasses* softmax_passes() {
  static const SoftmaxPasses* const chosen =
      chosen_vector_set(avx512_softmax_passes(), avx2_softmax_passes());
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
