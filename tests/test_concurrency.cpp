// What may run at once (docs/THREADS.md): threads sharing one module get exactly the
// single-threaded result, each with a cache or state of its own; the layers of one paged step on
// threads of their own; saves to one path at once.

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

namespace {

void check_threads(const std::string& what, const std::function<torch::Tensor()>& forward) {
  INFO(what);
  const auto expected = forward();
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      torch::NoGradGuard no_grad;
      for (int i = 0; i < 20; ++i) {
        if (!torch::equal(forward(), expected)) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("concurrency: eight threads on one module agree with one thread", "[concurrency]") {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 40, 8}), small = torch::randn({6, 8});
  attention::SelfAttention sa(8, 4, 4);
  attention::CausalSelfAttention causal(8, 4, 4);
  attention::CrossAttention cross(8, 4, 4);
  attention::MultiHeadAttentionWrapper wrapper(8, 4, 4, 3);
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(8, 8, 2).num_kv_heads(1));
  for (auto* m : std::vector<torch::nn::Module*>{sa.get(), causal.get(), cross.get(), wrapper.get(),
                                                 mha.get()}) {
    m->eval();
  }
  check_threads("SelfAttention", [&] { return sa(x); });
  check_threads("SelfAttention, direct path", [&] { return sa(small); });
  check_threads("CausalSelfAttention", [&] { return causal(x); });
  check_threads("CrossAttention", [&] { return cross(x, x.flip(1)); });
  check_threads("MultiHeadAttentionWrapper", [&] { return wrapper(x); });
  check_threads("MultiHeadAttention", [&] { return mha(x).output; });
  auto long_x = torch::randn({1, 1100, 8});
  check_threads("MultiHeadAttention, chunked", [&] {
    return mha(long_x, attention::MultiHeadAttentionForwardOptions().backend(
                           attention::functional::Backend::Chunked))
        .output;
  });
}

namespace {

// Runs body(t) on n threads released together, so that first uses overlap; the first exception
// comes back on the calling thread. Catch's assertions are not thread-safe: bodies record, the
// caller checks.
template <typename Body>
void run_together(int n, Body body) {
  std::atomic<bool> go{false};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  const int intra_op = at::get_num_threads();
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      at::set_num_threads(intra_op);  // the same count as the reference run: bitwise equality
      torch::NoGradGuard no_grad;     // grad mode is per thread
      while (!go) std::this_thread::yield();
      try {
        body(t);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  go = true;
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// One sequence decoded token by token through its own KVCache.
torch::Tensor decode(attention::MultiHeadAttention& mha, const torch::Tensor& x,
                     attention::KVCache& cache) {
  std::vector<torch::Tensor> steps;
  for (int64_t i = 0; i < x.size(1); ++i) {
    steps.push_back(
        mha(x.narrow(1, i, 1), attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
            .output);
  }
  return torch::cat(steps, 1);
}

}  // namespace

TEST_CASE("concurrency: one module serves threads that each own a KVCache", "[concurrency]") {
  // The serving pattern docs/THREADS.md promises: one module (rotary tables, workspace) shared,
  // a cache per sequence. The module is fresh, so its rotary table is first built and then grown
  // while other threads read it; the sequences' lengths differ (past kAutoDecodeKeys for some).
  torch::NoGradGuard no_grad;
  for (const auto storage : {torch::kFloat, torch::kChar}) {
    INFO("cache storage " << storage);
    torch::manual_seed(5);
    attention::MultiHeadAttention mha(
        attention::MultiHeadAttentionOptions(32, 32, 4).num_kv_heads(2).sliding_window(40).rope(
            attention::functional::RotaryOptions()));
    mha->eval();
    constexpr int kThreads = 6;
    std::vector<torch::Tensor> inputs, got(kThreads);
    for (int t = 0; t < kThreads; ++t) inputs.push_back(torch::randn({1, 20 + 60 * t, 32}));
    const auto cache_for = [&](int t) {
      const int64_t length = inputs[t].size(1);
      return storage == torch::kChar ? attention::KVCache(length, storage)
                                     : attention::KVCache(length);
    };
    run_together(kThreads, [&](int t) {
      auto cache = cache_for(t);
      got[t] = decode(mha, inputs[t], cache);
    });
    for (int t = 0; t < kThreads; ++t) {
      auto cache = cache_for(t);
      CHECK(torch::equal(got[t], decode(mha, inputs[t], cache)));
    }
  }
}

TEST_CASE("concurrency: the layers of one paged step run on threads of their own",
          "[concurrency][paged]") {
  // forward_paged() and write() touch only their layer's pages: a step's layers may run at once,
  // and a reader of one layer is undisturbed by the writer of another.
  torch::NoGradGuard no_grad;
  constexpr int kLayers = 4;
  torch::manual_seed(6);
  std::vector<attention::MultiHeadAttention> layers;
  for (int l = 0; l < kLayers; ++l) {
    layers.emplace_back(attention::MultiHeadAttentionOptions(32, 32, 4).num_kv_heads(2));
    layers.back()->eval();
  }
  const auto options = attention::PagedKVCacheOptions(64, 8, 2, 8).num_layers(kLayers);
  attention::PagedKVCache together(options), alone(options);
  std::vector<int64_t> a, b;
  for (int s = 0; s < 3; ++s) {
    a.push_back(together.add_sequence());
    b.push_back(alone.add_sequence());
  }
  for (const auto& tokens : std::vector<std::vector<int64_t>>{{13, 5, 30}, {1, 1, 1}, {4, 1, 2}}) {
    const auto step = together.extend(a, tokens), same = alone.extend(b, tokens);
    const int64_t total = step.total_tokens();
    std::vector<torch::Tensor> x, got(kLayers);
    for (int l = 0; l < kLayers; ++l) x.push_back(torch::randn({total, 32}));
    run_together(kLayers,
                 [&](int l) { got[l] = layers[l]->forward_paged(x[l], together, step, l); });
    for (int l = 0; l < kLayers; ++l) {
      CHECK(torch::equal(got[l], layers[l]->forward_paged(x[l], alone, same, l)));
    }
  }
  // A reader of layer 0 while another thread writes layer 1, over and over: the reads never
  // change.
  const auto step = together.extend(a, {1, 1, 1});
  layers[0]->forward_paged(torch::randn({3, 32}), together, step, 0);
  const auto q = torch::randn({3, 4, 8});
  const auto read = [&] {
    return attention::functional::paged_attention(q, together.keys(0), together.values(0),
                                                  step.query_starts(), step.key_lengths(),
                                                  step.page_table());
  };
  const auto expected = read();
  std::atomic<int> changed{0};
  run_together(2, [&](int t) {
    for (int i = 0; i < 50; ++i) {
      if (t == 0) {
        if (!torch::equal(read(), expected)) ++changed;
      } else {
        together.write(1, step, torch::randn({3, 2, 8}), torch::randn({3, 2, 8}));
      }
    }
  });
  CHECK(changed == 0);
}

TEST_CASE("concurrency: modules with a state per sequence share their weights", "[concurrency]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  attention::MultiHeadLatentAttention mla(
      attention::MultiHeadLatentAttentionOptions(32, 32, 4).latent_dim(8));
  attention::GatedDeltaNet delta_net(attention::GatedDeltaNetOptions(32, 32, 4));
  mla->eval();
  delta_net->eval();
  constexpr int kThreads = 4;
  std::vector<torch::Tensor> inputs, latent(kThreads), recurrent(kThreads);
  for (int t = 0; t < kThreads; ++t) inputs.push_back(torch::randn({1, 10 + 7 * t, 32}));
  const auto run = [&](int t, torch::Tensor& mla_out, torch::Tensor& net_out) {
    attention::LatentCache cache(inputs[t].size(1));
    attention::GatedDeltaNetState state;
    std::vector<torch::Tensor> a, b;
    for (int64_t i = 0; i < inputs[t].size(1); ++i) {
      a.push_back(mla(inputs[t].narrow(1, i, 1), &cache));
      b.push_back(delta_net(inputs[t].narrow(1, i, 1), &state));
    }
    mla_out = torch::cat(a, 1);
    net_out = torch::cat(b, 1);
  };
  run_together(kThreads, [&](int t) { run(t, latent[t], recurrent[t]); });
  for (int t = 0; t < kThreads; ++t) {
    torch::Tensor mla_out, net_out;
    run(t, mla_out, net_out);
    CHECK(torch::equal(latent[t], mla_out));
    CHECK(torch::equal(recurrent[t], net_out));
  }
}

TEST_CASE("concurrency: saves to one path at once each leave a whole file",
          "[concurrency][weights]") {
  // Each save writes a file of its own and renames it over the path: whichever comes last, the
  // path holds one module's whole file, and no save fails for another's temporary file.
  const auto path = (std::filesystem::temp_directory_path() /
                     ("attention-concurrent-save-" + std::to_string(::getpid()) + ".pt"))
                        .string();
  constexpr int kThreads = 4;
  std::vector<attention::MultiHeadAttention> modules;
  for (int t = 0; t < kThreads; ++t) {
    torch::manual_seed(t);
    modules.emplace_back(attention::MultiHeadAttentionOptions(16, 16, 2));
  }
  std::atomic<int> failures{0};
  run_together(kThreads, [&](int t) {
    for (int i = 0; i < 25; ++i) {
      try {
        attention::save_weights(*modules[t], path);
      } catch (const c10::Error&) {
        ++failures;
      }
    }
  });
  CHECK(failures == 0);
  attention::MultiHeadAttention loaded(attention::MultiHeadAttentionOptions(16, 16, 2));
  attention::load_weights(*loaded, path);
  bool one_of_them = false;
  for (const auto& m : modules) {
    one_of_them = one_of_them || torch::equal(m->W_query->weight, loaded->W_query->weight);
  }
  CHECK(one_of_them);
  // No temporary file is left beside it.
  int left = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    left += entry.path().string().rfind(path + ".partial", 0) == 0;
  }
  CHECK(left == 0);
  std::filesystem::remove(path);
}
