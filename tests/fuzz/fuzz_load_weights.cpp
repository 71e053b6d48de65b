// libFuzzer target: load_weights on arbitrary bytes, as for a file from an untrusted source
// (LoadOptions().trusted(false): safetensors and torch.save archives, read by this library's own
// readers; TorchScript refused before LibTorch parses it). Any input may be rejected with a
// c10::Error; none may crash, and a rejected load must leave the module's weights as they were.
//
// TorchScript is LibTorch's own reader and is not fuzzed here: on mutated TorchScript archives
// LibTorch 1.13's importer called std::terminate (tests/fuzz/regressions/). The pickle inside a
// torch.save archive has a target of its own (fuzz_unpickler.cpp): the archive's CRC-32 stops
// most mutations of it here.

#include <attention/attention.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

void load(const char* bytes, size_t size, const attention::LoadOptions& options) {
  static attention::MultiHeadAttentionWrapper module = [] {
    torch::manual_seed(0);
    return attention::MultiHeadAttentionWrapper(8, 4, 3, 3);
  }();
  static const auto before = [] {
    std::vector<torch::Tensor> copies;
    for (const auto& p : module->parameters()) copies.push_back(p.detach().clone());
    return copies;
  }();
  auto params = module->parameters();
  try {
    attention::load_weights_from_memory(*module, bytes, size, options);
    // Accepted: put the reference weights back for the next input.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(before[i]);
  } catch (const c10::Error&) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!torch::equal(params[i], before[i])) std::abort();  // a failed load changed the module
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The layouts and a rename rule in turn, so that each file meets each of them.
  using attention::WeightLayout;
  const WeightLayout layouts[] = {WeightLayout::Native, WeightLayout::TorchMultiheadAttention,
                                  WeightLayout::Llama, WeightLayout::GPT2,
                                  WeightLayout::BookMultiHeadAttentionWrapper};
  auto options = attention::LoadOptions().trusted(false).layout(layouts[size % 5]);
  if (size % 3 == 0) options.rename({{"^module\\.(.*)$", "$1"}});
  load(reinterpret_cast<const char*>(data), size, options);
  return 0;
}
