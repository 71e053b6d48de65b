// libFuzzer target: load_weights on arbitrary bytes (safetensors, TorchScript archives and pickled
// state dicts are told apart by content). Any input may be rejected with a c10::Error; none may
// crash, and a rejected load must leave the module's weights as they were.

#include <attention/attention.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static attention::MultiHeadAttentionWrapper module = [] {
    torch::manual_seed(0);
    return attention::MultiHeadAttentionWrapper(8, 4, 3, 3);
  }();
  static const auto before = [] {
    std::vector<torch::Tensor> copies;
    for (const auto& p : module->parameters()) copies.push_back(p.detach().clone());
    return copies;
  }();
  try {
    attention::load_weights_from_memory(*module, reinterpret_cast<const char*>(data), size);
    // Accepted: put the reference weights back for the next input.
    torch::NoGradGuard no_grad;
    auto params = module->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(before[i]);
  } catch (const c10::Error&) {
    auto params = module->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!torch::equal(params[i], before[i])) std::abort();  // a failed load changed the module
    }
  }
  return 0;
}
