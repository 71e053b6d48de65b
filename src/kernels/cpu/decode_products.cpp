#include "kernels/cpu/decode_products.h"
#include "platform/cpu_features.h"

namespace attention {
namespace kernels {
namespace cpu {

std::vector<const DecodeProducts*> supported_decode_products() {
  std::vector<const DecodeProducts*> supported;
  for (const DecodeProducts* set :
       {avx512_decode_products(), avx2_decode_products(), vector128_decode_products()}) {
    if (set != nullptr) supported.push_back(set);
  }
  return supported;
}

const DecodeProducts* decode_products() {
  static const DecodeProducts* const chosen = chosen_vector_set(supported_decode_products());
  return chosen;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
