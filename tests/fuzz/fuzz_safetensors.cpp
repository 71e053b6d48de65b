// libFuzzer target: the safetensors parser on arbitrary bytes. Any input may be rejected with a
// c10::Error; none may crash, hang or touch memory it does not own.

#include <attention/safetensors.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors = attention::parse_safetensors(reinterpret_cast<const char*>(data), size);
    for (const auto& [name, tensor] : tensors) (void)tensor.numel();
  } catch (const c10::Error&) {
  }
  return 0;
}
