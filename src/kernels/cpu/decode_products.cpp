#include "kernels/cpu/decode_products.h"
#include "platform/cpu_features.h"

namespace attention {
namespace kernels {
namespace cpu {

const DecodeProducts* decode_products() {
  static const DecodeProducts* const chosen =
      chosen_vector_set(avx512_decode_products(), avx2_decode_products());
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
