#pragma once

// Continuous batching of the book's GPT: requests arrive at different steps, each generates its
// own number of tokens greedily, and every step runs the model once on the new tokens of all
// running sequences packed together (the prompt chunks of newly arrived requests and one token of
// each decoding one), over one PagedKVCache whose pages a finished request gives back at once.
// With prefix caching a request starts on the cached pages of the longest prefix of its prompt
// that an earlier request wrote (a system prompt, the earlier turns of a conversation) and
// computes only the rest.

#include "gpt_model.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <vector>

namespace gpt {

/// One request: a prompt of token ids (T,), the tokens to generate after it, and the step at
/// which it reaches the server.
struct Request {
  torch::Tensor prompt;
  int64_t new_tokens = 0;
  int64_t arrival_step = 0;
};

/// What the server made for one request.
struct Completion {
  /// The generated tokens, (new_tokens,) int64.
  torch::Tensor tokens;
  /// The logits each token was chosen from, (new_tokens, vocab).
  torch::Tensor logits;
  /// The steps at which the request was admitted (its pages reserved) and got its last token.
  int64_t admitted_step = -1, finished_step = -1;
  /// The step at which it got its first token, and the seconds from the start of the step at
  /// which it arrived to the end of that one (its time to first token).
  int64_t first_token_step = -1;
  double first_token_seconds = 0;
  /// The prompt tokens it found cached (prefix caching), which it did not compute.
  int64_t cached_tokens = 0;
};

/// How the steps went.
struct ServeStats {
  int64_t steps = 0;              // steps that ran the model
  int64_t most_sequences = 0;     // the most sequences in one step
  int64_t most_tokens = 0;        // the most packed tokens in one step
  int64_t most_pages = 0;         // the most pages held at once
  int64_t mixed_steps = 0;        // steps in which some sequences prefilled and others decoded
  int64_t waited_requests = 0;    // requests admitted after their arrival step (no pages yet)
  int64_t cached_tokens = 0;      // prompt tokens found cached, over all requests
  int64_t most_shared_pages = 0;  // the most pages held by two sequences or more at once
};

struct ServeOptions {
  /// The most prompt tokens one sequence brings to a step: a longer prompt is prefilled in
  /// chunks over several steps, so that one long prompt does not stall the decoding sequences.
  TORCH_ARG(int64_t, prefill_chunk) = 16;
  /// Whether requests start on the cached pages of their prompt's longest cached prefix
  /// (PagedKVCache::add_sequence(tokens)), and tell the cache the tokens they generate
  /// (add_tokens), so that a later turn of the conversation finds them too.
  TORCH_ARG(bool, prefix_caching) = false;
};

namespace detail {

inline int64_t pages_for(int64_t tokens, int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

// A request while it runs: its sequence in the cache and how far it has come.
struct Running {
  size_t request = 0;
  int64_t sequence = -1;
  int64_t prompt_fed = 0;  // prompt tokens already in the cache
  std::vector<int64_t> tokens;
  std::vector<torch::Tensor> logits;
};

}  // namespace detail

/// Serves `requests` (in any order) with greedy generation over `cache` (one layer per block,
/// the model's heads and head size, no sequences: it may keep the cached pages of an earlier
/// call, which prefix caching finds): each step admits the requests that have arrived
/// while the pool can hold them, runs the model once on the packed new tokens of every running
/// sequence, and frees each sequence that has all its tokens. A request is admitted only when the
/// pages of its whole length (prompt and generated tokens) are free beside those reserved by the
/// running ones, so that no running sequence ever finds the pool empty; requests are admitted in
/// order of arrival. (A request's reservation counts the pages it shares with others too: fewer
/// requests run at once than the pool could hold, never more.) Returns one Completion per
/// request, in the order given.
inline std::vector<Completion> serve(GPTModel& model, attention::PagedKVCache& cache,
                                     const std::vector<Request>& requests,
                                     const ServeOptions& options = {},
                                     ServeStats* stats = nullptr) {
  const int64_t page_size = cache.options().page_size();
  const int64_t num_pages = cache.options().num_pages();
  const int64_t context_length = model->pos_emb->weight.size(0);
  TORCH_CHECK_VALUE(options.prefill_chunk() >= 1, "gpt::serve: expected prefill_chunk >= 1, got ",
                    options.prefill_chunk());
  TORCH_CHECK_VALUE(cache.options().num_layers() == static_cast<int64_t>(model->trf_blocks->size()),
                    "gpt::serve: expected a cache of ", model->trf_blocks->size(),
                    " layers (one per block), got ", cache.options().num_layers());
  TORCH_CHECK_VALUE(cache.sequences().empty(), "gpt::serve: expected an empty cache, got one of ",
                    cache.sequences().size(), " sequences");
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    TORCH_CHECK_TYPE(r.prompt.defined() && r.prompt.scalar_type() == torch::kLong,
                     "gpt::serve: request ", i, ": expected an int64 prompt");
    TORCH_CHECK_VALUE(r.prompt.dim() == 1 && r.prompt.size(0) >= 1, "gpt::serve: request ", i,
                      ": expected a prompt of shape (T,) with T >= 1, got ", r.prompt.sizes());
    const int64_t vocab_size = model->tok_emb->weight.size(0);
    TORCH_CHECK_VALUE(
        r.prompt.min().item<int64_t>() >= 0 && r.prompt.max().item<int64_t>() < vocab_size,
        "gpt::serve: request ", i, ": expected token ids in [0, ", vocab_size, ")");
    TORCH_CHECK_VALUE(r.new_tokens >= 1 && r.new_tokens <= context_length - r.prompt.size(0),
                      "gpt::serve: request ", i,
                      ": expected 1 <= new_tokens <= context_length - prompt length = ",
                      context_length - r.prompt.size(0), ", got ", r.new_tokens);
    const int64_t pages = detail::pages_for(r.prompt.size(0) + r.new_tokens, page_size);
    TORCH_CHECK_VALUE(pages <= num_pages, "gpt::serve: request ", i, " needs ", pages,
                      " pages, the pool has ", num_pages);
    // Steps count on past the last arrival by at most the tokens of all requests.
    TORCH_CHECK_VALUE(r.arrival_step >= 0 && r.arrival_step <= (int64_t{1} << 62),
                      "gpt::serve: request ", i, ": expected 0 <= arrival_step <= 2^62, got ",
                      r.arrival_step);
  }
  torch::NoGradGuard no_grad;
  ServeStats local;
  ServeStats& s = stats ? *stats : local;
  s = ServeStats();

  std::vector<size_t> order(requests.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].arrival_step < requests[b].arrival_step;
  });
  std::deque<size_t> waiting(order.begin(), order.end());
  std::vector<detail::Running> running;
  std::vector<Completion> done(requests.size());
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::vector<double> arrived(requests.size(), -1);  // when each request's arrival step began
  int64_t reserved = 0;                              // pages of the running requests' whole lengths
  auto whole_pages = [&](size_t i) {
    return detail::pages_for(requests[i].prompt.size(0) + requests[i].new_tokens, page_size);
  };

  for (int64_t step = 0; !waiting.empty() || !running.empty(); ++step) {
    // Nothing to run until the next request arrives.
    if (running.empty()) step = std::max(step, requests[waiting.front()].arrival_step);
    for (const size_t i : waiting) {
      if (requests[i].arrival_step > step) break;  // in order of arrival
      if (arrived[i] < 0) arrived[i] = seconds();
    }
    while (!waiting.empty() && requests[waiting.front()].arrival_step <= step &&
           reserved + whole_pages(waiting.front()) <= num_pages) {
      const size_t i = waiting.front();
      waiting.pop_front();
      reserved += whole_pages(i);
      detail::Running admitted;
      admitted.request = i;
      if (options.prefix_caching()) {
        const attention::PrefixHit hit = cache.add_sequence(requests[i].prompt);
        admitted.sequence = hit.sequence;
        admitted.prompt_fed = hit.cached_tokens;    // never the whole prompt: its last token's
        done[i].cached_tokens = hit.cached_tokens;  // row makes the first token's logits
        s.cached_tokens += hit.cached_tokens;
      } else {
        admitted.sequence = cache.add_sequence();
      }
      running.push_back(std::move(admitted));
      done[i].admitted_step = step;
      if (step > requests[i].arrival_step) ++s.waited_requests;
    }

    // The step's packed tokens: the next prompt chunk of a prefilling sequence, the last
    // generated token of a decoding one.
    std::vector<int64_t> sequences, counts;
    std::vector<torch::Tensor> inputs;
    bool prefills = false, decodes = false;
    for (const auto& r : running) {
      const auto& prompt = requests[r.request].prompt;
      if (r.prompt_fed < prompt.size(0)) {
        const int64_t n = std::min(options.prefill_chunk(), prompt.size(0) - r.prompt_fed);
        inputs.push_back(prompt.slice(0, r.prompt_fed, r.prompt_fed + n));
        prefills = true;
      } else {
        inputs.push_back(torch::tensor({r.tokens.back()}, torch::kLong));
        decodes = true;
      }
      sequences.push_back(r.sequence);
      counts.push_back(inputs.back().size(0));
    }
    const auto batch = cache.extend(sequences, counts);
    const auto logits = model->forward_packed(torch::cat(inputs), cache, batch);
    const auto next = logits.argmax(-1);

    ++s.steps;
    s.most_sequences = std::max<int64_t>(s.most_sequences, running.size());
    s.most_tokens = std::max(s.most_tokens, batch.total_tokens());
    s.most_pages = std::max(s.most_pages, num_pages - cache.free_pages());
    if (prefills && decodes) ++s.mixed_steps;
    int64_t shared_pages = 0;
    for (int64_t page = 0; page < num_pages; ++page)
      shared_pages += cache.page_references(page) > 1;
    s.most_shared_pages = std::max(s.most_shared_pages, shared_pages);

    // A sequence past its whole prompt gets its next token; a finished one gives back its pages.
    std::vector<detail::Running> still_running;
    for (size_t j = 0; j < running.size(); ++j) {
      auto& r = running[j];
      const auto& request = requests[r.request];
      if (r.prompt_fed < request.prompt.size(0)) r.prompt_fed += counts[j];
      if (r.prompt_fed < request.prompt.size(0)) {
        still_running.push_back(std::move(r));
        continue;
      }
      r.tokens.push_back(next[j].item<int64_t>());
      r.logits.push_back(logits[j]);
      if (r.tokens.size() == 1) {
        done[r.request].first_token_step = step;
        done[r.request].first_token_seconds = seconds() - arrived[r.request];
      }
      if (options.prefix_caching()) {
        cache.add_tokens(r.sequence, torch::tensor({r.tokens.back()}, torch::kLong));
      }
      if (static_cast<int64_t>(r.tokens.size()) < request.new_tokens) {
        still_running.push_back(std::move(r));
        continue;
      }
      cache.free_sequence(r.sequence);
      reserved -= whole_pages(r.request);
      auto& completion = done[r.request];
      completion.tokens = torch::tensor(r.tokens, torch::kLong);
      completion.logits = torch::stack(r.logits);
      completion.finished_step = step;
    }
    running = std::move(still_running);
  }
  return done;
}

}  // namespace gpt
