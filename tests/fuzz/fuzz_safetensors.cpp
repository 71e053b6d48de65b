// libFuzzer target: the safetensors parser. An input is the file itself, or, when its first byte
// is fuzz::kStructured, a program (structured_input.h) that writes the JSON header (deep
// nesting, many distinct names, long texts from a few bytes), its next two bytes the size of the
// data section that follows it (zeros). Any input may be rejected with a c10::Error; none may
// crash, hang, touch memory it does not own or grow past its budget (scripts/fuzz.sh runs it with
// a time and memory limit per input).

#include <attention/safetensors.h>

#include "structured_input.h"

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

std::string file_of(const uint8_t* data, size_t size) {
  if (size == 0 || data[0] != fuzz::kStructured || size < 3) {
    return std::string(reinterpret_cast<const char*>(data), size);
  }
  const std::size_t body = data[1] + 256 * static_cast<std::size_t>(data[2]);
  const std::string header = fuzz::StructuredInput(data + 3, size - 3).run();
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(body, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = file_of(data, size);
  try {
    const auto tensors = attention::parse_safetensors(file.data(), file.size());
    for (const auto& [name, tensor] : tensors) (void)tensor.numel();
  } catch (const c10::Error&) {
  }
  return 0;
}
