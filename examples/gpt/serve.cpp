// The book's GPT serving 16 requests at once with continuous batching over a paged KV cache.
//
//   gpt-serve MODEL_DIR [--bench] [--pages N] [--save-requests FILE] [--int8]
//   gpt-serve MODEL_DIR --shared-prompt [--bench] [--pages N]
//
// Prompts of different lengths (drawn from the vocabulary with a fixed seed) arrive one every
// two steps and each asks for its own number of tokens; every step runs the model once on the
// new tokens of all running requests (serving.h). Checks that each request gets exactly the
// tokens, and within 1e-4 the logits, that greedy generation gives it alone with a KVCache
// (gpt::generate), exit 1 otherwise. --bench then reports tokens per second, one thread, of the
// 16 requests served together against the same requests one at a time. --pages sets the pool's
// size (default 48 pages of 8 tokens: fewer than all requests need at once). --save-requests writes
// the requests and their tokens as JSON (examples/gpt/serve_padded.py reads them). --int8 serves
// from an 8-bit cache (PagedKVCacheOptions::dtype(torch::kChar)) and reports how far its tokens
// and logits are from the float generation's: how many requests get the same tokens, the first
// token that differs, and the largest logit difference before it; exit 1 only when the logits
// differ by more than 0.5 before the first different token.
//
// --shared-prompt serves requests that begin with the same system prompt, without prefix
// caching and with it, then a conversation of three turns, each turn's prompt the earlier turns
// and their answers plus a few new tokens, with it; prints the prompt tokens each request found
// cached and the most pages shared at once, and exits 1 unless every request gets the tokens it
// gets alone. With --bench it reports the time to first token and tokens per second, one
// thread, with prefix caching and without.

#include "gpt_model.h"
#include "model_dir.h"
#include "serving.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kRequests = 16;
constexpr int64_t kArrivalEvery = 2;  // steps between two requests' arrivals
constexpr int64_t kPageSize = 8;

// Prompts of 4 to context_length / 2 tokens, each followed by 4 to (context_length - its
// length) new tokens.
std::vector<gpt::Request> make_requests(const gpt::Config& config, int64_t arrival_every) {
  torch::manual_seed(41);
  std::vector<gpt::Request> requests;
  for (int64_t i = 0; i < kRequests; ++i) {
    gpt::Request r;
    const int64_t length = torch::randint(4, config.context_length / 2 + 1, {1}).item<int64_t>();
    r.prompt = torch::randint(0, config.vocab_size, {length}, torch::kLong);
    r.new_tokens = torch::randint(4, config.context_length - length + 1, {1}).item<int64_t>();
    r.arrival_step = i * arrival_every;
    requests.push_back(r);
  }
  return requests;
}

attention::PagedKVCache make_cache(const gpt::Config& config, int64_t pages, torch::Dtype dtype) {
  return attention::PagedKVCache(attention::PagedKVCacheOptions(pages, kPageSize, config.n_heads,
                                                                config.emb_dim / config.n_heads)
                                     .num_layers(config.n_layers)
                                     .dtype(dtype));
}

// A request generated alone, with a contiguous KVCache per block (gpt::generate): its new tokens
// and the logits each was chosen from.
std::pair<torch::Tensor, torch::Tensor> alone(gpt::GPTModel& model, const gpt::Config& config,
                                              const gpt::Request& r) {
  const auto [tokens, logits] =
      gpt::generate(model, r.prompt.unsqueeze(0), r.new_tokens, config.context_length);
  return {tokens[0].slice(0, r.prompt.size(0)), logits[0]};
}

// Whether every request got the tokens it gets alone, and its logits within 1e-4; prints each
// request's line through `describe`.
bool same_as_alone(gpt::GPTModel& model, const gpt::Config& config,
                   const std::vector<gpt::Request>& requests,
                   const std::vector<gpt::Completion>& served,
                   const std::function<std::string(size_t, bool)>& describe) {
  int64_t same = 0;
  double logit_diff = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto [tokens, logits] = alone(model, config, requests[i]);
    const bool equal = torch::equal(tokens, served[i].tokens);
    same += equal;
    logit_diff = std::max(logit_diff, (logits - served[i].logits).abs().max().item<double>());
    fmt::print("{}\n", describe(i, equal));
  }
  fmt::print("same tokens as alone: {} of {}; largest logit difference: {:.2e}\n", same,
             requests.size(), logit_diff);
  constexpr double kTolerance = 1e-4;  // float32, different kernels, a few layers deep
  return same == static_cast<int64_t>(requests.size()) && logit_diff <= kTolerance;
}

// How far the 8-bit cache's generation is from the float generation: requests with the same
// tokens, and over each request's tokens up to its first different one, the largest logit
// difference. Exit status 1 when that exceeds 0.5: quantization moves logits by hundredths here.
int report_int8(const std::vector<gpt::Request>& requests,
                const std::vector<gpt::Completion>& served, gpt::GPTModel& model,
                const gpt::Config& config, const attention::PagedKVCache& cache, int64_t pages) {
  int64_t same = 0;
  double logit_diff = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const auto [expected, logits] = alone(model, config, r);
    const auto& got = served[i].tokens;
    int64_t first = 0;
    while (first < got.size(0) && got[first].item<int64_t>() == expected[first].item<int64_t>()) {
      ++first;
    }
    same += first == got.size(0);
    // The logits of step t decide token t: compared up to and including the first different one.
    const int64_t steps = std::min<int64_t>(first + 1, got.size(0));
    const double diff = (logits.slice(0, 0, steps) - served[i].logits.slice(0, 0, steps))
                            .abs()
                            .max()
                            .item<double>();
    logit_diff = std::max(logit_diff, diff);
    fmt::print("request {:2}: {:2} new tokens, {}; largest logit difference {:.3f}\n", i,
               r.new_tokens,
               first == got.size(0) ? std::string("the float cache's tokens")
                                    : fmt::format("first different token at {}", first),
               diff);
  }
  const auto& o = cache.options();
  const double per_token = static_cast<double>(cache.memory_bytes()) / (pages * o.page_size());
  fmt::print(
      "8-bit cache: same tokens as the float cache: {} of {}; largest logit difference up to the "
      "first different token: {:.3f}; {:.0f} bytes per token ({} in float)\n",
      same, requests.size(), logit_diff, per_token,
      2 * o.num_layers() * o.num_kv_heads() * o.head_dim() * 4);
  if (logit_diff > 0.5 || cache.free_pages() != pages) {
    fmt::print(stderr, "gpt-serve: the 8-bit cache's logits are further from float's than 0.5\n");
    return 1;
  }
  return 0;
}

int64_t total_new_tokens(const std::vector<gpt::Request>& requests) {
  int64_t n = 0;
  for (const auto& r : requests) n += r.new_tokens;
  return n;
}

// Seconds of the fastest of five runs after one to warm up.
double best_seconds(const std::function<void()>& run) {
  double best = 1e30;
  for (int repeat = 0; repeat < 6; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (repeat > 0) best = std::min(best, s);
  }
  return best;
}

void save_requests(const std::string& path, const std::vector<gpt::Request>& requests,
                   const std::vector<gpt::Completion>& completions) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& p = requests[i].prompt;
    const auto& t = completions[i].tokens;
    out.push_back(
        {{"prompt", std::vector<int64_t>(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel())},
         {"new_tokens", requests[i].new_tokens},
         {"arrival_step", requests[i].arrival_step},
         {"tokens",
          std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel())}});
  }
  std::ofstream(path) << nlohmann::json{{"requests", out}}.dump() << "\n";
}

// 16 requests with a system prompt of 40 tokens and 2 to 8 of their own, each generating 4 to
// 12 tokens, arriving one every two steps.
std::vector<gpt::Request> shared_prompt_requests(const gpt::Config& config) {
  torch::manual_seed(63);
  const auto system = torch::randint(0, config.vocab_size, {40}, torch::kLong);
  std::vector<gpt::Request> requests;
  for (int64_t i = 0; i < kRequests; ++i) {
    gpt::Request r;
    const int64_t own = torch::randint(2, 9, {1}).item<int64_t>();
    r.prompt = torch::cat({system, torch::randint(0, config.vocab_size, {own}, torch::kLong)});
    r.new_tokens = torch::randint(4, 13, {1}).item<int64_t>();
    r.arrival_step = i * kArrivalEvery;
    requests.push_back(r);
  }
  return requests;
}

int shared_prompt_main(gpt::GPTModel& model, const gpt::Config& config, int64_t pages, bool bench) {
  const auto requests = shared_prompt_requests(config);
  bool ok = true;
  for (const bool caching : {false, true}) {
    auto cache = make_cache(config, pages, torch::kFloat);
    gpt::ServeStats stats;
    const auto served =
        gpt::serve(model, cache, requests, gpt::ServeOptions().prefix_caching(caching), &stats);
    int64_t prompt_tokens = 0;
    for (const auto& r : requests) prompt_tokens += r.prompt.size(0);
    fmt::print(
        "{} prefix caching: {} requests in {} steps, {} of {} prompt tokens found cached, {} "
        "pages held and {} shared by two sequences or more at most\n",
        caching ? "with" : "without", requests.size(), stats.steps, stats.cached_tokens,
        prompt_tokens, stats.most_pages, stats.most_shared_pages);
    ok = same_as_alone(model, config, requests, served,
                       [&](size_t i, bool equal) {
                         const auto& c = served[i];
                         return fmt::format(
                             "request {:2}: prompt {:2} tokens, {:2} cached, {:2} new, first "
                             "token at step {:2} (arrived at {:2}): {}",
                             i, requests[i].prompt.size(0), c.cached_tokens, requests[i].new_tokens,
                             c.first_token_step, requests[i].arrival_step,
                             equal ? "the tokens it gets alone" : "DIFFERENT tokens from alone");
                       }) &&
         ok;
    ok = ok && cache.free_pages() == pages && (!caching || stats.cached_tokens > 0);
  }

  // A conversation: the first 24 tokens of the system prompt and 4 of the user's, then each
  // turn's prompt the earlier turns, their answers and 4 new tokens (28, 36 and 44 tokens: the
  // context is 64).
  auto cache = make_cache(config, pages, torch::kFloat);
  torch::manual_seed(64);
  auto prompt = torch::cat({requests[0].prompt.slice(0, 0, 24),
                            torch::randint(0, config.vocab_size, {4}, torch::kLong)});
  std::vector<gpt::Request> turns;
  std::vector<gpt::Completion> answers;
  for (int turn = 0; turn < 3; ++turn) {
    gpt::Request r{prompt, 4, 0};
    const auto served = gpt::serve(model, cache, {r}, gpt::ServeOptions().prefix_caching(true));
    turns.push_back(r);
    answers.push_back(served[0]);
    prompt = torch::cat(
        {prompt, served[0].tokens, torch::randint(0, config.vocab_size, {4}, torch::kLong)});
  }
  ok = same_as_alone(model, config, turns, answers,
                     [&](size_t i, bool equal) {
                       return fmt::format(
                           "turn {}: prompt {:2} tokens, {:2} cached: {}", i + 1,
                           turns[i].prompt.size(0), answers[i].cached_tokens,
                           equal ? "the tokens it gets alone" : "DIFFERENT tokens from alone");
                     }) &&
       ok && answers[1].cached_tokens > 0 && answers[2].cached_tokens > answers[1].cached_tokens;
  if (!ok) {
    fmt::print(stderr, "gpt-serve: served generation differs from each request alone\n");
    return 1;
  }
  if (!bench) return 0;

  // Time to first token (its mean over the requests, from the fastest of six runs after one to
  // warm up) and tokens per second, one thread, with and without prefix caching.
  at::set_num_threads(1);
  const int64_t n = total_new_tokens(requests);
  for (const bool caching : {false, true}) {
    double best = 1e30, first_token = 0;
    for (int repeat = 0; repeat < 7; ++repeat) {
      auto fresh = make_cache(config, pages, torch::kFloat);
      const auto start = std::chrono::steady_clock::now();
      const auto served =
          gpt::serve(model, fresh, requests, gpt::ServeOptions().prefix_caching(caching));
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (repeat == 0 || s >= best) continue;
      best = s;
      first_token = 0;
      for (const auto& c : served) first_token += c.first_token_seconds;
      first_token /= static_cast<double>(served.size());
    }
    fmt::print(
        "{{\"generation\": \"cpp.paged.shared_prompt.{}\", \"threads\": 1, \"requests\": {}, "
        "\"tokens\": {}, \"seconds\": {:.4f}, \"tokens_per_s\": {:.1f}, "
        "\"mean_time_to_first_token_ms\": {:.3f}}}\n",
        caching ? "prefix_caching" : "no_prefix_caching", requests.size(), n, best, n / best,
        first_token * 1000);
  }
  return 0;
}

int serve_main(int argc, char** argv) {
  std::string dir, requests_path;
  bool bench = false, int8 = false, shared_prompt = false;
  int64_t pages = 48;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--bench") {
      bench = true;
    } else if (arg == "--int8") {
      int8 = true;
    } else if (arg == "--shared-prompt") {
      shared_prompt = true;
    } else if (arg == "--pages" && i + 1 < argc) {
      pages = std::stoll(argv[++i]);
    } else if (arg == "--save-requests" && i + 1 < argc) {
      requests_path = argv[++i];
    } else if (dir.empty() && arg.rfind("--", 0) != 0) {
      dir = arg;
    } else {
      dir.clear();
      break;
    }
  }
  if (dir.empty()) {
    fmt::print(stderr,
               "usage: gpt-serve MODEL_DIR [--bench] [--pages N] [--save-requests FILE] "
               "[--int8]\n       gpt-serve MODEL_DIR --shared-prompt [--bench] [--pages N]\n");
    return 2;
  }
  const auto [config, vocab] = gpt::read_config(dir);
  gpt::GPTModel model = gpt::load_model(dir, config);
  if (shared_prompt) return shared_prompt_main(model, config, pages, bench);
  const auto requests = make_requests(config, kArrivalEvery);
  auto cache = make_cache(config, pages, int8 ? torch::kChar : torch::kFloat);

  gpt::ServeStats stats;
  const auto served = gpt::serve(model, cache, requests, gpt::ServeOptions(), &stats);
  fmt::print(
      "{} requests in {} steps: at most {} sequences and {} tokens in a step, {} of {} pages "
      "held at most, {} steps mixing prefill and decode, {} requests waited for pages\n",
      requests.size(), stats.steps, stats.most_sequences, stats.most_tokens, stats.most_pages,
      pages, stats.mixed_steps, stats.waited_requests);
  if (int8) return report_int8(requests, served, model, config, cache, pages);

  // Each request alone, with a contiguous KVCache per block.
  const bool same = same_as_alone(model, config, requests, served, [&](size_t i, bool equal) {
    const auto& r = requests[i];
    const auto& c = served[i];
    return fmt::format(
        "request {:2}: prompt {:2} tokens, {:2} new, arrived at step {:2}, admitted {:2}, "
        "finished {:2}: {}",
        i, r.prompt.size(0), r.new_tokens, r.arrival_step, c.admitted_step, c.finished_step,
        equal ? "the tokens it gets alone" : "DIFFERENT tokens from alone");
  });
  fmt::print("pages free: {} of {}\n", cache.free_pages(), pages);
  if (!same || cache.free_pages() != pages) {
    fmt::print(stderr, "gpt-serve: served generation differs from each request alone\n");
    return 1;
  }
  if (!requests_path.empty()) save_requests(requests_path, requests, served);
  if (!bench) return 0;

  // Tokens per second, one thread as gpt measures: all requests served together (arriving one
  // every two steps, and all at once), against each request alone with gpt::generate.
  at::set_num_threads(1);
  const int64_t n = total_new_tokens(requests);
  auto all_at_once = requests;
  for (auto& r : all_at_once) r.arrival_step = 0;
  const auto report = [&](const char* name, double seconds) {
    fmt::print(
        "{{\"generation\": \"{}\", \"threads\": 1, \"requests\": {}, \"tokens\": {}, "
        "\"seconds\": {:.4f}, \"tokens_per_s\": {:.1f}}}\n",
        name, requests.size(), n, seconds, n / seconds);
  };
  report("cpp.paged.continuous",
         best_seconds([&] { gpt::serve(model, cache, requests, gpt::ServeOptions()); }));
  report("cpp.paged.all_at_once",
         best_seconds([&] { gpt::serve(model, cache, all_at_once, gpt::ServeOptions()); }));
  report("cpp.cached.one_at_a_time", best_seconds([&] {
           for (const auto& r : requests) {
             gpt::generate(model, r.prompt.unsqueeze(0), r.new_tokens, config.context_length);
           }
         }));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return serve_main(argc, argv);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "gpt-serve: {}\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpt-serve: {}\n", e.what());
  }
  return 1;
}
