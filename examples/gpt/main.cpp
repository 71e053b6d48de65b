// The book's GPT, trained in Python (examples/gpt/train.py), generating greedily in C++; or the
// same GPT with an attention mechanism of the book's chapter 4 (examples/gpt/chapter4.py).
//
//   gpt MODEL_DIR      (model.pth, config.json and generation.pt, as train.py writes them)
//
// Loads `torch.save(model.state_dict(), "model.pth")` unchanged, generates from Python's prompt
// with a KV cache, checks every token against Python's generation and every step's logits
// against Python's (exit 1 on a difference), and reports tokens per second.

#include "gpt_model.h"
#include "model_dir.h"

#include <fmt/format.h>
#include <torch/serialize.h>

#include <chrono>
#include <map>
#include <string>

namespace {

// generation.pt: a plain dict of tensors, read with LibTorch's own unpickler.
std::map<std::string, torch::Tensor> read_generation(const std::string& path) {
  const std::string bytes = gpt::read_file(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& item :
       torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

std::string decode(const torch::Tensor& tokens, const std::vector<std::string>& vocab) {
  std::string text;
  for (int64_t i = 0; i < tokens.size(0); ++i) text += vocab.at(tokens[i].item<int64_t>());
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: gpt MODEL_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto [config, vocab] = gpt::read_config(dir);
  gpt::GPTModel model = gpt::load_model(dir, config);

  const auto python = read_generation(dir + "/generation.pt");
  const auto& prompt = python.at("prompt");
  const int64_t new_tokens = python.at("logits").size(1);
  const auto [tokens, logits] = gpt::generate(model, prompt, new_tokens, config.context_length);
  const double logit_diff = (logits - python.at("logits")).abs().max().item<double>();
  const bool same_tokens = torch::equal(tokens, python.at("tokens"));
  fmt::print("C++:    {:?}\nPython: {:?}\n", decode(tokens[0], vocab),
             decode(python.at("tokens")[0], vocab));
  fmt::print("same tokens: {}; largest logit difference over {} steps: {:.2e}\n", same_tokens,
             new_tokens, logit_diff);
  constexpr double kTolerance = 1e-4;  // float32, different kernels, a few layers deep
  if (!same_tokens || logit_diff > kTolerance) {
    fmt::print(stderr, "gpt: C++ generation differs from Python's\n");
    return 1;
  }

  // Tokens per second: the rest of the context, best of five, one thread.
  at::set_num_threads(1);
  const int64_t n = config.context_length - prompt.size(1);
  double best = 1e30;
  for (int repeat = 0; repeat < 6; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    gpt::generate(model, prompt, n, config.context_length);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (repeat > 0) best = std::min(best, s);  // the first run warms up
  }
  fmt::print(
      "{{\"generation\": \"cpp.cached\", \"threads\": 1, \"tokens\": {}, "
      "\"tokens_per_s\": {:.1f}}}\n",
      n, n / best);
  return 0;
}
