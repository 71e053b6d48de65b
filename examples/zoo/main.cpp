// One model of the book's chapter-5 zoo, written seeded by Python (examples/zoo/write_models.py),
// generating greedily in C++ through a KV cache and through paged caches.
//
//   zoo MODEL_DIR [--threads N] [--bench]
//
// MODEL_DIR holds config.json (the book's config, with "family" and "dtype"), model.pth (the
// book's state_dict), hf/ (the same weights under Hugging Face's names, sharded) and
// generation.pt (Python's prompt, tokens and each step's logits). The program loads both
// checkpoints (they must give the same parameters), then generates Python's prompt's
// continuation with each cache and checks it:
//   float32: every token Python's, every step's logits within 1e-4 of Python's;
//   bfloat16: the book's classes round intermediate results to bfloat16 in other places than the
//     library's kernels (which compute attention in float), so each step is fed Python's own
//     tokens and its logits must be within kBfloat16Bound of Python's; a token may differ only
//     where Python's two best logits are within twice that bound (printed when it happens).
// Exit status 1 on a difference. With --bench, tokens per second of the cached decoding.

#include "zoo_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

namespace {

constexpr double kFloat32Bound = 1e-4;
// bfloat16 keeps 8 bits: a logit of magnitude ~4 is rounded to 2^-6, and a few layers of such
// roundings, in other places than the book's, add up.
constexpr double kBfloat16Bound = 0.25;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::map<std::string, torch::Tensor> read_generation(const std::string& path) {
  const std::string bytes = read_file(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& item :
       torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

struct Run {
  torch::Tensor tokens;  // (1, P + N)
  torch::Tensor logits;  // (N, vocab) float32
};

// Decodes through caches: the prompt in one call, then one token a call. With `forced`, the
// tokens fed are those (Python's) instead of the argmax.
Run decode(zoo::Model& model, const torch::Tensor& prompt, int64_t steps, bool paged,
           const torch::Tensor& forced = {}) {
  torch::NoGradGuard no_grad;
  const int64_t length = prompt.size(1) + steps;
  auto caches = model->make_caches(length, paged);
  auto tokens = prompt;
  std::vector<torch::Tensor> logits;
  auto next = prompt;
  for (int64_t i = 0; i < steps; ++i) {
    if (paged) model->extend(caches, next.size(1));
    const auto last = model(next, &caches).select(1, -1);  // (1, vocab)
    logits.push_back(last.to(torch::kFloat));
    const auto chosen =
        forced.defined() ? forced.narrow(1, prompt.size(1) + i, 1) : last.argmax(-1, true);
    tokens = torch::cat({tokens, chosen}, 1);
    next = chosen;
  }
  return {tokens, torch::cat(logits, 0)};
}

bool check(const std::string& route, const Run& run,
           const std::map<std::string, torch::Tensor>& python, bool bfloat16) {
  const auto& expected = python.at("logits");
  const double diff = (run.logits - expected).abs().max().item<double>();
  const bool same_tokens = torch::equal(run.tokens, python.at("tokens"));
  const double bound = bfloat16 ? kBfloat16Bound : kFloat32Bound;
  bool ok = diff <= bound && (same_tokens || bfloat16);
  if (bfloat16 && !same_tokens) {
    // Teacher-forced: a token may differ only where Python's choice was within the bound.
    const auto top = std::get<0>(expected.topk(2, -1));
    const auto margin = top.select(1, 0) - top.select(1, 1);
    const int64_t p = python.at("prompt").size(1);
    for (int64_t i = 0; i < expected.size(0); ++i) {
      const int64_t mine = run.logits[i].argmax().item<int64_t>();
      const int64_t theirs = python.at("tokens")[0][p + i].item<int64_t>();
      if (mine == theirs) continue;
      const double m = margin[i].item<double>();
      fmt::print("{}: step {} chose {} where Python chose {} (Python's margin {:.3g})\n", route, i,
                 mine, theirs, m);
      ok = ok && m <= 2 * bound;
    }
  }
  fmt::print("{}: {} tokens, largest logit difference {:.2e} (bound {:.0e}){}\n", route,
             same_tokens ? "Python's" : "other", diff, bound, ok ? "" : "  FAILED");
  return ok;
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  // A configuration or a file that cannot hold is refused by name, before anything is computed.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "zoo: {}\n", e.what());
    return 2;
  }
}

int run(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: zoo MODEL_DIR [--threads N] [--bench]\n");
    return 2;
  }
  const std::string dir = argv[1];
  bool bench = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--bench") bench = true;
    if (arg == "--threads" && i + 1 < argc) at::set_num_threads(std::stoi(argv[++i]));
  }
  const auto config = nlohmann::json::parse(read_file(dir + "/config.json"));
  const auto description = zoo::describe(config);
  const bool bfloat16 = description.dtype == torch::kBFloat16;

  zoo::Model model(description), from_hf(description);
  model->to(description.dtype);
  from_hf->to(description.dtype);
  zoo::load(model, dir + "/model.pth");
  zoo::load(from_hf, dir + "/hf/model.safetensors.index.json");
  model->eval();
  from_hf->eval();
  // The book's names and Hugging Face's give one model.
  const auto mine = model->named_parameters(), theirs = from_hf->named_parameters();
  for (const auto& p : mine) {
    if (!torch::equal(p.value(), theirs[p.key()])) {
      fmt::print(stderr, "zoo: {} differs between model.pth and hf/\n", p.key());
      return 1;
    }
  }

  const auto python = read_generation(dir + "/generation.pt");
  const auto& prompt = python.at("prompt");
  const int64_t steps = python.at("logits").size(0);
  fmt::print("{} ({}): Python's tokens {}\n", description.family,
             config.at("dtype").get<std::string>(),
             fmt::join(python.at("tokens")[0].narrow(0, prompt.size(1), steps).data_ptr<int64_t>(),
                       python.at("tokens")[0].data_ptr<int64_t>() + prompt.size(1) + steps, " "));
  bool ok = true;
  const bool shares_kv = std::any_of(description.layers.begin(), description.layers.end(),
                                     [](const zoo::Layer& l) { return l.kv_source.has_value(); });
  for (const bool paged : {false, true}) {
    if (paged && shares_kv) {
      fmt::print("paged: not run (KV-shared layers read another layer's cache)\n");
      continue;
    }
    const std::string route = paged ? "paged" : "kv-cache";
    ok =
        check(route,
              decode(model, prompt, steps, paged, bfloat16 ? python.at("tokens") : torch::Tensor()),
              python, bfloat16) &&
        ok;
    if (bfloat16) {
      // Free-running, for the record: where it parts from Python's tokens.
      const auto free = decode(model, prompt, steps, paged);
      fmt::print("{}: free-running greedy {} Python's tokens\n", route,
                 torch::equal(free.tokens, python.at("tokens")) ? "gives" : "departs from");
    }
  }
  if (!ok) {
    fmt::print(stderr, "zoo: C++ generation differs from Python's\n");
    return 1;
  }
  if (bench) {
    const int64_t n = 64 - prompt.size(1);
    double best = 1e30;
    for (int repeat = 0; repeat < 6; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      decode(model, prompt, n, false);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (repeat > 0) best = std::min(best, s);
    }
    fmt::print(
        "{{\"generation\": \"cpp.kv_cache\", \"family\": \"{}\", \"dtype\": \"{}\", \"threads\": "
        "{}, \"tokens\": {}, \"tokens_per_s\": {:.1f}}}\n",
        description.family, config.at("dtype").get<std::string>(), at::get_num_threads(), n,
        n / best);
  }
  return 0;
}
