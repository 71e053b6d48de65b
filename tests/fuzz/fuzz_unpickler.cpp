// libFuzzer target: the restricted unpickler on arbitrary pickle bytes (what data.pkl of a
// torch.save archive holds; the archive's CRC-32 would stop most mutations before the pickle, so
// the pickle is fuzzed on its own). Any input may be rejected with a c10::Error; none may crash,
// hang or grow without bound. Storages are zeros, at most 2^16 elements.

#include "serialization/torch_save.h"
#include "serialization/unpickler.h"

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attention::serialization;
  const std::string pickle(reinterpret_cast<const char*>(data), size);
  auto load = [](c10::ScalarType dtype, const std::string&, int64_t numel) {
    TORCH_CHECK(numel <= (int64_t{1} << 16), "storage too large for the fuzz target");
    return at::zeros({numel}, at::TensorOptions().dtype(dtype));
  };
  try {
    const Unpickled saved = unpickle(pickle, load, "fuzz");
    for (const char* key : {"", "model_state_dict"}) {
      try {
        for (const auto& [name, tensor] : state_dict_entries(saved, key, "fuzz")) {
          (void)name;
          (void)tensor.sum().item<double>();  // every element of every view is readable
        }
      } catch (const c10::Error&) {
      }
    }
  } catch (const c10::Error&) {
  }
  return 0;
}
