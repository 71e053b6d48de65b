// libFuzzer target: the restricted unpickler on pickle bytes (what data.pkl of a torch.save
// archive holds; the archive's CRC-32 would stop most mutations before the pickle, so the pickle
// is fuzzed on its own). An input is the pickle itself, or, when its first byte is
// fuzz::kStructured, a program (structured_input.h) that writes the pickle between PROTO 2 and
// STOP, reaching deep nesting, repetition and memo reuse from a few bytes. Any input may be
// rejected with a c10::Error; none may crash, hang or grow past its budget (scripts/fuzz.sh runs it
// with a time and memory limit per input). Storages are zeros, at most 2^16 elements.

#include "serialization/torch_save.h"
#include "serialization/unpickler.h"
#include "structured_input.h"

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attention::serialization;
  const std::string pickle =
      size == 0 || data[0] != fuzz::kStructured
          ? std::string(reinterpret_cast<const char*>(data), size)
          : std::string("\x80\x02", 2) + fuzz::StructuredInput(data + 1, size - 1).run() + ".";
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
          // Every element of every view is readable. A view of one element repeated (stride 0)
          // may be far larger than its storage: of those, the last element is read.
          auto read = tensor;
          while (read.numel() > (1 << 20)) read = read.select(0, read.size(0) - 1);
          (void)read.sum().item<double>();
        }
      } catch (const c10::Error&) {
      }
    }
  } catch (const c10::Error&) {
  }
  return 0;
}
