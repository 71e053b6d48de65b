// Integer options and arguments at the ends of their range (0, 1, 2^31, 2^53, 2^62, INT64_MAX):
// each one works, with the answer that a computation written here from the definitions gives,
// or is refused by name before anything is allocated or changed.

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <array>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace F = attention::functional;
using ExtremesSdpaOptions = F::ScaledDotProductAttentionOptions;

constexpr int64_t kExtremeInt64Max = std::numeric_limits<int64_t>::max();
const std::vector<int64_t> kExtremeLargeValues = {
    int64_t{1} << 31, int64_t{1} << 53, int64_t{1} << 62, kExtremeInt64Max - 1, kExtremeInt64Max};

// The attention with whole matrices and a mask built key by key from the definitions: query i
// sits at position pos = i + offset; key j is hidden when j > pos (causal), pos - j > left or
// j - pos > right. The differences pos - j are small, so nothing here comes near the int64
// limit. A query that sees no key gets zeros (docs/CONTRACT.md).
torch::Tensor extremes_windowed_reference(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, const ExtremesSdpaOptions& o) {
  const int64_t t_q = q.size(-2), t_k = k.size(-2);
  const int64_t offset = o.causal_alignment() == F::CausalAlignment::TopLeft ? 0 : t_k - t_q;
  auto hidden = torch::zeros({t_q, t_k}, torch::kBool);
  auto h = hidden.accessor<bool, 2>();
  for (int64_t i = 0; i < t_q; ++i) {
    for (int64_t j = 0; j < t_k; ++j) {
      const int64_t pos = i + offset;
      h[i][j] = (o.is_causal() && j > pos) || (o.window_left() && pos - j > *o.window_left()) ||
                (o.window_right() && j - pos > *o.window_right());
    }
  }
  const int64_t group = q.size(-3) / k.size(-3);
  const auto keys = k.repeat_interleave(group, -3), values = v.repeat_interleave(group, -3);
  auto scores = q.matmul(keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = scores.masked_fill(hidden, -INFINITY);
  const auto blind = hidden.all(-1, /*keepdim=*/true);
  const auto weights = scores.masked_fill(blind, 0.0).softmax(-1).masked_fill(hidden, 0.0);
  return weights.matmul(values);
}

std::string extremes_window_str(const c10::optional<int64_t>& w) {
  return w ? std::to_string(*w) : std::string("unset");
}

}  // namespace

TEST_CASE(
    "extremes: windows up to INT64_MAX hide what the definition hides, forward and backward, "
    "on every backend",
    "[extremes]") {
  torch::manual_seed(38);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  std::vector<c10::optional<int64_t>> lefts = {c10::nullopt, 0, 1, 3};
  for (const int64_t w : kExtremeLargeValues) lefts.emplace_back(w);
  const std::vector<c10::optional<int64_t>> rights = {
      c10::nullopt, 0, 2, int64_t{1} << 53, kExtremeInt64Max - 1, kExtremeInt64Max};
  for (const auto& [t_q, t_k] : std::vector<std::pair<int64_t, int64_t>>{{5, 9}, {9, 5}}) {
    const auto q = torch::randn({1, 2, t_q, 4}, opts), k = torch::randn({1, 1, t_k, 4}, opts);
    const auto v = torch::randn({1, 1, t_k, 3}, opts), up = torch::randn({1, 2, t_q, 3}, opts);
    for (const auto alignment : {F::CausalAlignment::BottomRight, F::CausalAlignment::TopLeft}) {
      for (const bool causal : {false, true}) {
        for (const auto& left : lefts) {
          for (const auto& right : rights) {
            ExtremesSdpaOptions o;
            o.is_causal(causal).causal_alignment(alignment).window_left(left).window_right(right);
            auto rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(),
                 rv = v.clone().requires_grad_();
            const auto expected = extremes_windowed_reference(rq, rk, rv, o);
            expected.backward(up);
            for (const auto backend :
                 {F::Backend::Math, F::Backend::Chunked, F::Backend::Native, F::Backend::Auto}) {
              INFO("Tq " << t_q << ", Tk " << t_k << ", top-left "
                         << (alignment == F::CausalAlignment::TopLeft) << ", causal " << causal
                         << ", window " << extremes_window_str(left) << "/"
                         << extremes_window_str(right) << ", backend "
                         << static_cast<int>(backend));
              auto cq = q.clone().requires_grad_(), ck = k.clone().requires_grad_(),
                   cv = v.clone().requires_grad_();
              const auto out =
                  F::scaled_dot_product_attention(
                      cq, ck, cv, ExtremesSdpaOptions(o).backend(backend).block_size(2))
                      .output;
              out.backward(up);
              CHECK(test::max_abs_diff(out, expected) < 1e-12);
              CHECK(test::max_abs_diff(cq.grad(), rq.grad()) < 1e-12);
              CHECK(test::max_abs_diff(ck.grad(), rk.grad()) < 1e-12);
              CHECK(test::max_abs_diff(cv.grad(), rv.grad()) < 1e-12);
            }
          }
        }
      }
    }
  }
}

TEST_CASE(
    "extremes: windows up to INT64_MAX in projected_attention's direct loops and in the "
    "module",
    "[extremes]") {
  torch::manual_seed(39);
  const auto x = torch::randn({2, 6, 3});
  const auto wq = torch::randn({3, 4}), wk = torch::randn({3, 4}), wv = torch::randn({3, 2});
  for (const int64_t w : kExtremeLargeValues) {
    for (const bool causal : {false, true}) {
      INFO("window " << w << ", causal " << causal);
      const auto o = ExtremesSdpaOptions().is_causal(causal).window_left(w).window_right(w);
      const auto expected =
          extremes_windowed_reference(x.matmul(wq).unsqueeze(1), x.matmul(wk).unsqueeze(1),
                                      x.matmul(wv).unsqueeze(1), o)
              .squeeze(1);
      CHECK(test::max_abs_diff(F::projected_attention(x, x, wq, wk, wv, o), expected) < 1e-6);
    }
  }
  // sliding_window(W) is window_left W - 1 (and window_right without causality): a window
  // wider than the sequence is no window.
  for (const bool causal : {false, true}) {
    const auto input = torch::randn({2, 7, 8});
    torch::manual_seed(40);  // the same weights in every module below
    attention::MultiHeadAttention plain(
        attention::MultiHeadAttentionOptions(8, 8, 2).causal(causal));
    const auto expected = plain(input).output;
    for (const int64_t w : kExtremeLargeValues) {
      INFO("sliding_window " << w << ", causal " << causal);
      auto options = attention::MultiHeadAttentionOptions(8, 8, 2).causal(causal).sliding_window(w);
      torch::manual_seed(40);
      attention::MultiHeadAttention windowed(options);
      CHECK(test::max_abs_diff(windowed(input).output, expected) < 1e-6);
    }
  }
}

namespace {

// What each entry of the tables below expects: a result checked by `call` itself, or a refusal
// of this exception type whose message contains `fragment`.
enum class ExtremeOutcome { Works, Value, Type, Other };

struct ExtremeCase {
  std::string what;
  std::function<void()> call;
  ExtremeOutcome kind;
  std::string fragment;
};

void check_extreme_cases(const std::vector<ExtremeCase>& table) {
  for (const auto& e : table) {
    INFO(e.what);
    switch (e.kind) {
      case ExtremeOutcome::Works:
        CHECK_NOTHROW(e.call());
        break;
      case ExtremeOutcome::Value:
        CHECK_THROWS_C10(e.call(), c10::ValueError, e.fragment);
        break;
      case ExtremeOutcome::Type:
        CHECK_THROWS_C10(e.call(), c10::TypeError, e.fragment);
        break;
      case ExtremeOutcome::Other:
        CHECK_THROWS_C10(e.call(), c10::Error, e.fragment);
        break;
    }
  }
}

}  // namespace

TEST_CASE("extremes: integer options and arguments work at their extremes or are refused by name",
          "[extremes][errors]") {
  using attention::KVCache;
  using attention::MultiHeadAttentionOptions;
  const auto q = torch::randn({1, 2, 5, 4}), kv = torch::randn({1, 2, 7, 4});
  const auto math =
      F::scaled_dot_product_attention(q, kv, kv, ExtremesSdpaOptions().is_causal(true)).output;
  const auto rotate = [](const torch::Tensor& positions, F::RotaryOptions o) {
    return [=] { F::apply_rotary(torch::randn({positions.size(0), 8}), positions, o); };
  };
  std::vector<ExtremeCase> table = {
      // block_size: positive, clamped to the sequences and to 2048.
      {"block_size 0",
       [&] { F::scaled_dot_product_attention(q, kv, kv, ExtremesSdpaOptions().block_size(0)); },
       ExtremeOutcome::Value, "expected block_size > 0, got 0"},
      {"block_size -1",
       [&] { F::scaled_dot_product_attention(q, kv, kv, ExtremesSdpaOptions().block_size(-1)); },
       ExtremeOutcome::Value, "expected block_size > 0, got -1"},
      // window_left / window_right: >= 0 (the values that work are the first test's).
      {"window_left -1",
       [&] { F::scaled_dot_product_attention(q, kv, kv, ExtremesSdpaOptions().window_left(-1)); },
       ExtremeOutcome::Value, "expected window_left >= 0 (unset for no bound), got -1"},
      {"window_right INT64_MIN",
       [&] {
         F::scaled_dot_product_attention(q, kv, kv,
                                         ExtremesSdpaOptions().window_right(-kExtremeInt64Max - 1));
       },
       ExtremeOutcome::Value,
       "expected window_right >= 0 (unset for no bound), got -9223372036854775808"},
      // alibi_slopes(num_heads)
      {"alibi_slopes 0", [] { F::alibi_slopes(0); }, ExtremeOutcome::Value,
       "attention::functional::alibi_slopes: expected num_heads > 0, got 0"},
      {"alibi_slopes 1", [] { CHECK(F::alibi_slopes(1).item<double>() == 1.0 / 256); },
       ExtremeOutcome::Works, ""},
      {"alibi_slopes 2^53", [] { F::alibi_slopes(int64_t{1} << 53); }, ExtremeOutcome::Value,
       "attention::functional::alibi_slopes: expected num_heads <= 2^24, got 9007199254740992"},
      {"alibi_slopes INT64_MAX", [] { F::alibi_slopes(kExtremeInt64Max); }, ExtremeOutcome::Value,
       "attention::functional::alibi_slopes: expected num_heads <= 2^24, got "
       "9223372036854775807"},
      // Rotary: theta > 1, one rule for positions in apply_rotary and rotary_tables.
      {"apply_rotary theta 1", rotate(torch::arange(3), F::RotaryOptions().theta(1.0)),
       ExtremeOutcome::Value,
       "attention::functional::apply_rotary: expected a finite rotary theta > 1, got 1"},
      {"apply_rotary theta 0.5", rotate(torch::arange(3), F::RotaryOptions().theta(0.5)),
       ExtremeOutcome::Value, "expected a finite rotary theta > 1, got 0.5"},
      {"rotary_frequencies theta 1",
       [] { F::rotary_frequencies(F::RotaryOptions().theta(1.0).rotary_dim(4)); },
       ExtremeOutcome::Value,
       "attention::functional::rotary_frequencies: expected a finite rotary theta > 1, got 1"},
      {"rotary_tables theta -1",
       [] {
         F::rotary_tables(torch::arange(3), F::RotaryOptions().theta(-1.0).rotary_dim(4),
                          torch::kFloat);
       },
       ExtremeOutcome::Value,
       "attention::functional::rotary_tables: expected a finite rotary theta > 1"},
      {"rotary_tables float positions",
       [] {
         F::rotary_tables(torch::arange(3, torch::kFloat), F::RotaryOptions().rotary_dim(4),
                          torch::kFloat);
       },
       ExtremeOutcome::Type,
       "attention::functional::rotary_tables: expected integer positions, got Float"},
      {"rotary_tables positions (1, 3)",
       [] {
         F::rotary_tables(torch::arange(3).unsqueeze(0), F::RotaryOptions().rotary_dim(4),
                          torch::kFloat);
       },
       ExtremeOutcome::Value,
       "attention::functional::rotary_tables: expected positions (T,), got (1, 3)"},
      {"rotary_tables integer dtype",
       [] { F::rotary_tables(torch::arange(3), F::RotaryOptions().rotary_dim(4), torch::kLong); },
       ExtremeOutcome::Type,
       "attention::functional::rotary_tables: expected a floating dtype, got Long"},
      {"rotary_tables rotary_dim 0",
       [] { F::rotary_tables(torch::arange(3), F::RotaryOptions(), torch::kFloat); },
       ExtremeOutcome::Value,
       "attention::functional::rotary_tables: expected an even rotary_dim > 0, got 0"},
      {"apply_rotary rotary_dim INT64_MAX",
       rotate(torch::arange(3), F::RotaryOptions().rotary_dim(kExtremeInt64Max)),
       ExtremeOutcome::Value,
       "expected an even rotary_dim in [2, 8] (the head size; 0 for all of it), got "
       "9223372036854775807"},
      {"apply_rotary rotary_dim 2^62",
       rotate(torch::arange(3), F::RotaryOptions().rotary_dim(int64_t{1} << 62)),
       ExtremeOutcome::Value, "got 4611686018427387904"},
      {"llama3 factor 0.5",
       rotate(torch::arange(3),
              F::RotaryOptions().llama3_scaling(F::Llama3RopeScaling().factor(0.5))),
       ExtremeOutcome::Value, "expected a finite llama3_scaling factor >= 1, got 0.5"},
      {"llama3 original_context_length 0",
       rotate(torch::arange(3),
              F::RotaryOptions().llama3_scaling(F::Llama3RopeScaling().original_context_length(0))),
       ExtremeOutcome::Value, "expected llama3_scaling original_context_length > 0, got 0"},
      {"apply_rotary positions at the int64 ends",
       rotate(torch::tensor({-kExtremeInt64Max - 1, int64_t{0}, kExtremeInt64Max}),
              F::RotaryOptions()),
       ExtremeOutcome::Works, ""},
      // KVCache: max_length > 0; storage beyond int64 refused before it is allocated.
      {"KVCache max_length -1", [] { KVCache(-1); }, ExtremeOutcome::Value,
       "attention::KVCache: expected max_length > 0, got -1"},
      {"KVCache truncate -1", [] { KVCache(4).truncate(-1); }, ExtremeOutcome::Value,
       "cannot truncate to -1 tokens: 0 are cached"},
      {"KVCache truncate INT64_MAX", [] { KVCache(4).truncate(kExtremeInt64Max); },
       ExtremeOutcome::Value, "cannot truncate to 9223372036854775807 tokens"},
      // Module sizes: positive; sizes whose parameters cannot be allocated are LibTorch's
      // allocation error (a c10::Error), before any module exists.
      {"MultiHeadAttention num_heads INT64_MIN",
       [] {
         attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, -kExtremeInt64Max - 1));
       },
       ExtremeOutcome::Value, "expected num_heads > 0, got -9223372036854775808"},
      {"MultiHeadAttention context_length -1",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).context_length(-1)); },
       ExtremeOutcome::Value, "expected context_length >= 0, got -1"},
      {"MultiHeadAttention sliding_window 0",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).sliding_window(0)); },
       ExtremeOutcome::Value, "expected sliding_window >= 1 (unset for none), got 0"},
      {"MultiHeadAttention d_in INT64_MAX",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(kExtremeInt64Max, 8, 2)); },
       ExtremeOutcome::Other, ""},
      {"MultiHeadAttention d_out 2^53",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, int64_t{1} << 53, 1)); },
       ExtremeOutcome::Other, ""},
      {"SelfAttention d_out_v INT64_MAX", [] { attention::SelfAttention(3, 2, kExtremeInt64Max); },
       ExtremeOutcome::Other, ""},
      {"CrossAttention d_in_kv 2^53",
       [] {
         attention::CrossAttention(
             attention::CrossAttentionOptions(3, 2, 4).d_in_kv(int64_t{1} << 53));
       },
       ExtremeOutcome::Other, ""},
      {"MultiHeadAttentionWrapper num_heads INT64_MAX",
       [] { attention::MultiHeadAttentionWrapper(3, 2, 4, kExtremeInt64Max); },
       ExtremeOutcome::Value,
       "attention::MultiHeadAttentionWrapper: expected num_heads <= 65536 (one module each), got "
       "9223372036854775807"},
      {"MultiHeadAttentionWrapper num_heads 2^31",
       [] { attention::MultiHeadAttentionWrapper(3, 2, 4, int64_t{1} << 31); },
       ExtremeOutcome::Value, "expected num_heads <= 65536 (one module each), got 2147483648"},
      {"SlidingKVCache sink_tokens -1", [] { attention::SlidingKVCache(4, -1); },
       ExtremeOutcome::Value, "expected sink_tokens >= 0, got -1"},
      // Workspace: the sizes' product must fit in int64 (it is an element count).
      {"Workspace sizes beyond int64",
       [] {
         attention::Workspace().take(0, {(int64_t{1} << 62) + 1, 4}, torch::kFloat);
       },
       ExtremeOutcome::Value,
       "attention::Workspace::take: expected sizes of at most 2^63 - 1 bytes, got "
       "(4611686018427387905, 4) of Float"},
      {"Workspace slot INT_MIN",
       [] { attention::Workspace().take(std::numeric_limits<int>::min(), {2}, torch::kFloat); },
       ExtremeOutcome::Value, "expected a slot in [0, 16), got -2147483648"},
      {"format_tensor precision INT_MAX",
       [] { attention::format_tensor(torch::ones({2}), std::numeric_limits<int>::max()); },
       ExtremeOutcome::Value, "expected a precision in [0, 17], got 2147483647"},
      {"format_tensor precision 0",
       [] { CHECK(attention::format_tensor(torch::ones({2}), 0) == "tensor([1., 1.])"); },
       ExtremeOutcome::Works, ""},
  };
  for (const int64_t block : {int64_t{1}, int64_t{1} << 31, int64_t{1} << 53, kExtremeInt64Max}) {
    table.push_back({"block_size " + std::to_string(block),
                     [=] {
                       const auto out =
                           F::scaled_dot_product_attention(
                               q, kv, kv,
                               ExtremesSdpaOptions().is_causal(true).block_size(block).backend(
                                   F::Backend::Chunked))
                               .output;
                       CHECK(test::max_abs_diff(out, math) < 1e-6);
                     },
                     ExtremeOutcome::Works, ""});
  }
  for (const int64_t length : {int64_t{1}, int64_t{1} << 31, int64_t{1} << 53, kExtremeInt64Max}) {
    table.push_back({"llama3 original_context_length " + std::to_string(length),
                     [=] {
                       const auto f =
                           F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).llama3_scaling(
                               F::Llama3RopeScaling().original_context_length(length)));
                       CHECK(torch::isfinite(f).all().item<bool>());
                       CHECK((f > 0).all().item<bool>());
                     },
                     ExtremeOutcome::Works, ""});
  }
  for (const int64_t limit :
       {int64_t{0}, int64_t{1}, int64_t{1} << 31, int64_t{1} << 53, kExtremeInt64Max}) {
    table.push_back({"large buffer cache limit " + std::to_string(limit),
                     [=] {
                       attention::set_large_buffer_cache_limit(limit);
                       CHECK(attention::large_buffer_cache_limit() == limit);
                       attention::set_large_buffer_cache_limit(
                           attention::kDefaultLargeBufferCacheLimit);
                     },
                     ExtremeOutcome::Works, ""});
  }
  // A KVCache whose storage, (B, Hkv, max_length, head_dim), would hold more than int64 counts
  // is refused at its first append, and stays empty.
  for (const int64_t length : {int64_t{1} << 62, kExtremeInt64Max}) {
    table.push_back({"KVCache max_length " + std::to_string(length),
                     [=] {
                       KVCache cache(length);
                       const auto k = torch::randn({1, 2, 1, 4});
                       CHECK_THROWS_C10(cache.append(k, k), c10::ValueError,
                                        "attention::KVCache: storage for max_length = " +
                                            std::to_string(length) +
                                            " tokens of (1, 2, T, 4) would exceed 2^63 - 1 bytes");
                       CHECK(cache.length() == 0);
                       CHECK_FALSE(cache.keys().defined());
                     },
                     ExtremeOutcome::Works, ""});
  }
  check_extreme_cases(table);
}

TEST_CASE("extremes: a sliding cache of any window up to INT64_MAX decodes as one forward",
          "[extremes][kv_cache]") {
  torch::manual_seed(42);
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(8, 8, 2));
  const auto x = torch::randn({1, 9, 8});
  torch::NoGradGuard no_grad;
  const auto whole = mha(x).output;
  for (const int64_t window : {int64_t{1} << 31, int64_t{1} << 53, kExtremeInt64Max}) {
    for (const int64_t sinks : {int64_t{0}, int64_t{1} << 53, kExtremeInt64Max}) {
      INFO("window " << window << ", sink tokens " << sinks);
      attention::SlidingKVCache cache(window, sinks);
      std::vector<torch::Tensor> parts;
      int64_t start = 0;
      for (const int64_t n : {1, 4, 1, 3}) {
        parts.push_back(mha(x.narrow(1, start, n),
                            attention::MultiHeadAttentionForwardOptions().sliding_kv_cache(&cache))
                            .output);
        start += n;
      }
      CHECK(test::max_abs_diff(torch::cat(parts, 1), whole) < 1e-6);
      CHECK(cache.position() == 9);
    }
  }
}

TEST_CASE(
    "extremes: a cache needs bottom-right alignment, and a refused forward leaves it as it was",
    "[extremes][kv_cache]") {
  using attention::KVCache;
  using attention::MultiHeadAttention;
  using attention::MultiHeadAttentionForwardOptions;
  using attention::MultiHeadAttentionOptions;
  using attention::SlidingKVCache;
  torch::manual_seed(43);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 4, 8});
  MultiHeadAttention plain(MultiHeadAttentionOptions(8, 8, 2));

  // Top-left alignment places query i at key position i: after cached tokens that is wrong for
  // causality, windows and ALiBi, so a cache needs bottom-right.
  MultiHeadAttention top_left(
      MultiHeadAttentionOptions(8, 8, 2).causal_alignment(F::CausalAlignment::TopLeft));
  KVCache aligned(16);
  CHECK_THROWS_C10(top_left(x, MultiHeadAttentionForwardOptions().kv_cache(&aligned)),
                   c10::ValueError,
                   "attention::MultiHeadAttention: a kv_cache or sliding_kv_cache needs "
                   "causal_alignment BottomRight (the new tokens follow the cached ones), got "
                   "TopLeft");
  CHECK(aligned.length() == 0);

  // Every refusal of the forward, before or after the attention, leaves the cache as it was.
  MultiHeadAttention short_context(MultiHeadAttentionOptions(8, 8, 2).context_length(6));
  KVCache kept(16);
  short_context(x, MultiHeadAttentionForwardOptions().kv_cache(&kept));
  const auto keys_before = kept.keys().clone();
  CHECK_THROWS_C10(short_context(x, MultiHeadAttentionForwardOptions().kv_cache(&kept)),
                   c10::ValueError, "expected at most context_length = 6 keys, got 8");
  CHECK(kept.length() == 4);
  CHECK(torch::equal(kept.keys(), keys_before));
  CHECK_THROWS_C10(plain(x, MultiHeadAttentionForwardOptions().kv_cache(&kept).key_padding_mask(
                                torch::zeros({1, 5}, torch::kBool))),
                   c10::ValueError, "expected key_padding_mask (1, 8), got (1, 5)");
  CHECK(kept.length() == 4);
  // Refused by the backend, inside the attention: the cache is rolled back.
  CHECK_THROWS_C10(
      plain(x, MultiHeadAttentionForwardOptions().kv_cache(&kept).need_weights(true).backend(
                   F::Backend::Chunked)),
      c10::Error, "the Chunked backend computes neither attention weights");
  CHECK(kept.length() == 4);
  CHECK(torch::equal(kept.keys(), keys_before));
  KVCache fresh(16);
  CHECK_THROWS_C10(
      plain(x, MultiHeadAttentionForwardOptions().kv_cache(&fresh).need_weights(true).backend(
                   F::Backend::Native)),
      c10::Error, "the Native backend returns no attention weights");
  CHECK(fresh.length() == 0);
  CHECK_FALSE(fresh.keys().defined());
  SlidingKVCache sliding_kept(3);
  short_context(x, MultiHeadAttentionForwardOptions().sliding_kv_cache(&sliding_kept));
  CHECK_THROWS_C10(plain(x, MultiHeadAttentionForwardOptions()
                                .sliding_kv_cache(&sliding_kept)
                                .need_weights(true)
                                .backend(F::Backend::Chunked)),
                   c10::Error, "the Chunked backend computes neither attention weights");
  CHECK(sliding_kept.position() == 4);
  CHECK(sliding_kept.length() == 2);
}
