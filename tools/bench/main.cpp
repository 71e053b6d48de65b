// attention-bench: times this library's modules and LibTorch's C++ MultiheadAttention in the
// configurations of scripts/bench.sh, and prints one JSON record per measurement.
//
//   attention-bench [--threads N] [--repeats N] [--quick] GROUP...
//   groups: matmul article raschka raschka-train core-train decode
//           dtypes             (the attention core on Chunked and the Raschka module, float32
//                               and bfloat16 in turn; with ATTENTION_CPU_BF16=ROUTE in the
//                               environment the records are named `...bfloat16.ROUTE` and
//                               `...float32.ROUTE_run`)
//           long:IMPL:T        (IMPL chunked|math, one long-context measurement with its peak
//                               memory; run it in a process of its own: the peak is the process's)
//           long-train:IMPL:T  (the same for the forward and backward)
//           blocks:T           (Chunked's forward and forward+backward for block sizes 64 to
//                               1024, side by side: B=1, H=8 from T=4096, else B=8, H=12)
//           varlen             (16 causal sequences of 16 to 2048 tokens: packed in one
//                               varlen_attention call, one call each, and padded to a batch)
//           read-rate          (the machine's memory read rate: a 512 MiB buffer summed)
//           multiply-rates     (one core's float, 16-bit and 8-bit vector products per second
//                               on AVX2: the decoding step's products' bound there)
//           paged-decode       (one sequence's decoding step over a paged cache and over
//                               contiguous keys, as keys and values read per second; with
//                               ATTENTION_CPU_INT8=widened the 8-bit step's records are named
//                               `...paged.widened`)
//           paged-prefill      (a prompt chunk over a paged cache, and over contiguous keys
//                               through varlen_attention)
//           shared-prefix      (32 requests sharing a prompt: admitted with prefix caching and
//                               without, and their decoding step over the shared pages and over
//                               pages of their own)
//           block-mask:T       (building a document mask with causal attention inside each
//                               document, by its builders and from a mask function, beside the
//                               causal attention call it serves)
//           block-attention:T  (16 causal documents in T, and prefix-LM over T/2, through a
//                               block mask, against full causal attention scaled by the blocks
//                               visited, and against a dense bool mask; causal attention over T/2
//                               with and without a learned T5 relative position bias, and
//                               soft-capping as a ScoreMod against the softcap option)
//           mla-decode         (a decoding step of multi-head latent attention at 4096 to
//                               32768, absorbed and in the book's form, beside MHA and GQA)
//           deltanet           (Gated DeltaNet's delta rule at T = 4096 and 16384, fused against
//                               the recurrence in ops and against causal softmax attention, and
//                               a decoding step at both positions)
//           dsa:T              (DeepSeek sparse attention over T tokens with top-k 512 and 2048:
//                               the indexer and the top-k attention against causal attention)
//           zoo-layer          (an attention layer of Qwen3-0.6B and of Gemma 3 1B at their
//                               sizes: a prefill of 2048 tokens, a decoding step after 4096)
//           auto               (Backend::Auto's choice against Chunked and Math at T = 8 to
//                               1024, B=1, H=8, through the functional API and the operator,
//                               with and without gradients)

#include "multiply_rates.h"

#include <attention/attention.h>

#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <torch/torch.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using attention::functional::Backend;
namespace F = attention::functional;

struct Settings {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int repeats = 5;
  bool quick = false;
};
Settings settings;

// The median of `repeats` timed calls; a warm-up call first, unless the caller made it:
// first-touch page faults and lazy initialisation are not what is measured.
// The median as Python's statistics.median takes it.
double median_of(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  const size_t mid = times.size() / 2;
  return times.size() % 2 ? times[mid] : (times[mid - 1] + times[mid]) / 2;
}

double median_ms(const std::function<void()>& fn, int repeats, bool warm_up = true) {
  if (warm_up) fn();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return median_of(std::move(times));
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

std::string allocator() {
  const char* preload = std::getenv("LD_PRELOAD");
  return preload && std::string(preload).find("tcmalloc") != std::string::npos ? "tcmalloc"
                                                                               : "glibc";
}

void record(const std::string& group, const std::string& impl, const std::string& pass, int64_t t,
            double ms, double gflop, double peak_mb = -1) {
  fmt::print(
      "{{\"lang\": \"cpp\", \"group\": \"{}\", \"impl\": \"{}\", \"pass\": \"{}\", \"T\": {}, "
      "\"ms\": {:.4f}, \"gflops\": {:.2f}, \"peak_mb\": {:.1f}, \"threads\": {}, "
      "\"allocator\": \"{}\", \"torch\": \"{}\"}}\n",
      group, impl, pass, t, ms, gflop > 0 ? gflop * 1000.0 / ms : 0.0, peak_mb,
      at::get_num_threads(), allocator(), TORCH_VERSION);
  std::fflush(stdout);
}

void progress(const std::string& what) {
  fmt::print(stderr, "attention-bench: {}\n", what);
}

// Multi-head attention FLOPs: four projections and, causal, half of QKᵀ and of AV.
double mha_gflop(int64_t b, int64_t t, int64_t d, bool causal) {
  const double proj = 4.0 * 2 * b * t * d * d;
  const double core = 2.0 * 2 * b * t * t * d * (causal ? 0.5 : 1.0);
  return (proj + core) / 1e9;
}

void bench_matmul() {
  auto a = torch::randn({2048, 2048}), b = torch::randn({2048, 2048}),
       c = torch::empty({2048, 2048});
  const double ms = median_ms([&] { at::mm_out(c, a, b); }, settings.repeats);
  record("matmul", "mm_2048", "forward", 2048, ms, 2.0 * 2048 * 2048 * 2048 / 1e9);
}

void bench_article() {
  // The article's SelfAttention(3, 2, 4) on its 6 x 3 input, one thread: per-call overhead.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  auto x = torch::rand({6, 3});
  const int calls = settings.quick ? 200 : 20000;
  const double ms = median_ms(
      [&] {
        for (int i = 0; i < calls; ++i) sa(x);
      },
      settings.repeats);
  record("article", "cpp.self_attention", "forward", 6, ms * 1000.0 / calls,
         0);  // ms field: us/call
  at::set_num_threads(threads);
}

struct Raschka {
  int64_t b = 8, t = 1024, d = 768, h = 12;
};

void bench_raschka(bool train) {
  Raschka c;
  if (settings.quick) c = {2, 128, 64, 4};
  const std::string pass = train ? "forward+backward" : "forward";
  const std::string group = train ? "raschka-train" : "raschka";
  // Training steps take seconds: half the repeats there.
  const int repeats = train ? std::max(1, settings.repeats / 2) : settings.repeats;
  torch::manual_seed(0);
  auto x = torch::randn({c.b, c.t, c.d}, torch::requires_grad(train));
  torch::AutoGradMode grad_mode(train);
  const double gflop = mha_gflop(c.b, c.t, c.d, true) * (train ? 3.0 : 1.0);
  auto run = [&](const std::string& impl, const std::function<torch::Tensor()>& forward,
                 double flop) {
    progress(group + " " + impl);
    const double ms = median_ms(
        [&] {
          auto y = forward();
          if (train) y.sum().backward();
        },
        repeats);
    record(group, impl, pass, c.t, ms, flop);
  };

  for (auto [backend, name] : {std::pair{Backend::Auto, "auto"},
                               {Backend::Chunked, "chunked"},
                               {Backend::Math, "math"},
                               {Backend::Native, "native"}}) {
    if (train && backend == Backend::Native) continue;  // no backward in 1.13's private kernel
    attention::MultiHeadAttention mha(
        attention::MultiHeadAttentionOptions(c.d, c.d, c.h).context_length(c.t));
    const auto backend_copy = backend;
    run(
        std::string("cpp.fused.") + name,
        [&] {
          return mha(x, attention::MultiHeadAttentionForwardOptions().backend(backend_copy)).output;
        },
        gflop);
  }
  torch::nn::MultiheadAttention torch_mha(c.d, c.h);
  auto causal = torch::zeros({c.t, c.t})
                    .masked_fill(torch::ones({c.t, c.t}, torch::kBool).triu(1), -INFINITY);
  run(
      "cpp.torch_nn_mha",
      [&] {
        auto xt = x.transpose(0, 1);
        return std::get<0>(torch_mha(xt, xt, xt, torch::Tensor(), /*need_weights=*/false, causal));
      },
      gflop);
  if (!train) {
    attention::MultiHeadAttentionWrapper wrapper(c.d, c.d / c.h, c.d / c.h, c.h);
    run(
        "cpp.wrapper", [&] { return wrapper(x); },
        (3.0 * 2 * c.b * c.t * c.d * c.d + 2.0 * 2 * c.b * c.t * c.t * c.d) / 1e9);
    auto q = torch::randn({c.b, c.h, c.t, c.d / c.h});
    auto k = torch::randn_like(q), v = torch::randn_like(q);
    for (auto [backend, name] : {std::pair{Backend::Chunked, "chunked"},
                                 {Backend::Math, "math"},
                                 {Backend::Native, "native"}}) {
      const auto backend_copy = backend;
      run(
          std::string("cpp.core.") + name,
          [&] {
            return F::scaled_dot_product_attention(
                       q, k, v,
                       F::ScaledDotProductAttentionOptions().is_causal(true).backend(backend_copy))
                .output;
          },
          2.0 * c.b * c.t * c.t * c.d / 1e9);
    }
  }
}

// One causal forward and backward of the attention core on `backend`; gradients by
// autograd::grad, so nothing accumulates between repeats.
void causal_train_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& upstream, Backend backend) {
  auto out = F::scaled_dot_product_attention(
                 q, k, v, F::ScaledDotProductAttentionOptions().is_causal(true).backend(backend))
                 .output;
  torch::autograd::grad({out}, {q, k, v}, {upstream});
}

// The attention core's forward and backward (B=8, H=12, T=1024, head size 64, causal), each
// backend.
void bench_core_train() {
  Raschka c;
  if (settings.quick) c = {2, 128, 64, 4};
  torch::manual_seed(0);
  const auto make = [&] {
    return torch::randn({c.b, c.h, c.t, c.d / c.h}, torch::requires_grad());
  };
  auto q = make(), k = make(), v = make();
  const auto upstream = torch::randn({c.b, c.h, c.t, c.d / c.h});
  // Forward 2 products, backward 5 (one recomputes the scores), half of each causal.
  const double gflop = 7.0 * c.b * c.h * c.t * c.t * (c.d / c.h) / 1e9;
  for (auto [backend, name] : {std::pair{Backend::Chunked, "chunked"},
                               {Backend::Math, "math"},
                               {Backend::Native, "native"}}) {
    const auto backend_copy = backend;
    const auto step = [&] { causal_train_step(q, k, v, upstream, backend_copy); };
    try {
      step();
    } catch (const c10::Error& e) {  // LibTorch 1.13's private kernel has no backward
      progress(std::string("core-train ") + name + " skipped: " + e.what_without_backtrace());
      continue;
    }
    progress(std::string("core-train ") + name);
    record("core-train", std::string("cpp.core.") + name, "forward+backward", c.t,
           median_ms(step, std::max(1, settings.repeats / 2)), gflop);
  }
}

// What Auto chose for the calling thread's last call, by name.
const char* path_name(F::Path path) {
  switch (path) {
    case F::Path::Direct:
      return "direct";
    case F::Path::Math:
      return "math";
    case F::Path::ChunkedFused:
      return "chunked";
    case F::Path::ChunkedTiles:
      return "chunked-tiles";
    case F::Path::Native:
      return "native";
    case F::Path::None:
      break;
  }
  return "none";
}

// Auto's choice against each backend where the choice is made: B=1, H=8, head size 64, T from 8
// to 1024, causal and not, forward and forward+backward, through the functional API and through
// the operator torch.ops.attention.scaled_dot_product_attention (its CPU and Autograd kernels).
// Small calls are timed in runs of many, so that each sample is a few milliseconds. Each line's
// impl names the route (`functional` or `operator`), the backend, and for Auto what it took.
void bench_auto() {
  attention::register_operators();
  const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("attention::scaled_dot_product_attention", "")
          .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                               const c10::optional<torch::Tensor>&, bool, c10::string_view,
                               c10::optional<int64_t>, c10::optional<int64_t>,
                               const c10::optional<torch::Tensor>&, c10::optional<double>,
                               const c10::optional<torch::Tensor>&, c10::optional<double>, double,
                               c10::string_view, int64_t)>();
  const int64_t h = 8, d = 64;
  std::vector<int64_t> lengths = {8, 16, 32, 64, 128, 256, 512, 1024};
  if (settings.quick) lengths = {16, 128};
  const std::pair<Backend, const char*> backends[] = {
      {Backend::Auto, "auto"}, {Backend::Chunked, "chunked"}, {Backend::Math, "math"}};
  for (const bool train : {false, true}) {
    const std::string pass = train ? "forward+backward" : "forward";
    for (const bool causal : {true, false}) {
      for (const int64_t t : lengths) {
        torch::manual_seed(0);
        const auto q = torch::randn({1, h, t, d}, torch::requires_grad(train));
        const auto k = torch::randn({1, h, t, d}, torch::requires_grad(train));
        const auto v = torch::randn({1, h, t, d}, torch::requires_grad(train));
        const auto upstream = torch::randn({1, h, t, d});
        // Two products of 2 h t² d flops forward (five more backward), half of them causal.
        const double flop = (train ? 7.0 : 2.0) * 2.0 * h * t * t * d * (causal ? 0.5 : 1.0);
        const int64_t calls = std::clamp<int64_t>(static_cast<int64_t>(2e7 / flop), 1, 256);
        const double gflop = flop / 1e9;
        for (const auto& [backend, name] : backends) {
          for (const bool through_op : {false, true}) {
            const std::string backend_name = name;
            const auto call = [&, backend = backend] {
              torch::Tensor out;
              if (through_op) {
                out = op.call(q, k, v, c10::nullopt, causal, "bottom_right", c10::nullopt,
                              c10::nullopt, c10::nullopt, c10::nullopt, c10::nullopt, c10::nullopt,
                              0.0, backend_name, 256);
              } else {
                out = F::scaled_dot_product_attention(
                          q, k, v,
                          F::ScaledDotProductAttentionOptions().is_causal(causal).backend(backend))
                          .output;
              }
              if (train) torch::autograd::grad({out}, {q, k, v}, {upstream});
            };
            call();
            const std::string took = backend == Backend::Auto && !through_op
                                         ? fmt::format("({})", path_name(F::last_path()))
                                         : "";
            const double ms = median_ms(
                                  [&] {
                                    for (int64_t i = 0; i < calls; ++i) call();
                                  },
                                  settings.repeats, false) /
                              static_cast<double>(calls);
            record("auto",
                   fmt::format("cpp.{}.{}{}{}", through_op ? "operator" : "functional", name, took,
                               causal ? ".causal" : ""),
                   pass, t, ms, gflop);
          }
        }
      }
    }
  }
}

// One attention layer of two models of the book's zoo at their real sizes, MultiHeadAttention
// with their options: Qwen3-0.6B (width 1024, 16 heads of 128, 8 key/value heads, RMSNorm per
// head) and Gemma 3 1B (width 1152, 4 heads of 256, 1 key/value head, zero-centred RMSNorm, scale
// 256^-1/2, a window of 512), float32 and bfloat16: a prefill of 2048 tokens (B=1) and a decoding
// step after 4096 cached tokens through a KVCache. scripts/bench_zoo.py times the book's classes
// on the same sizes.
void bench_zoo_layer() {
  torch::NoGradGuard no_grad;
  using attention::HeadNormOptions;
  using attention::MultiHeadAttentionOptions;
  const auto qk = HeadNormOptions().eps(1e-6);
  const std::vector<std::pair<std::string, MultiHeadAttentionOptions>> layers = {
      {"qwen3_0_6b",
       MultiHeadAttentionOptions(1024, 1024, 16)
           .num_kv_heads(8)
           .head_dim(128)
           .out_bias(false)
           .qk_norm(HeadNormOptions(qk).parameter_name(attention::NormParameter::Scale))
           .rope(F::RotaryOptions().theta(1e6))},
      {"gemma3_1b", MultiHeadAttentionOptions(1152, 1152, 4)
                        .num_kv_heads(1)
                        .head_dim(256)
                        .out_bias(false)
                        .qk_norm(HeadNormOptions(qk).kind(attention::NormKind::ZeroCenteredRMS))
                        .scale(1.0 / 16)
                        .sliding_window(512)
                        .rope(F::RotaryOptions().theta(10000.0))}};
  const int64_t prefill = settings.quick ? 128 : 2048, cached = settings.quick ? 256 : 4096;
  for (const auto& [name, options] : layers) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(0);
      attention::MultiHeadAttention mha(options);
      mha->to(dtype);
      mha->eval();
      const auto tag =
          fmt::format("cpp.zoo.{}.{}", name, dtype == torch::kFloat ? "float32" : "bfloat16");
      const auto x = torch::randn({1, prefill, options.d_in()}).to(dtype);
      const double prefill_ms = median_ms([&] { mha(x); }, settings.repeats);
      // Flops: the projections (q, k, v, out) and causal attention (half the scores).
      const double hd = 128.0 * (name == "gemma3_1b" ? 2 : 1), H = options.num_heads();
      const double kv = options.num_kv_heads(), d = options.d_in();
      const double projections = 2.0 * prefill * d * hd * (2 * H + 2 * kv);
      record("zoo-layer", tag + ".prefill", "forward", prefill, prefill_ms,
             (projections + 2.0 * 2 * H * prefill * prefill * hd * 0.5) / 1e9);
      // The decoding step: a cache of `cached` tokens, one more token at a time.
      attention::KVCache cache(cached + settings.repeats + 2);
      mha(torch::randn({1, cached, options.d_in()}).to(dtype),
          attention::MultiHeadAttentionForwardOptions().kv_cache(&cache));
      const auto token = torch::randn({1, 1, options.d_in()}).to(dtype);
      const double step_ms = median_ms(
          [&] { mha(token, attention::MultiHeadAttentionForwardOptions().kv_cache(&cache)); },
          settings.repeats);
      record("zoo-layer", tag + ".decode_step", "forward", cached, step_ms,
             (2.0 * d * hd * (2 * H + 2 * kv) + 2.0 * 2 * H * cached * hd) / 1e9);
      progress(fmt::format("zoo-layer {}: prefill {:.1f} ms, decoding step {:.3f} ms", tag,
                           prefill_ms, step_ms));
    }
  }
}

// The medians of `fns` (after one warm-up call each), each called once per round in turn: a drift
// of the machine's speed during the measurement moves them alike, so their ratios hold.
std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& fns,
                                        int repeats) {
  for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> times(fns.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      times[f].push_back(median_ms(fns[f], 1, false));
    }
  }
  std::vector<double> medians;
  for (auto& t : times) medians.push_back(median_of(std::move(t)));
  return medians;
}

// The attention core on Chunked (B=8, H=12, T=1024, head size 64, causal) and the Raschka module
// (MultiHeadAttention, Auto) in float32 and in bfloat16, side by side: forward, and forward and
// backward, each pass's float32 and bfloat16 calls in turn (interleaved_medians). bfloat16 takes
// the processor's bfloat16 products where it has them (src/kernels/cpu/bf16_products.h), else
// the float kernels, widening where they read; ATTENTION_CPU_BF16=widened forces the latter,
// ATTENTION_CPU_BF16=avx512_bf16 the vector products on a processor with AMX's tiles, and the
// records say which in their name.
void bench_dtypes() {
  Raschka c;
  if (settings.quick) c = {2, 128, 64, 4};
  // A route ATTENTION_CPU_BF16 forces names the run's records: `bfloat16.widened` and
  // `float32.widened_run`, `bfloat16.avx512_bf16` and `float32.avx512_bf16_run`.
  const char* route = std::getenv("ATTENTION_CPU_BF16");
  const std::string forced = route != nullptr && *route != '\0' ? std::string(".") + route : "";
  const double forward_gflop = 2.0 * c.b * c.h * c.t * c.t * (c.d / c.h) / 1e9;
  const double train_gflop = 3.5 * forward_gflop;  // backward 5 products to the forward's 2
  const double module_gflop = mha_gflop(c.b, c.t, c.d, true);
  struct Inputs {
    std::string name;
    torch::Tensor q, k, v, upstream, x;
    attention::MultiHeadAttention mha{nullptr};
  };
  std::vector<Inputs> inputs;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    Inputs in;
    // A forced run's float32 is named apart: the report pairs it with that run's bfloat16.
    in.name = dtype == torch::kFloat ? (forced.empty() ? "float32" : "float32" + forced + "_run")
                                     : "bfloat16" + forced;
    torch::manual_seed(0);
    const auto make = [&] {
      return torch::randn({c.b, c.h, c.t, c.d / c.h}).to(dtype).requires_grad_();
    };
    in.q = make();
    in.k = make();
    in.v = make();
    in.upstream = torch::randn({c.b, c.h, c.t, c.d / c.h}).to(dtype);
    in.mha = attention::MultiHeadAttention(
        attention::MultiHeadAttentionOptions(c.d, c.d, c.h).context_length(c.t));
    in.mha->to(dtype);
    in.x = torch::randn({c.b, c.t, c.d}).to(dtype).requires_grad_();
    inputs.push_back(std::move(in));
  }
  const auto options =
      F::ScaledDotProductAttentionOptions().is_causal(true).backend(Backend::Chunked);
  const auto each = [&](const std::function<void(Inputs&)>& step) {
    std::vector<std::function<void()>> fns;
    for (auto& in : inputs) fns.push_back([&step, &in] { step(in); });
    return fns;
  };
  progress("dtypes cpp.core.chunked: float32 and bfloat16" + forced + " in turn");
  const auto core_ms =
      interleaved_medians(each([&](Inputs& in) {
                            torch::NoGradGuard no_grad;
                            F::scaled_dot_product_attention(in.q, in.k, in.v, options);
                          }),
                          settings.repeats);
  const auto core_train_ms = interleaved_medians(
      each([&](Inputs& in) { causal_train_step(in.q, in.k, in.v, in.upstream, Backend::Chunked); }),
      std::max(1, settings.repeats / 2));
  progress("dtypes cpp.fused.auto: float32 and bfloat16" + forced + " in turn");
  const auto module_ms = interleaved_medians(each([&](Inputs& in) {
                                               torch::NoGradGuard no_grad;
                                               in.mha(in.x);
                                             }),
                                             settings.repeats);
  const auto module_train_ms = interleaved_medians(
      each([&](Inputs& in) {
        in.mha(in.x).output.sum().backward();  // as raschka-train: weights' gradients too
      }),
      std::max(1, settings.repeats / 2));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string core = "cpp.core.chunked." + inputs[i].name;
    record("dtypes", core, "forward", c.t, core_ms[i], forward_gflop);
    record("dtypes", core, "forward+backward", c.t, core_train_ms[i], train_gflop);
    const std::string module = "cpp.fused.auto." + inputs[i].name;
    record("dtypes", module, "forward", c.t, module_ms[i], module_gflop);
    record("dtypes", module, "forward+backward", c.t, module_train_ms[i], 3.0 * module_gflop);
  }
}

// Training at long context (B=1, H=8, head size 64, causal): forward and backward of the core,
// with the peak memory above the inputs. Run it in a process of its own.
void bench_long_train(const std::string& impl, int64_t t) {
  const auto make = [&] { return torch::randn({1, 8, t, 64}, torch::requires_grad()); };
  auto q = make(), k = make(), v = make();
  const auto upstream = torch::randn({1, 8, t, 64});
  const double base = peak_rss_mb();
  const auto backend = impl == "math" ? Backend::Math : Backend::Chunked;
  const double ms = median_ms([&] { causal_train_step(q, k, v, upstream, backend); }, 1);
  record("long-train", "cpp.core." + impl, "forward+backward", t, ms, 7.0 * 8 * t * t * 64 / 1e9,
         peak_rss_mb() - base);
}

// Long-context runs take the median of three at every length, as bench_python.py does: single
// runs of one length swing by a fifth from call to call on these machines.
constexpr int kLongRepeats = 3;

void bench_long(const std::string& impl, int64_t t) {
  // B=1, H=8, head size 64, causal: the attention core alone.
  torch::NoGradGuard no_grad;
  auto q = torch::randn({1, 8, t, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
  const auto backend = impl == "math" ? Backend::Math : Backend::Chunked;
  const auto call = [&] {
    F::scaled_dot_product_attention(
        q, k, v, F::ScaledDotProductAttentionOptions().is_causal(true).backend(backend));
  };
  // The peak of one call (the warm-up) above the inputs: over repeated calls glibc keeps some of
  // the freed outputs (its mmap threshold rises with them), about 1 MiB more per call for a few
  // calls whatever computes them.
  const double base = peak_rss_mb();
  call();
  const double peak = peak_rss_mb() - base;
  const double ms = median_ms(call, kLongRepeats, false);
  record("long", "cpp.core." + impl, "forward", t, ms, 2.0 * 8 * t * t * 64 / 1e9, peak);
}

// Sliding-window attention at long context (B=1, H=8, head size 64, causal, each query seeing
// the `window` keys ending at its position): Chunked skips the tiles outside the window, so its
// time should follow T * window where full causal follows T^2 / 2 (bench_long).
void bench_window(int64_t t, int64_t window) {
  torch::NoGradGuard no_grad;
  auto q = torch::randn({1, 8, t, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
  const double base = peak_rss_mb();
  const auto options = F::ScaledDotProductAttentionOptions()
                           .is_causal(true)
                           .window_left(window - 1)
                           .backend(Backend::Chunked);
  const double ms =
      median_ms([&] { F::scaled_dot_product_attention(q, k, v, options); }, kLongRepeats);
  // Query i sees min(i + 1, window) keys: two products of that many multiply-adds per feature.
  const double pairs = static_cast<double>(std::min(t, window)) * (std::min(t, window) + 1) / 2 +
                       static_cast<double>(std::max<int64_t>(0, t - window)) * window;
  record("window", fmt::format("cpp.core.chunked.window{}", window), "forward", t, ms,
         4.0 * 8 * pairs * 64 / 1e9, peak_rss_mb() - base);
}

// Chunked's block size, causal, head size 64: the tile of scores a thread keeps is block x
// block, so this is the sweep of tile size against the caches. Long context (T >= 4096) has
// B=1, H=8, shorter sequences the Raschka core's B=8, H=12.
void bench_blocks(int64_t t) {
  const int64_t b = t >= 4096 ? 1 : 8, h = t >= 4096 ? 8 : 12;
  auto q = torch::randn({b, h, t, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
  const auto upstream = torch::randn_like(q);
  const auto qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(),
             vg = v.clone().requires_grad_();
  for (const int64_t block : {64, 128, 256, 512, 1024}) {
    const auto options = F::ScaledDotProductAttentionOptions()
                             .is_causal(true)
                             .backend(Backend::Chunked)
                             .block_size(block);
    const std::string impl = "cpp.core.chunked.block" + std::to_string(block);
    progress("blocks " + impl);
    const double forward = median_ms(
        [&] {
          torch::NoGradGuard no_grad;
          F::scaled_dot_product_attention(q, k, v, options);
        },
        2);
    const double gflop = 2.0 * b * h * t * t * 64 / 1e9;  // the causal half of 4 b h t^2 d
    record("blocks", impl, "forward", t, forward, gflop);
    const double train = median_ms(
        [&] {
          // The gradients accumulate from call to call: three additions of (8, T, 64).
          F::scaled_dot_product_attention(qg, kg, vg, options).output.backward(upstream);
        },
        1);
    record("blocks", impl, "forward+backward", t, train, 3.5 * gflop);
  }
}

void bench_decode() {
  // One new token against a KV cache at position P, against recomputing the causal forward.
  const int64_t d = settings.quick ? 64 : 768, h = settings.quick ? 4 : 12;
  torch::NoGradGuard no_grad;
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(d, d, h));
  std::vector<int64_t> positions = {128, 256, 512, 1024, 2048, 4096, 8192};
  if (settings.quick) positions = {16, 32};
  for (int64_t p : positions) {
    progress("decode position " + std::to_string(p));
    auto prefix = torch::randn({1, p, d}), token = torch::randn({1, 1, d});
    attention::KVCache cache(p + 1);
    mha(prefix, attention::MultiHeadAttentionForwardOptions().kv_cache(&cache));
    const double step = median_ms(
        [&] {
          cache.truncate(p);
          mha(token, attention::MultiHeadAttentionForwardOptions().kv_cache(&cache));
        },
        settings.repeats * 4);
    record("decode", "cpp.fused.kv_cache_step", "forward", p, step, mha_gflop(1, 1, d, false));
    auto whole = torch::cat({prefix, token}, 1);
    const double full = median_ms([&] { mha(whole); }, std::max(1, settings.repeats / 2));
    record("decode", "cpp.fused.recompute", "forward", p, full, mha_gflop(1, p + 1, d, true));
  }
}

// Packed prefill (functional::varlen_attention): 16 causal sequences, lengths drawn from 16 to
// 2048 with a fixed seed, H=8, head size 64, float32, on Chunked. Side by side: the packed call;
// the same sequences one scaled_dot_product_attention call each (views of the packed tensors;
// in training tensors of their own);
// and the padded batch (16, H, max T, 64) that a rectangle would need. The targets: packed within
// 1.1x of one call each, and within 1.3x of the padded batch's time scaled by
// sum T_i^2 / (16 max T^2), the share of its work that is not padding.
void bench_varlen() {
  const int64_t count = 16, heads = settings.quick ? 2 : 8, d = 64;
  const int64_t shortest = 16, longest = settings.quick ? 128 : 2048;
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int64_t> draw(shortest, longest);
  std::vector<int64_t> lengths(count), offsets{0};
  for (auto& t : lengths) {
    t = draw(rng);
    offsets.push_back(offsets.back() + t);
  }
  const int64_t total = offsets.back();
  const int64_t max_t = *std::max_element(lengths.begin(), lengths.end());
  double squares = 0, pairs = 0;  // sum T^2, and the causal pairs sum T (T + 1) / 2
  for (const int64_t t : lengths) {
    squares += static_cast<double>(t) * t;
    pairs += static_cast<double>(t) * (t + 1) / 2;
  }
  std::string text = "varlen lengths";
  for (const int64_t t : lengths) text += " " + std::to_string(t);
  progress(text);
  torch::manual_seed(0);
  const auto make = [&](int64_t tokens) { return torch::randn({tokens, heads, d}); };
  const auto q = make(total), k = make(total), v = make(total), upstream = make(total);
  const auto cu_seqlens = torch::tensor(offsets, torch::kLong);
  const auto options =
      F::ScaledDotProductAttentionOptions().is_causal(true).backend(Backend::Chunked);
  const auto packed = [&](const torch::Tensor& q_, const torch::Tensor& k_,
                          const torch::Tensor& v_) {
    return F::varlen_attention(q_, k_, v_, cu_seqlens, cu_seqlens, options);
  };
  // Sequence i's (H, T_i, d) view of a packed tensor.
  const auto sequence = [&](const torch::Tensor& t, int64_t i) {
    return t.narrow(0, offsets[i], lengths[i]).transpose(0, 1);
  };
  const auto each = [&](const torch::Tensor& q_, const torch::Tensor& k_, const torch::Tensor& v_) {
    std::vector<torch::Tensor> outputs;
    for (int64_t i = 0; i < count; ++i) {
      outputs.push_back(F::scaled_dot_product_attention(sequence(q_, i), sequence(k_, i),
                                                        sequence(v_, i), options)
                            .output);
    }
    return outputs;
  };
  const auto padded = [&](int64_t batch) { return torch::randn({batch, heads, max_t, d}); };
  const auto pq = padded(count), pk = padded(count), pv = padded(count), pup = padded(count);
  const double gflop = 4.0 * heads * d * pairs / 1e9;
  const double padded_gflop = 4.0 * heads * d * count * (max_t * (max_t + 1.0) / 2) / 1e9;
  const double share = squares / (static_cast<double>(count) * max_t * max_t);

  double ms[2][3];  // [forward, forward+backward][packed, one call each, padded]
  const char* impls[3] = {"cpp.varlen.packed", "cpp.varlen.one_call_each", "cpp.varlen.padded"};
  {
    torch::NoGradGuard no_grad;
    progress("varlen forward");
    ms[0][0] = median_ms([&] { packed(q, k, v); }, settings.repeats);
    ms[0][1] = median_ms([&] { each(q, k, v); }, settings.repeats);
    ms[0][2] =
        median_ms([&] { F::scaled_dot_product_attention(pq, pk, pv, options); }, settings.repeats);
  }
  progress("varlen forward+backward");
  const int train_repeats = std::max(1, settings.repeats / 2);
  const auto qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(),
             vg = v.clone().requires_grad_();
  ms[1][0] = median_ms(
      [&] {
        torch::autograd::grad({packed(qg, kg, vg)}, {qg, kg, vg}, {upstream});
      },
      train_repeats);
  // In training each call takes its sequence's own tensors, (T_i, H, d) as in the packed layout:
  // views of the packed leaves would add what autograd does for a narrowed view, a zero gradient
  // of the whole packed tensor per sequence and tensor (3 x 16 x 37 MB here), to the time.
  std::vector<torch::Tensor> own_q, own_k, own_v, own_upstream;
  for (int64_t i = 0; i < count; ++i) {
    const auto own = [&](const torch::Tensor& t) {
      return t.narrow(0, offsets[i], lengths[i]).clone().requires_grad_();
    };
    own_q.push_back(own(q));
    own_k.push_back(own(k));
    own_v.push_back(own(v));
    own_upstream.push_back(sequence(upstream, i));
  }
  ms[1][1] = median_ms(
      [&] {
        for (int64_t i = 0; i < count; ++i) {
          const auto heads_first = [](const torch::Tensor& t) { return t.transpose(0, 1); };
          const auto out =
              F::scaled_dot_product_attention(heads_first(own_q[i]), heads_first(own_k[i]),
                                              heads_first(own_v[i]), options)
                  .output;
          torch::autograd::grad({out}, {own_q[i], own_k[i], own_v[i]}, {own_upstream[i]});
        }
      },
      train_repeats);
  const auto pqg = pq.clone().requires_grad_(), pkg = pk.clone().requires_grad_(),
             pvg = pv.clone().requires_grad_();
  ms[1][2] = median_ms(
      [&] {
        const auto out = F::scaled_dot_product_attention(pqg, pkg, pvg, options).output;
        torch::autograd::grad({out}, {pqg, pkg, pvg}, {pup});
      },
      train_repeats);
  for (int pass = 0; pass < 2; ++pass) {
    const char* name = pass == 0 ? "forward" : "forward+backward";
    const double scale = pass == 0 ? 1.0 : 3.5;
    for (int i = 0; i < 3; ++i) {
      record("varlen", impls[i], name, total, ms[pass][i], scale * (i == 2 ? padded_gflop : gflop));
    }
    progress(fmt::format(
        "varlen {}: packed / one call each = {:.3f} (target <= 1.1); packed / (padded x {:.4f}) "
        "= {:.3f} (target <= 1.3)",
        name, ms[pass][0] / ms[pass][1], share, ms[pass][0] / (ms[pass][2] * share)));
  }
}

// ---- Serving: the machine's read rate, and decoding steps over a paged cache ----

// A record whose measure is bytes read per second: "gb_per_s" beside the usual fields (whose
// "gflops" is 0).
void record_rate(const std::string& group, const std::string& impl, int64_t t, double ms,
                 double bytes) {
  fmt::print(
      "{{\"lang\": \"cpp\", \"group\": \"{}\", \"impl\": \"{}\", \"pass\": \"forward\", "
      "\"T\": {}, \"ms\": {:.4f}, \"gflops\": 0.00, \"gb_per_s\": {:.2f}, \"bytes\": {:.0f}, "
      "\"peak_mb\": -1.0, \"threads\": {}, \"allocator\": \"{}\", \"torch\": \"{}\"}}\n",
      group, impl, t, ms, bytes / ms / 1e6, bytes, at::get_num_threads(), allocator(),
      TORCH_VERSION);
  std::fflush(stdout);
}

// The machine's memory read rate: a 512 MiB float buffer (advised for huge pages) summed by every
// thread over its share, sixteen independent sums each so that the additions never wait on one
// another. What a decoding step that reads its cache once can reach at best.
double read_rate_gb_per_s() {
  const size_t bytes = settings.quick ? (size_t{16} << 20) : (size_t{512} << 20);
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  void* memory = nullptr;
  if (posix_memalign(&memory, size_t{2} << 20, bytes) != 0) throw std::bad_alloc();
  std::unique_ptr<float, decltype(&std::free)> buffer(static_cast<float*>(memory), &std::free);
#ifdef MADV_HUGEPAGE
  madvise(memory, bytes, MADV_HUGEPAGE);
#endif
  std::fill_n(buffer.get(), n, 1.0f);
  const int64_t threads = at::get_num_threads();
  std::vector<double> sums(threads);
  const auto sum = [&] {
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* x = buffer.get() + n / threads * t;
        const int64_t count = t + 1 == threads ? n - n / threads * t : n / threads;
        float lanes[16] = {};
        int64_t i = 0;
        for (; i + 16 <= count; i += 16) {
          for (int l = 0; l < 16; ++l) lanes[l] += x[i + l];
        }
        double total = 0;
        for (; i < count; ++i) total += x[i];
        for (const float l : lanes) total += l;
        sums[t] = total;
      }
    });
  };
  progress("read-rate");
  const double ms = median_ms(sum, settings.repeats * 2);
  record_rate("read-rate", "cpp.sum_float_buffer", static_cast<int64_t>(bytes >> 20), ms,
              static_cast<double>(bytes));
  return static_cast<double>(bytes) / ms / 1e6;
}

// One core's vector multiply rates (multiply_rates.h), each as products per second and over
// float's rate. Empty where the processor has no AVX2.
void bench_multiply_rates() {
  progress("multiply-rates");
  const auto rates = attention_bench::multiply_rates(settings.repeats * 2);
  if (rates.empty()) {
    progress("multiply-rates: skipped (no AVX2 and FMA)");
    return;
  }
  const double float_rate = rates.front().products_per_s;
  for (const auto& r : rates) {
    fmt::print(
        "{{\"lang\": \"cpp\", \"group\": \"multiply-rates\", \"impl\": \"{}\", "
        "\"operands\": \"{}\", \"g_products_per_s\": {:.1f}, \"over_float\": {:.2f}, "
        "\"threads\": 1, \"torch\": \"{}\"}}\n",
        r.instructions, r.operands, r.products_per_s / 1e9, r.products_per_s / float_rate,
        TORCH_VERSION);
  }
  std::fflush(stdout);
}

// The same step over an 8-bit cache: the keys and values written into a PagedKVCache of dtype
// Char (codes and a scale per row), its pages then laid in the float step's shuffled order. The
// step time against the float cache's (`float_ms`), and its bytes read per second.
void bench_int8_decode(const torch::Tensor& packed_q, const torch::Tensor& k,
                       const torch::Tensor& v, const torch::Tensor& index,
                       const F::ScaledDotProductAttentionOptions& options, double float_ms) {
  const int64_t kv_heads = k.size(1), p = k.size(2), d = k.size(3), pages = index.numel();
  const int64_t page = p / pages;
  attention::PagedKVCache cache(
      attention::PagedKVCacheOptions(pages, page, kv_heads, d).dtype(torch::kChar));
  const int64_t s = cache.add_sequence();
  cache.write(0, cache.extend({s}, {p}), k[0].transpose(0, 1), v[0].transpose(0, 1));
  // The cache took pages 0, 1, 2...: page j holds keys [j * page, (j + 1) * page).
  const auto shuffled = [&](const torch::Tensor& pool) {
    return torch::empty_like(pool).index_copy_(0, index, pool);
  };
  const auto key_pages = shuffled(cache.keys(0)), value_pages = shuffled(cache.values(0));
  const auto key_scales = shuffled(cache.key_scales(0));
  const auto value_scales = shuffled(cache.value_scales(0));
  const auto table = index.view({1, pages});
  const auto starts = torch::tensor({int64_t{0}, int64_t{1}});
  const auto lengths = torch::tensor({p});
  const auto step = [&] {
    F::paged_attention(packed_q, key_pages, key_scales, value_pages, value_scales, starts, lengths,
                       table, options);
  };
  const double bytes = 2.0 * kv_heads * p * (d + 4);
  const double all_threads = median_ms(step, settings.repeats * 4);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one_thread = median_ms(step, settings.repeats * 4);
  at::set_num_threads(threads);
  // The keys' route: integer products against coded queries, or (ATTENTION_CPU_INT8=widened)
  // the float products, whose records say so in their name.
  const char* int8_route = std::getenv("ATTENTION_CPU_INT8");
  const bool coded = int8_route == nullptr || std::string(int8_route) != "widened";
  const std::string route = coded ? "" : ".widened";
  const std::string impl = fmt::format("cpp.int8.kv{}", kv_heads);
  record_rate("paged-decode", impl + ".paged" + route, p, all_threads, bytes);
  record_rate("paged-decode", impl + ".paged_one_thread" + route, p, one_thread, bytes);
  progress(fmt::format(
      "paged-decode int8 kv{} {} ({}): step time / float32's = {:.3f} (target <= {}); bytes per "
      "token {:.0f} of float32's {:.0f} = {:.3f}; reads {:.1f} GB/s",
      kv_heads, p, coded ? "integer products" : "widened", all_threads / float_ms,
      kv_heads == 1 ? 0.4 : 0.35, 2.0 * kv_heads * (d + 4), 2.0 * kv_heads * d * 4,
      (d + 4) / (4.0 * d), bytes / all_threads / 1e6));
}

// Keys and values (1, Hkv, T, d) in the pages of a cache of `page` tokens each, the pages in
// shuffled order (rows a page apart lie anywhere in the pool, as in a cache that has served for a
// while), and the sequence's page table.
struct ShuffledPages {
  torch::Tensor keys, values, table, index;
  ShuffledPages(const torch::Tensor& k, const torch::Tensor& v, int64_t page) {
    const int64_t kv_heads = k.size(1), pages = k.size(2) / page;
    std::vector<int64_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    // Page order[j] holds keys [j * page, (j + 1) * page).
    index = torch::tensor(order, torch::kLong);
    const auto paged = [&](const torch::Tensor& t) {
      auto pool = torch::empty({pages, kv_heads, page, t.size(3)}, t.options());
      pool.index_copy_(0, index, t[0].view({kv_heads, pages, page, t.size(3)}).transpose(0, 1));
      return pool;
    };
    keys = paged(k);
    values = paged(v);
    table = index.view({1, pages});
  }
};

// One sequence's decoding step (32 query heads of 128 features; 8 key/value heads, and 1:
// multi-query) at positions 4096 to 32768, float32 and bfloat16: the attention core on contiguous
// keys (Chunked) and through a paged cache's table (pages of 16 tokens in shuffled order), the
// paged one on every thread (its keys split across them when there are fewer key/value heads than
// threads) and on one thread; each as the keys and values it reads per second, beside the read
// rate measured first.
void bench_paged_decode() {
  torch::NoGradGuard no_grad;
  const double rate = read_rate_gb_per_s();
  std::vector<int64_t> positions = {4096, 16384, 32768};
  if (settings.quick) positions = {1024};
  const int64_t heads = 32, d = 128, page = 16;
  // Each shape's float32 and bfloat16 steps one after the other, so that their ratio is taken
  // within a minute of the host's rate.
  for (const int64_t kv_heads : {8, 1}) {
    for (const int64_t p : positions) {
      double float_step_ms = 0;
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        const std::string type = dtype == torch::kFloat ? "float32" : "bfloat16";
        progress(fmt::format("paged-decode {} kv_heads {} position {}", type, kv_heads, p));
        torch::manual_seed(0);
        const auto q = torch::randn({1, heads, 1, d}).to(dtype);
        const auto k = torch::randn({1, kv_heads, p, d}).to(dtype);
        const auto v = torch::randn({1, kv_heads, p, d}).to(dtype);
        const ShuffledPages pages(k, v, page);
        const auto &key_pages = pages.keys, &value_pages = pages.values, &table = pages.table;
        const auto starts = torch::tensor({int64_t{0}, int64_t{1}});
        const auto lengths = torch::tensor({p});
        const auto packed_q = q[0].transpose(0, 1).contiguous();  // (1, H, d)
        const auto options = F::ScaledDotProductAttentionOptions().is_causal(true);
        const double bytes = 2.0 * kv_heads * p * d * static_cast<double>(k.element_size());
        const auto step = [&] {
          F::paged_attention(packed_q, key_pages, value_pages, starts, lengths, table, options);
        };
        const double contiguous = median_ms(
            [&] {
              F::scaled_dot_product_attention(
                  q, k, v, F::ScaledDotProductAttentionOptions(options).backend(Backend::Chunked));
            },
            settings.repeats * 4);
        const double all_threads = median_ms(step, settings.repeats * 4);
        const int threads = at::get_num_threads();
        at::set_num_threads(1);
        const double one_thread = median_ms(step, settings.repeats * 4);
        at::set_num_threads(threads);
        const std::string impl = fmt::format("cpp.{}.kv{}", type, kv_heads);
        record_rate("paged-decode", impl + ".contiguous", p, contiguous, bytes);
        record_rate("paged-decode", impl + ".paged", p, all_threads, bytes);
        record_rate("paged-decode", impl + ".paged_one_thread", p, one_thread, bytes);
        progress(fmt::format(
            "paged-decode {} kv{} {}: paged / contiguous time = {:.3f} (target <= 1.1); paged "
            "reads {:.1f} GB/s = {:.2f} of the read rate (target >= 0.7); one thread / all = "
            "{:.2f}",
            type, kv_heads, p, all_threads / contiguous, bytes / all_threads / 1e6,
            bytes / all_threads / 1e6 / rate, one_thread / all_threads));
        if (dtype == torch::kBFloat16) {
          progress(fmt::format(
              "paged-decode bfloat16 kv{} {}: step time / float32's = {:.3f} (target <= 1.0)",
              kv_heads, p, all_threads / float_step_ms));
        }
        if (dtype == torch::kFloat) {
          float_step_ms = all_threads;
          // Pages of 128 tokens: a key/value head's rows of a page lie together, 64 KiB of them
          // here, where 16 tokens' rows are 8 KiB.
          const ShuffledPages large(k, v, 128);
          const double large_pages = median_ms(
              [&] {
                F::paged_attention(packed_q, large.keys, large.values, starts, lengths, large.table,
                                   options);
              },
              settings.repeats * 4);
          record_rate("paged-decode", impl + ".paged_128", p, large_pages, bytes);
          progress(
              fmt::format("paged-decode {} kv{} {}: pages of 128 tokens / contiguous time = "
                          "{:.3f}",
                          type, kv_heads, p, large_pages / contiguous));
          // With a block mask (every key visible, so the same work): what reading its blocks
          // costs a step.
          const auto masked = F::ScaledDotProductAttentionOptions(options).block_mask(
              attention::BlockMask::causal(1, p));
          const double gathered = median_ms(
              [&] {
                F::paged_attention(packed_q, key_pages, value_pages, starts, lengths, table,
                                   masked);
              },
              settings.repeats * 4);
          record_rate("paged-decode", impl + ".paged_block_mask", p, gathered, bytes);
          progress(fmt::format("paged-decode {} kv{} {}: with a block mask / without = {:.2f}",
                               type, kv_heads, p, gathered / all_threads));
          bench_int8_decode(packed_q, k, v, pages.index, options, all_threads);
        }
      }
    }
  }
}

// Requests that share a prompt: 32 of them, a prompt of 2048 tokens and 64 tokens of each
// request's own (32 query heads on 8 key/value heads of 128 features, and on 1; pages of 16
// tokens), float32 and bfloat16.
// (a) Admitting them: each request's new tokens' keys and values written into a PagedKVCache
//     and its prompt chunk attended (causal), with prefix caching (the first request computes
//     the prompt, the others find its pages and compute their own 64 tokens) against without
//     (every request computes all 2112); the pages each cache holds afterwards. The projections
//     are left out: the keys and values are random.
// (b) A decoding step of the 32 at position 2112, in the same caches: the prompt's pages shared
//     by every sequence, read once for all of them (the prefix's rows stacked), against every
//     sequence's own copy of them; and the shared pages read once per sequence, without the
//     stacking (every sequence but the first given a copy of the first page, so that no two
//     tables begin alike, the other 127 pages still shared: what the kernel did before it
//     stacked, all but one page). The bytes each reads against the least a step can read (the
//     prompt once and each sequence's own tokens).
void bench_shared_prefix() {
  torch::NoGradGuard no_grad;
  const int64_t requests = 32, prompt = settings.quick ? 256 : 2048, own = 64;
  const int64_t heads = 32, d = 128, page = 16, total = prompt + own;
  const auto causal = F::ScaledDotProductAttentionOptions().is_causal(true);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string type = dtype == torch::kFloat ? "float32" : "bfloat16";
    for (const int64_t kv_heads : {8, 1}) {
      progress(fmt::format("shared-prefix {} kv_heads {}", type, kv_heads));
      torch::manual_seed(0);
      const auto prompt_tokens = torch::arange(prompt, torch::kLong);
      const auto q = torch::randn({total + 1, heads, d}).to(dtype);
      const auto k = torch::randn({total + 1, kv_heads, d}).to(dtype);
      const auto v = torch::randn({total + 1, kv_heads, d}).to(dtype);
      const int64_t per_sequence = (total + 1 + page - 1) / page;
      const auto cache_options =
          attention::PagedKVCacheOptions(requests * per_sequence, page, kv_heads, d).dtype(dtype);
      // Admits every request into a fresh cache; returns it with its sequences.
      const auto admit = [&](bool prefix_caching, std::vector<int64_t>& sequences) {
        auto cache = std::make_unique<attention::PagedKVCache>(cache_options);
        sequences.clear();
        for (int64_t r = 0; r < requests; ++r) {
          const auto tokens =
              torch::cat({prompt_tokens, torch::arange(own, torch::kLong) + 100000 * (r + 1)});
          int64_t sequence = 0, cached = 0;
          if (prefix_caching) {
            const auto hit = cache->add_sequence(tokens);
            sequence = hit.sequence;
            cached = hit.cached_tokens;
          } else {
            sequence = cache->add_sequence();
          }
          const int64_t fresh = total - cached;
          const auto batch = cache->extend({sequence}, {fresh});
          cache->write(0, batch, k.narrow(0, cached, fresh), v.narrow(0, cached, fresh));
          F::paged_attention(q.narrow(0, cached, fresh), cache->keys(0), cache->values(0),
                             batch.query_starts(), batch.key_lengths(), batch.page_table(), causal);
          sequences.push_back(sequence);
        }
        return cache;
      };
      std::vector<int64_t> sequences;
      const int repeats = std::max(1, settings.repeats / 2);
      const double admit_shared = median_ms([&] { admit(true, sequences); }, repeats);
      const double admit_alone = median_ms([&] { admit(false, sequences); }, repeats);
      const std::string impl = fmt::format("cpp.{}.kv{}", type, kv_heads);
      record("shared-prefix", impl + ".admit_prefix_caching", "forward", total, admit_shared, 0);
      record("shared-prefix", impl + ".admit_alone", "forward", total, admit_alone, 0);
      // The decoding step, in each cache.
      const double row_bytes = 2.0 * kv_heads * d * static_cast<double>(q.element_size());
      double step_ms[3] = {0, 0, 0};  // stacked, own pages, shared pages unstacked
      int64_t held[2] = {0, 0};
      for (const bool prefix_caching : {true, false}) {
        const auto cache = admit(prefix_caching, sequences);
        const auto batch = cache->extend(sequences, std::vector<int64_t>(requests, 1));
        cache->write(0, batch, k.narrow(0, 0, requests), v.narrow(0, 0, requests));
        const auto step_q = q.narrow(0, 0, requests);
        const auto keys = cache->keys(0), values = cache->values(0);
        const auto step = [&](const torch::Tensor& table) {
          return median_ms(
              [&] {
                F::paged_attention(step_q, keys, values, batch.query_starts(), batch.key_lengths(),
                                   table, causal);
              },
              settings.repeats * 4);
        };
        step_ms[prefix_caching ? 0 : 1] = step(batch.page_table());
        held[prefix_caching ? 0 : 1] = cache->options().num_pages() - cache->free_pages();
        if (!prefix_caching) continue;
        // Each sequence after the first starts on a copy of the first page, in a page no
        // sequence holds (the pool has room for every request's own copy).
        auto table = batch.page_table().clone();
        int64_t spare = cache->options().num_pages() - 1;
        for (int64_t r = 1; r < requests; ++r, --spare) {
          const int64_t first = table[r][0].item<int64_t>();
          keys[spare].copy_(keys[first]);
          values[spare].copy_(values[first]);
          table[r][0] = spare;
        }
        step_ms[2] = step(table);
      }
      const double least = (prompt + requests * (own + 1.0)) * row_bytes;
      // Scores and weighted values: 4 d flop per query head and key.
      const double flop = 4.0 * d * heads * requests * (total + 1.0);
      const double each = requests * (total + 1.0) * row_bytes;
      record_rate("shared-prefix", impl + ".step_shared_pages", total + 1, step_ms[0], least);
      record_rate("shared-prefix", impl + ".step_own_pages", total + 1, step_ms[1], each);
      record_rate("shared-prefix", impl + ".step_shared_pages_unstacked", total + 1, step_ms[2],
                  each);
      progress(fmt::format(
          "shared-prefix {} kv{}: admitting {} requests {:.1f} ms with prefix caching, {:.1f} "
          "without = {:.3f}; pages held {} against {}; decoding step {:.3f} ms over shared "
          "pages, {:.3f} over own pages = {:.3f} (target <= 0.25), {:.3f} over shared pages "
          "unstacked = {:.3f}; bytes read at least {:.1f} MB against {:.1f} = {:.3f}; the "
          "stacked step {:.1f} GFLOP/s",
          type, kv_heads, requests, admit_shared, admit_alone, admit_shared / admit_alone, held[0],
          held[1], step_ms[0], step_ms[1], step_ms[0] / step_ms[1], step_ms[2],
          step_ms[0] / step_ms[2], least / 1e6, each / 1e6, least / each, flop / step_ms[0] / 1e6));
    }
  }
}

// A prompt chunk through the pages of a cache (what a serving step that admits a long prompt
// runs): one sequence, 32 query heads on 8 key/value heads of 128 features, causal, float32;
// C new tokens after P cached ones, the keys in pages of 16 tokens in shuffled order. Beside it,
// the same keys contiguous through varlen_attention on Chunked (the prefill kernel's tiles).
void bench_paged_prefill() {
  torch::NoGradGuard no_grad;
  const int64_t heads = 32, kv_heads = 8, d = 128, page = 16;
  const std::vector<std::pair<int64_t, int64_t>> cases =
      settings.quick ? std::vector<std::pair<int64_t, int64_t>>{{128, 0}}
                     : std::vector<std::pair<int64_t, int64_t>>{{2048, 0}, {512, 3584}};
  for (const auto& [chunk, cached] : cases) {
    progress(fmt::format("paged-prefill chunk {} after {}", chunk, cached));
    const int64_t t_k = cached + chunk, pages = (t_k + page - 1) / page;
    torch::manual_seed(0);
    const auto q = torch::randn({chunk, heads, d});
    const auto k = torch::randn({t_k, kv_heads, d});
    const auto v = torch::randn({t_k, kv_heads, d});
    std::vector<int64_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    const auto index = torch::tensor(order, torch::kLong);
    const auto paged = [&](const torch::Tensor& t) {
      const auto padded = torch::cat({t, torch::zeros({pages * page - t_k, kv_heads, d})});
      auto pool = torch::empty({pages, kv_heads, page, d});
      pool.index_copy_(0, index, padded.view({pages, page, kv_heads, d}).transpose(1, 2));
      return pool;
    };
    const auto key_pages = paged(k), value_pages = paged(v);
    const auto table = index.view({1, pages});
    const auto starts_q = torch::tensor({int64_t{0}, chunk});
    const auto starts_k = torch::tensor({int64_t{0}, t_k});
    const auto lengths = torch::tensor({t_k});
    const auto options = F::ScaledDotProductAttentionOptions().is_causal(true);
    // Each query i sees cached + i + 1 keys: 4 d flop per query head and key.
    const double pairs = static_cast<double>(chunk) * cached + chunk * (chunk + 1) / 2.0;
    const double gflop = 4.0 * d * heads * pairs / 1e9;
    const double paged_ms = median_ms(
        [&] { F::paged_attention(q, key_pages, value_pages, starts_q, lengths, table, options); },
        settings.repeats);
    const double varlen_ms = median_ms(
        [&] {
          F::varlen_attention(
              q, k, v, starts_q, starts_k,
              F::ScaledDotProductAttentionOptions(options).backend(Backend::Chunked));
        },
        settings.repeats);
    const std::string name = fmt::format("chunk{}_after{}", chunk, cached);
    record("paged-prefill", "cpp.paged." + name, "forward", chunk, paged_ms, gflop);
    record("paged-prefill", "cpp.varlen_chunked." + name, "forward", chunk, varlen_ms, gflop);
    progress(
        fmt::format("paged-prefill chunk {} after {}: paged {:.2f} ms ({:.0f} GFLOP/s), "
                    "varlen on Chunked {:.2f} ms ({:.0f} GFLOP/s): paged / varlen = {:.2f}",
                    chunk, cached, paged_ms, gflop * 1000.0 / paged_ms, varlen_ms,
                    gflop * 1000.0 / varlen_ms, paged_ms / varlen_ms));
  }
}

// Attention under a block mask against full causal attention scaled by the share of blocks each
// visits (the target: at most 1.3 times that): 16 causal documents in T positions, and
// prefix-LM over T/2 positions with a prefix of T/8; B=1, H=4, head size 64, Chunked, forward
// and forward+backward. Beside them the same documents as a dense bool mask, which the fused
// kernels read pair by pair.
void bench_block_attention(int64_t t) {
  using attention::BlockMask;
  using Block = BlockMask::Block;
  const auto visited = [](const BlockMask& m) {
    return static_cast<double>(m.count(Block::Full) + m.count(Block::Partial));
  };
  const auto time_call = [](int64_t n, const F::ScaledDotProductAttentionOptions& options,
                            bool train) {
    auto q = torch::randn({1, 4, n, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
    const auto upstream = torch::randn_like(q);
    if (train) {
      for (auto* x : {&q, &k, &v}) x->requires_grad_(true);
    }
    return median_ms(
        [&] {
          torch::AutoGradMode grad(train);
          auto out = F::scaled_dot_product_attention(q, k, v, options).output;
          if (train) out.backward(upstream);
        },
        train ? 1 : settings.repeats);
  };
  const int64_t documents = 16, length = (t + documents - 1) / documents;
  std::vector<int64_t> ids(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) ids[static_cast<size_t>(i)] = i / length;
  const int64_t t_prefix = t / 2;
  struct Case {
    std::string name;
    int64_t n;
    BlockMask mask;
  };
  const std::vector<Case> cases{
      {"documents", t, BlockMask::document(torch::tensor(ids)) & BlockMask::causal(t, t)},
      {"prefix_lm", t_prefix, BlockMask::prefix_lm(t_prefix, t_prefix / 4)}};
  const auto chunked = F::ScaledDotProductAttentionOptions().backend(Backend::Chunked);
  // A learned T5 relative position bias on full causal attention: what the bias costs.
  {
    const auto buckets = F::RelativeBuckets::t5();
    auto table = torch::randn({buckets.num_buckets(), 4}) * 0.1;
    for (const bool train : {false, true}) {
      const std::string pass = train ? "forward+backward" : "forward";
      table.requires_grad_(train);
      progress(fmt::format("block-attention relative bias T={} {}", t_prefix, pass));
      const auto causal = F::ScaledDotProductAttentionOptions(chunked).is_causal(true);
      const double plain_ms = time_call(t_prefix, causal, train);
      const double biased_ms = time_call(
          t_prefix,
          F::ScaledDotProductAttentionOptions(causal).relative_bias(table).relative_buckets(
              buckets),
          train);
      record("block-attention", "cpp.core.chunked.causal", pass, t_prefix, plain_ms, 0);
      record("block-attention", "cpp.core.chunked.causal.relative_bias_t5", pass, t_prefix,
             biased_ms, 0);
      progress(
          fmt::format("block-attention relative bias T={} {}: with T5's bias {:.1f} ms, "
                      "without {:.1f} ms: {:.2f}x",
                      t_prefix, pass, biased_ms, plain_ms, biased_ms / plain_ms));
    }
  }
  // A score modification of the user's, called once per tile with LibTorch's ops on it:
  // soft-capping written as a ScoreMod (with its derivative) against the softcap option's own loop.
  {
    const double cap = 20.0;
    const attention::ScoreMod capped(
        [cap](const torch::Tensor& s, const attention::ScoreTile&) {
          return s.div_(cap).tanh_().mul_(cap);
        },
        [cap](const torch::Tensor& s, const torch::Tensor& g, const attention::ScoreTile&) {
          return g.mul_(1 - s.div(cap).tanh_().square_());
        });
    const auto causal = F::ScaledDotProductAttentionOptions(chunked).is_causal(true);
    for (const bool train : {false, true}) {
      const std::string pass = train ? "forward+backward" : "forward";
      progress(fmt::format("block-attention score_mod T={} {}", t_prefix, pass));
      const double option_ms =
          time_call(t_prefix, F::ScaledDotProductAttentionOptions(causal).softcap(cap), train);
      const double mod_ms =
          time_call(t_prefix, F::ScaledDotProductAttentionOptions(causal).score_mod(capped), train);
      record("block-attention", "cpp.core.chunked.causal.softcap", pass, t_prefix, option_ms, 0);
      record("block-attention", "cpp.core.chunked.causal.score_mod_softcap", pass, t_prefix, mod_ms,
             0);
      progress(
          fmt::format("block-attention score_mod T={} {}: soft-capping as a ScoreMod "
                      "{:.1f} ms, as the softcap option {:.1f} ms: {:.2f}x",
                      t_prefix, pass, mod_ms, option_ms, mod_ms / option_ms));
    }
  }
  for (const auto& c : cases) {
    const double share = visited(c.mask) / visited(BlockMask::causal(c.n, c.n));
    for (const bool train : {false, true}) {
      const std::string pass = train ? "forward+backward" : "forward";
      progress(fmt::format("block-attention {} T={} {}", c.name, c.n, pass));
      const double causal_ms =
          time_call(c.n, F::ScaledDotProductAttentionOptions(chunked).is_causal(true), train);
      const double masked_ms =
          time_call(c.n, F::ScaledDotProductAttentionOptions(chunked).block_mask(c.mask), train);
      double dense_ms = 0;
      if (c.name == "documents") {
        dense_ms = time_call(
            c.n, F::ScaledDotProductAttentionOptions(chunked).attn_mask(c.mask.to_attn_mask()),
            train);
        record("block-attention", "cpp.core.chunked.dense_mask." + c.name, pass, c.n, dense_ms, 0);
      }
      record("block-attention", "cpp.core.chunked.causal", pass, c.n, causal_ms, 0);
      record("block-attention", "cpp.core.chunked.block_mask." + c.name, pass, c.n, masked_ms, 0);
      progress(fmt::format(
          "block-attention {} T={} {}: block mask {:.1f} ms, full causal {:.1f} ms, visited "
          "blocks / causal's = {:.4f}; block mask / (causal x share) = {:.2f} (target <= 1.3){}",
          c.name, c.n, pass, masked_ms, causal_ms, share, masked_ms / (causal_ms * share),
          dense_ms > 0 ? fmt::format("; dense bool mask {:.1f} ms, block mask / dense = {:.3f}",
                                     dense_ms, masked_ms / dense_ms)
                       : std::string()));
    }
  }
}

// Building block masks (attention/block_mask.h) for T positions: 16 documents of equal length
// with causal attention inside each, from the builders (classes from each block's first and last
// position) and from a mask function asked about every element; beside them, the causal attention
// call such a mask serves (B=1, H=8, head size 64, Chunked), and each mask's memory.
void bench_block_mask(int64_t t) {
  torch::NoGradGuard no_grad;
  using attention::BlockMask;
  const int64_t documents = 16, length = (t + documents - 1) / documents;
  std::vector<int64_t> ids(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) ids[static_cast<size_t>(i)] = i / length;
  const auto id_tensor = torch::tensor(ids);
  progress(fmt::format("block-mask {} builders", t));
  BlockMask built = BlockMask::causal(1, 1);
  const double builders_ms = median_ms(
      [&] { built = BlockMask::document(id_tensor) & BlockMask::causal(t, t); }, settings.repeats);
  progress(fmt::format("block-mask {} from a function", t));
  const auto same_document = [&ids](int64_t, int64_t, int64_t q, int64_t kv) {
    return kv <= q && ids[static_cast<size_t>(q)] == ids[static_cast<size_t>(kv)];
  };
  BlockMask evaluated = BlockMask::causal(1, 1);
  const double function_ms =
      median_ms([&] { evaluated = BlockMask::from_function(same_document, 1, 1, t, t); }, 1, false);
  progress(fmt::format("block-mask {} causal attention", t));
  auto q = torch::randn({1, 8, t, 64}), k = torch::randn_like(q), v = torch::randn_like(q);
  const double attention_ms = median_ms(
      [&] {
        F::scaled_dot_product_attention(
            q, k, v,
            F::ScaledDotProductAttentionOptions().is_causal(true).backend(Backend::Chunked));
      },
      1);
  const double blocks = static_cast<double>(built.q_blocks() * built.kv_blocks());
  std::ostringstream described;
  described << built;
  record("block-mask", "cpp.build.builders", "build", t, builders_ms, 0, blocks / 1048576.0);
  record("block-mask", "cpp.build.from_function", "build", t, function_ms, 0, blocks / 1048576.0);
  record("block-mask", "cpp.core.chunked.causal", "forward", t, attention_ms,
         2.0 * 8 * t * t * 64 / 1e9);
  progress(fmt::format(
      "block-mask {}: {} ({} bytes of classes); builders {:.3f} ms, from_function {:.0f} ms, "
      "the causal call it serves {:.0f} ms; builders / call = {:.5f}, from_function / call = "
      "{:.2f}; the two agree: {}",
      t, described.str(), built.q_blocks() * built.kv_blocks(), builders_ms, function_ms,
      attention_ms, builders_ms / attention_ms, function_ms / attention_ms,
      torch::equal(built.full_kv_indices(), evaluated.full_kv_indices()) &&
          torch::equal(built.kv_num_blocks(), evaluated.kv_num_blocks())));
}

// One decoding step of a DeepSeek-V2-Lite-like attention layer scaled to this machine (d_in =
// d_out = 2048, 16 heads of 128 features, a latent of 512) at positions 4096 to 32768, whole
// modules (projections included): MultiHeadLatentAttention over a LatentCache (the absorbed
// form), the book's form over the same cache (every cached latent up-projected to keys and values
// each step; at 4096 only, it grows with T x latent x d_out), MLA with DeepSeek's decoupled
// rotary part of 64 features (V2-Lite's qk_rope_head_dim, cached beside the latent), and
// MultiHeadAttention with a KVCache of 16 heads (MHA) and of 4 (GQA). Each with its cache's bytes
// per token.
void bench_mla_decode() {
  torch::NoGradGuard no_grad;
  const int64_t d = settings.quick ? 256 : 2048, heads = 16, latent = settings.quick ? 64 : 512;
  const int64_t rope = settings.quick ? 8 : 64;
  std::vector<int64_t> positions = {4096, 16384, 32768};
  if (settings.quick) positions = {256};
  torch::manual_seed(0);
  attention::MultiHeadLatentAttention mla(
      attention::MultiHeadLatentAttentionOptions(d, d, heads).latent_dim(latent));
  attention::MultiHeadLatentAttention mla_rope(
      attention::MultiHeadLatentAttentionOptions(d, d, heads).latent_dim(latent).rope_dim(rope));
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(d, d, heads));
  attention::MultiHeadAttention gqa(
      attention::MultiHeadAttentionOptions(d, d, heads).num_kv_heads(4));
  const int64_t head_dim = d / heads;
  const auto token = torch::randn({1, 1, d});
  for (const int64_t p : positions) {
    attention::LatentCache latent_cache(p + 1);
    latent_cache.append(torch::randn({1, p, latent}));
    const auto absorbed = [&] {
      latent_cache.truncate(p);
      mla(token, &latent_cache);
    };
    const double mla_ms = median_ms(absorbed, settings.repeats * 4);
    record_rate("mla-decode", "cpp.mla.absorbed", p, mla_ms, 4.0 * latent * p);
    double book_ms = 0;
    if (p == positions.front()) {
      // The book's form: the step's latent joins the cache, then every latent is up-projected.
      const auto book = [&] {
        latent_cache.truncate(p);
        const auto all = latent_cache.append(mla->W_DKV(token));
        const auto split = [&](const torch::Tensor& t) {
          return t.view({1, -1, heads, head_dim}).transpose(1, 2);
        };
        const auto context =
            F::scaled_dot_product_attention(split(mla->W_query(token)), split(mla->W_UK(all)),
                                            split(mla->W_UV(all)),
                                            F::ScaledDotProductAttentionOptions().is_causal(true))
                .output;
        mla->out_proj(context.transpose(1, 2).reshape({1, 1, d}));
      };
      book_ms = median_ms(book, settings.repeats);
      record_rate("mla-decode", "cpp.mla.book_form", p, book_ms, 4.0 * latent * p);
    }
    std::string text = fmt::format("mla-decode {}: MLA absorbed {:.2f} ms ({} bytes per token)", p,
                                   mla_ms, 4 * latent);
    if (book_ms > 0)
      text += fmt::format("; book's form {:.1f} ms ({:.0f}x)", book_ms, book_ms / mla_ms);
    attention::LatentCache rope_cache(p + 1);
    rope_cache.append(torch::randn({1, p, latent + rope}));
    const double rope_ms = median_ms(
        [&] {
          rope_cache.truncate(p);
          mla_rope(token, &rope_cache);
        },
        settings.repeats * 4);
    record_rate("mla-decode", "cpp.mla_rope.absorbed", p, rope_ms, 4.0 * (latent + rope) * p);
    text += fmt::format("; with a rotary part of {} {:.2f} ms ({} bytes per token)", rope, rope_ms,
                        4 * (latent + rope));
    for (auto& [name, module, kv_heads] :
         {std::tuple{"mha", mha, heads}, std::tuple{"gqa", gqa, int64_t{4}}}) {
      attention::KVCache cache(p + 1);
      const auto options = attention::MultiHeadAttentionForwardOptions().kv_cache(&cache);
      cache.append(torch::randn({1, kv_heads, p, head_dim}),
                   torch::randn({1, kv_heads, p, head_dim}));
      auto m = module;
      const double ms = median_ms(
          [&] {
            cache.truncate(p);
            m(token, options);
          },
          settings.repeats * 4);
      const double bytes_per_token = 2.0 * kv_heads * head_dim * 4;
      record_rate("mla-decode", fmt::format("cpp.{}.kv{}", name, kv_heads), p, ms,
                  bytes_per_token * p);
      text += fmt::format("; {} {:.2f} ms ({:.0f} bytes per token, {:.2f}x MLA's time)", name, ms,
                          bytes_per_token, ms / mla_ms);
    }
    progress(text);
  }
}

// Gated DeltaNet's delta rule (B = 1, H = 8, head_dim 64, float32) at T = 4096 and 16384: the
// fused kernel against the recurrence in LibTorch ops (Backend::Math, the book's loop; training
// at 4096 only, its graph keeps every token's state), and against causal softmax attention of the
// same sizes on Chunked, inference and training. Then one decoding step of the whole module
// (d = 512) at both positions beside MultiHeadAttention's over a KVCache.
void bench_deltanet() {
  const int64_t h = 8, d = 64;
  std::vector<int64_t> lengths = {4096, 16384};
  if (settings.quick) lengths = {256};
  torch::manual_seed(0);
  // 2 d² multiply-adds per token and head for the step's two passes over the state, and the
  // same again for the products Sᵀk and Sᵀq: 8 d² flops.
  const auto rule_gflop = [&](int64_t t) { return 8.0 * h * t * d * d / 1e9; };
  for (const int64_t t : lengths) {
    const auto unit = [](torch::Tensor x) { return x / x.norm(2, -1, true); };
    const auto q = unit(torch::randn({1, h, t, d})) / 8.0, k = unit(torch::randn({1, h, t, d}));
    const auto v = torch::randn({1, h, t, d});
    const auto log_decay = -torch::rand({1, h, t}) * 0.1, beta = torch::rand({1, h, t, d});
    const auto rule = [&](Backend backend, bool train) {
      std::vector<torch::Tensor> in{q, k, v, log_decay, beta};
      for (auto& x : in) x = x.detach().requires_grad_(train);
      auto out = F::gated_delta_rule(in[0], in[1], in[2], in[3], in[4],
                                     F::GatedDeltaRuleOptions().backend(backend));
      if (train) out.output.sum().backward();
    };
    const double fused_ms = median_ms([&] { rule(Backend::Chunked, false); }, settings.repeats);
    const double fused_train_ms =
        median_ms([&] { rule(Backend::Chunked, true); }, settings.repeats);
    record("deltanet", "cpp.delta_rule.fused", "forward", t, fused_ms, rule_gflop(t));
    record("deltanet", "cpp.delta_rule.fused", "forward+backward", t, fused_train_ms,
           3 * rule_gflop(t));
    const double recurrence_ms = median_ms([&] { rule(Backend::Math, false); }, 1, false);
    record("deltanet", "cpp.delta_rule.recurrence", "forward", t, recurrence_ms, rule_gflop(t));
    std::string text = fmt::format(
        "deltanet {}: fused forward {:.1f} ms, forward+backward {:.1f} ms; the recurrence in ops "
        "{:.0f} ms ({:.1f}x the fused)",
        t, fused_ms, fused_train_ms, recurrence_ms, recurrence_ms / fused_ms);
    if (t == lengths.front()) {
      const double train_ms = median_ms([&] { rule(Backend::Math, true); }, 1, false);
      record("deltanet", "cpp.delta_rule.recurrence", "forward+backward", t, train_ms,
             3 * rule_gflop(t));
      text += fmt::format(", its forward+backward {:.0f} ms ({:.1f}x)", train_ms,
                          train_ms / fused_train_ms);
    }
    const auto attend = [&](bool train) {
      std::vector<torch::Tensor> in{q, k, v};
      for (auto& x : in) x = x.detach().requires_grad_(train);
      auto out = F::scaled_dot_product_attention(
          in[0], in[1], in[2],
          F::ScaledDotProductAttentionOptions().is_causal(true).backend(Backend::Chunked));
      if (train) out.output.sum().backward();
    };
    const double softmax_ms = median_ms([&] { attend(false); }, settings.repeats);
    const double softmax_train_ms = median_ms([&] { attend(true); }, settings.repeats);
    const double softmax_gflop = 2.0 * h * t * t * d / 1e9;
    record("deltanet", "cpp.core.chunked.causal", "forward", t, softmax_ms, softmax_gflop);
    record("deltanet", "cpp.core.chunked.causal", "forward+backward", t, softmax_train_ms,
           2.5 * softmax_gflop);
    progress(text + fmt::format("; causal softmax attention {:.1f} ms ({:.2f}x the fused), "
                                "forward+backward {:.1f} ms ({:.2f}x)",
                                softmax_ms, softmax_ms / fused_ms, softmax_train_ms,
                                softmax_train_ms / fused_train_ms));
  }
  // Decoding: the module's step from a state, whatever the position, against MHA's over a cache.
  torch::NoGradGuard no_grad;
  const int64_t model = h * d;
  attention::GatedDeltaNet net(attention::GatedDeltaNetOptions(model, model, h));
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(model, model, h));
  const auto token = torch::randn({1, 1, model});
  for (const int64_t p : lengths) {
    attention::GatedDeltaNetState state;
    net(torch::randn({1, p, model}), &state);
    const auto carried = state;
    const double net_ms = median_ms(
        [&] {
          state = carried;
          net(token, &state);
        },
        settings.repeats * 4);
    attention::KVCache cache(p + 1);
    cache.append(torch::randn({1, h, p, d}), torch::randn({1, h, p, d}));
    const auto options = attention::MultiHeadAttentionForwardOptions().kv_cache(&cache);
    const double mha_ms = median_ms(
        [&] {
          cache.truncate(p);
          mha(token, options);
        },
        settings.repeats * 4);
    record_rate("deltanet", "cpp.gated_delta_net.decode", p, net_ms,
                static_cast<double>(state.bytes_per_sequence()));
    record_rate("deltanet", "cpp.mha.decode", p, mha_ms, 2.0 * h * d * 4 * p);
    progress(fmt::format(
        "deltanet decode at {}: GatedDeltaNet {:.3f} ms ({} bytes of state), MHA {:.3f} ms ({} "
        "bytes of cache)",
        p, net_ms, state.bytes_per_sequence(), mha_ms, 2 * h * d * 4 * p));
  }
}

// DeepSeek sparse attention over T tokens (B = 1, H = 8, head_dim 64, float32; the book's indexer
// of 4 heads of 64 on a 512-feature input) with top-k 512 and 2048: the lightning indexer's
// choice and the top-k attention over the chosen keys, each timed, against causal attention over
// all keys (Chunked), with the ratio of their arithmetic: sum over queries of min(k, t + 1)
// selected keys against t + 1 causal ones.
void bench_dsa(int64_t t) {
  torch::NoGradGuard no_grad;
  const int64_t h = 8, d = 64, model = 512;
  std::vector<int64_t> topks = {512, 2048};
  if (settings.quick) topks = {t / 16, t / 4};
  const int repeats = t > 8192 ? 1 : settings.repeats;
  torch::manual_seed(0);
  const auto q = torch::randn({1, h, t, d}), k = torch::randn({1, h, t, d}),
             v = torch::randn({1, h, t, d});
  const auto x = torch::randn({1, t, model});
  attention::LightningIndexer indexer{attention::LightningIndexerOptions(model)};
  const auto index_keys = indexer->keys(x);
  const double causal_ms = median_ms(
      [&] {
        F::scaled_dot_product_attention(
            q, k, v,
            F::ScaledDotProductAttentionOptions().is_causal(true).backend(Backend::Chunked));
      },
      repeats);
  const double causal_keys = 0.5 * static_cast<double>(t) * static_cast<double>(t + 1);
  record("dsa", "cpp.core.chunked.causal", "forward", t, causal_ms,
         4.0 * h * causal_keys * d / 1e9);
  for (const int64_t topk : topks) {
    torch::Tensor chosen;
    const double index_ms = median_ms([&] { chosen = indexer(x, index_keys, topk); }, repeats);
    const double sparse_ms = median_ms([&] { F::sparse_attention(q, k, v, chosen); }, repeats);
    double selected = 0;
    for (int64_t i = 0; i < t; ++i) selected += static_cast<double>(std::min(topk, i + 1));
    const double index_gflop = 2.0 * 4 * 64 * causal_keys / 1e9;
    record("dsa", fmt::format("cpp.dsa.indexer.top{}", topk), "forward", t, index_ms, index_gflop);
    record("dsa", fmt::format("cpp.dsa.sparse_attention.top{}", topk), "forward", t, sparse_ms,
           4.0 * h * selected * d / 1e9);
    progress(fmt::format(
        "dsa {} top-{}: indexer {:.1f} ms, top-k attention {:.1f} ms, together {:.1f} ms; causal "
        "attention {:.1f} ms. Attention time ratio {:.3f} against the arithmetic's {:.3f} "
        "(x{:.2f}); with the indexer {:.3f}",
        t, topk, index_ms, sparse_ms, index_ms + sparse_ms, causal_ms, sparse_ms / causal_ms,
        selected / causal_keys, (sparse_ms / causal_ms) / (selected / causal_keys),
        (index_ms + sparse_ms) / causal_ms));
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> groups;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      settings.threads = std::atoi(argv[++i]);
    } else if (arg == "--repeats" && i + 1 < argc) {
      settings.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--quick") {
      settings.quick = true;
      settings.repeats = 1;
    } else if (arg == "--help" || arg == "-h") {
      fmt::print(
          "usage: attention-bench [--threads N] [--repeats N] [--quick] GROUP...\n"
          "groups: matmul article raschka raschka-train core-train decode dtypes varlen\n"
          "        long:chunked|math:T long-train:chunked|math:T window:T:W blocks:T\n"
          "        read-rate multiply-rates paged-decode paged-prefill shared-prefix\n"
          "        block-mask:T block-attention:T\n"
          "        mla-decode deltanet dsa:T auto zoo-layer\n");
      return 0;
    } else {
      groups.push_back(arg);
    }
  }
  at::set_num_threads(settings.threads);
  fmt::print(stderr, "attention-bench: {} thread(s), LibTorch {}, allocator {}\n",
             at::get_num_threads(), TORCH_VERSION, allocator());
  for (const auto& g : groups) {
    if (g == "matmul") {
      bench_matmul();
    } else if (g == "article") {
      bench_article();
    } else if (g == "raschka") {
      bench_raschka(false);
    } else if (g == "raschka-train") {
      bench_raschka(true);
    } else if (g == "core-train") {
      bench_core_train();
    } else if (g == "dtypes") {
      bench_dtypes();
    } else if (g == "auto") {
      bench_auto();
    } else if (g == "zoo-layer") {
      bench_zoo_layer();
    } else if (g.rfind("long-train:", 0) == 0) {
      const auto colon = g.find(':', 11);
      bench_long_train(g.substr(11, colon - 11), std::stoll(g.substr(colon + 1)));
    } else if (g.rfind("blocks:", 0) == 0) {
      bench_blocks(std::stoll(g.substr(7)));
    } else if (g.rfind("window:", 0) == 0) {
      const auto colon = g.find(':', 7);
      bench_window(std::stoll(g.substr(7, colon - 7)), std::stoll(g.substr(colon + 1)));
    } else if (g == "decode") {
      bench_decode();
    } else if (g == "varlen") {
      bench_varlen();
    } else if (g == "read-rate") {
      read_rate_gb_per_s();
    } else if (g == "multiply-rates") {
      bench_multiply_rates();
    } else if (g == "paged-decode") {
      bench_paged_decode();
    } else if (g == "mla-decode") {
      bench_mla_decode();
    } else if (g == "deltanet") {
      bench_deltanet();
    } else if (g.rfind("dsa:", 0) == 0) {
      bench_dsa(std::stoll(g.substr(4)));
    } else if (g == "paged-prefill") {
      bench_paged_prefill();
    } else if (g == "shared-prefix") {
      bench_shared_prefix();
    } else if (g.rfind("block-mask:", 0) == 0) {
      bench_block_mask(std::stoll(g.substr(11)));
    } else if (g.rfind("block-attention:", 0) == 0) {
      bench_block_attention(std::stoll(g.substr(16)));
    } else if (g.rfind("long:", 0) == 0) {
      const auto colon = g.find(':', 5);
      bench_long(g.substr(5, colon - 5), std::stoll(g.substr(colon + 1)));
    } else {
      fmt::print(stderr, "attention-bench: unknown group '{}'\n", g);
      return 2;
    }
  }
  return 0;
}
