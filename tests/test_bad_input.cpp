// Every module and the functional layer, fed what a pipeline might wrongly produce: each case
// must raise the named exception type with a message that says what to fix.

#include <attention/attention.h>

#include "helpers.h"
#include "paged_cache_state.h"

#include <torch/torch.h>

#include <functional>
#include <limits>

namespace {

enum class Kind { Value, Type, Other };

struct BadInput {
  std::string what;
  std::function<void()> call;
  Kind kind;
  std::string fragment;
};

namespace F = attention::functional;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;

std::vector<BadInput> cases() {
  auto sa = attention::SelfAttention(3, 2, 4);
  auto causal = attention::CausalSelfAttention(3, 2, 4);
  auto cross = attention::CrossAttention(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  auto wrapper = attention::MultiHeadAttentionWrapper(3, 2, 4, 2);
  auto mha = attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).context_length(6));
  auto mha_cross =
      attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).d_in_kv(4).causal(false));
  auto mla = attention::MultiHeadLatentAttention(8, 8, 2);
  auto delta_net = attention::GatedDeltaNet(8, 8, 2);
  auto sparse = attention::DeepSeekSparseAttention(
      attention::DeepSeekSparseAttentionOptions(8, 8, 2).index_head_dim(4).topk(3));
  auto rand = [](std::vector<int64_t> shape) { return torch::rand(shape); };
  auto dq = torch::rand({2, 2, 5, 4}), dv = torch::rand({2, 2, 5, 3}),
       dlog = -torch::rand({2, 2, 5}), dbeta = torch::rand({2, 2, 5});
  const attention::SharedKV shared{torch::randn({2, 2, 5, 4}), torch::randn({2, 2, 5, 4})};
  auto x = torch::randn({2, 5, 8});
  auto meta = [](std::vector<int64_t> shape) { return torch::empty(shape, torch::kMeta); };
  auto q = torch::randn({2, 2, 5, 4}), k = torch::randn({2, 2, 6, 4}),
       v = torch::randn({2, 2, 6, 3});
  using O = F::ScaledDotProductAttentionOptions;
  auto sdpa = [=](torch::Tensor q_, torch::Tensor k_, torch::Tensor v_, O o = {}) {
    return [=] { F::scaled_dot_product_attention(q_, k_, v_, o); };
  };
  auto fwd = [](auto module, torch::Tensor input) { return [=]() mutable { module(input); }; };
  // A cache of 8 that holds one token, then given INT64_MAX more.
  auto int64_max_after_one = [](attention::KVCache cache) {
    return [cache]() mutable {
      cache.append(torch::rand({1, 1, 1, 1}), torch::rand({1, 1, 1, 1}));
      const auto big =
          torch::zeros({1, 1, 1, 1}).expand({1, 1, std::numeric_limits<int64_t>::max(), 1});
      cache.append(big, big);
    };
  };
  constexpr const char* kInt64MaxAfterOne =
      "attention::KVCache: cannot append 9223372036854775807 token(s) to the 1 cached: "
      "max_length is 8";
  auto mha_fwd = [](auto module, torch::Tensor input, MultiHeadAttentionForwardOptions o) {
    return [=]() mutable { module(input, o); };
  };
  return {
      // SelfAttention
      {"SelfAttention: rank 1", fwd(sa, torch::rand({3})), Kind::Value,
       "expected input (T, 3) or (B, T, 3), got (3,)"},
      {"SelfAttention: rank 4", fwd(sa, torch::rand({1, 2, 6, 3})), Kind::Value,
       "got (1, 2, 6, 3)"},
      {"SelfAttention: feature size", fwd(sa, torch::rand({6, 4})), Kind::Value,
       "attention::SelfAttention: expected input (T, 3) or (B, T, 3), got (6, 4)"},
      {"SelfAttention: dtype", fwd(sa, torch::rand({6, 3}, torch::kDouble)), Kind::Type,
       "of dtype Float (the parameters' dtype), got Double"},
      {"SelfAttention: integer dtype", fwd(sa, torch::ones({6, 3}, torch::kLong)), Kind::Type,
       "got Long"},
      {"SelfAttention: device", fwd(sa, meta({6, 3})), Kind::Other,
       "on device cpu (the parameters' device), got meta"},
      {"SelfAttention: undefined", fwd(sa, torch::Tensor()), Kind::Value, "to be a defined tensor"},
      {"SelfAttention: d_in 0", [] { attention::SelfAttention(0, 2, 4); }, Kind::Value,
       "expected d_in > 0, got 0"},
      // CausalSelfAttention
      {"CausalSelfAttention: feature size", fwd(causal, torch::rand({2, 6, 2})), Kind::Value,
       "attention::CausalSelfAttention: expected input (T, 3) or (B, T, 3), got (2, 6, 2)"},
      {"CausalSelfAttention: dtype", fwd(causal, torch::rand({6, 3}, torch::kDouble)), Kind::Type,
       "got Double"},
      {"CausalSelfAttention: device", fwd(causal, meta({6, 3})), Kind::Other, "got meta"},
      {"CausalSelfAttention: dropout",
       [] {
         attention::CausalSelfAttention(
             attention::CausalSelfAttentionOptions(3, 2, 4).dropout(1.5));
       },
       Kind::Value, "expected dropout in [0, 1), got 1.5"},
      // CrossAttention
      {"CrossAttention: batch sizes differ",
       [=]() mutable {
         cross(torch::rand({2, 6, 3}), torch::rand({3, 8, 5}));
       },
       Kind::Value,
       "expected x_1 and x_2 with the same batch size, got x_1 (2, 6, 3) and x_2 (3, 8, 5)"},
      {"CrossAttention: ranks differ",
       [=]() mutable {
         cross(torch::rand({6, 3}), torch::rand({1, 8, 5}));
       },
       Kind::Value, "same batch size"},
      {"CrossAttention: x_2 width",
       [=]() mutable {
         cross(torch::rand({6, 3}), torch::rand({8, 3}));
       },
       Kind::Value, "expected x_2 (T, 5) or (B, T, 5), got (8, 3)"},
      {"CrossAttention: x_1 width",
       [=]() mutable {
         cross(torch::rand({6, 5}), torch::rand({8, 5}));
       },
       Kind::Value, "expected x_1 (T, 3) or (B, T, 3), got (6, 5)"},
      {"CrossAttention: x_2 dtype",
       [=]() mutable {
         cross(torch::rand({6, 3}), torch::rand({8, 5}, torch::kDouble));
       },
       Kind::Type, "expected x_2 of dtype Float"},
      {"CrossAttention: x_2 device",
       [=]() mutable {
         cross(torch::rand({6, 3}), meta({8, 5}));
       },
       Kind::Other, "expected x_2 on device cpu"},
      // MultiHeadAttentionWrapper
      {"Wrapper: feature size", fwd(wrapper, torch::rand({6, 5})), Kind::Value,
       "attention::MultiHeadAttentionWrapper: expected input (T, 3) or (B, T, 3), got (6, 5)"},
      {"Wrapper: dtype", fwd(wrapper, torch::rand({6, 3}, torch::kDouble)), Kind::Type,
       "attention::MultiHeadAttentionWrapper: expected input of dtype Float"},
      {"Wrapper: zero heads", [] { attention::MultiHeadAttentionWrapper(3, 2, 4, 0); }, Kind::Value,
       "expected num_heads > 0, got 0"},
      // MultiHeadAttention
      {"MHA: num_heads does not divide d_out", [] { attention::MultiHeadAttention(8, 10, 3); },
       Kind::Value, "expected num_heads to divide d_out, got d_out 10 and num_heads 3"},
      {"MHA: num_kv_heads does not divide num_heads",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 12, 4).num_kv_heads(3)); },
       Kind::Value,
       "expected num_kv_heads to divide num_heads, got num_heads 4 and num_kv_heads 3"},
      {"MHA: negative context_length",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).context_length(-1)); },
       Kind::Value, "expected context_length >= 0, got -1"},
      {"MHA: odd rotary_dim",
       [] {
         attention::MultiHeadAttention(
             MultiHeadAttentionOptions(8, 8, 2).rope(F::RotaryOptions().rotary_dim(3)));
       },
       Kind::Value,
       "attention::MultiHeadAttention: expected an even rotary_dim in [2, 4] (the head size; 0 for "
       "all of it), got 3"},
      {"MHA: rope with a context",
       [] {
         auto m = attention::MultiHeadAttention(
             MultiHeadAttentionOptions(8, 8, 2).causal(false).rope(F::RotaryOptions()));
         m(torch::randn({1, 3, 8}),
           MultiHeadAttentionForwardOptions().context(torch::randn({1, 4, 8})));
       },
       Kind::Value, "rotary embeddings need queries and keys of one sequence; got a context"},
      {"SlidingKVCache: window 0", [] { attention::SlidingKVCache(0); }, Kind::Value,
       "attention::SlidingKVCache: expected window > 0, got 0"},
      {"SlidingKVCache: negative sink tokens", [] { attention::SlidingKVCache(4, -1); },
       Kind::Value, "attention::SlidingKVCache: expected sink_tokens >= 0, got -1"},
      {"MHA: both caches",
       [] {
         auto m = attention::MultiHeadAttention(8, 8, 2);
         attention::KVCache full(8);
         attention::SlidingKVCache sliding(4);
         m(torch::randn({1, 3, 8}),
           MultiHeadAttentionForwardOptions().kv_cache(&full).sliding_kv_cache(&sliding));
       },
       Kind::Value, "expected at most one of kv_cache and sliding_kv_cache, got both"},
      {"MHA: sliding cache narrower than the window",
       [] {
         auto m =
             attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).sliding_window(6));
         attention::SlidingKVCache sliding(4);
         m(torch::randn({1, 3, 8}), MultiHeadAttentionForwardOptions().sliding_kv_cache(&sliding));
       },
       Kind::Value,
       "expected a sliding_kv_cache of window >= sliding_window = 6 and no sink tokens, got "
       "window 4 and 0 sink tokens"},
      {"MHA: sliding_window 0",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).sliding_window(0)); },
       Kind::Value,
       "attention::MultiHeadAttention: expected sliding_window >= 1 (unset for none), got 0"},
      {"MHA: negative softcap",
       [] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).softcap(-50.0)); },
       Kind::Value,
       "attention::MultiHeadAttention: expected a finite softcap > 0 (unset for none), got -50"},
      // RelativeBuckets' fields are public: a table sized or indexed by fields set after t5() or
      // distance() made them would be read out of range, or every position put in one bucket.
      {"MHA: relative_bias of -1 buckets",
       [] {
         auto buckets = F::RelativeBuckets::t5(8, 16);
         buckets.buckets = -1;
         attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).relative_bias(buckets));
       },
       Kind::Value,
       "attention::MultiHeadAttention: expected relative_bias as RelativeBuckets::t5() or "
       "distance() make them (fields set since), got t5 with buckets = -1, max_distance = 16, "
       "bidirectional = true"},
      {"MHA: relative_bias of max_distance 0",
       [] {
         auto buckets = F::RelativeBuckets::t5(8, 16);
         buckets.max_distance = 0;
         attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).relative_bias(buckets));
       },
       Kind::Value, "got t5 with buckets = 8, max_distance = 0, bidirectional = true"},
      {"MHA: relative_bias of distances past its buckets",
       [] {
         auto buckets = F::RelativeBuckets::distance(2);
         buckets.max_distance = 100;
         attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).relative_bias(buckets));
       },
       Kind::Value, "got distance with buckets = 5, max_distance = 100"},
      {"MHA: relative_bias of INT64_MAX buckets",
       [] {
         auto buckets = F::RelativeBuckets::distance(2);
         buckets.buckets = std::numeric_limits<int64_t>::max();
         attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).relative_bias(buckets));
       },
       Kind::Value, "got distance with buckets = 9223372036854775807, max_distance = 2"},
      // The mask's dtype is checked before the key padding mask is folded into it.
      {"MHA: integer attn_mask with key_padding_mask",
       [=]() mutable {
         mha(x, MultiHeadAttentionForwardOptions()
                    .attn_mask(torch::zeros({5, 5}, torch::kInt))
                    .key_padding_mask(torch::zeros({2, 5}, torch::kBool)));
       },
       Kind::Type,
       "attention::MultiHeadAttention: expected attn_mask of dtype bool (true = masked out) or "
       "Float (additive), got Int"},
      {"MHA: T beyond context_length", fwd(mha, torch::randn({2, 7, 8})), Kind::Value,
       "expected at most context_length = 6 keys, got 7"},
      {"MHA: feature size", mha_fwd(mha, torch::randn({2, 5, 7}), {}), Kind::Value,
       "attention::MultiHeadAttention: expected input (T, 8) or (B, T, 8), got (2, 5, 7)"},
      {"MHA: dtype", mha_fwd(mha, x.to(torch::kDouble), {}), Kind::Type, "got Double"},
      {"MHA: device", mha_fwd(mha, meta({2, 5, 8}), {}), Kind::Other, "got meta"},
      {"MHA: key_padding_mask shape",
       mha_fwd(
           mha, x,
           MultiHeadAttentionForwardOptions().key_padding_mask(torch::zeros({2, 4}, torch::kBool))),
       Kind::Value, "expected key_padding_mask (2, 5), got (2, 4)"},
      {"MHA: key_padding_mask dtype",
       mha_fwd(mha, x, MultiHeadAttentionForwardOptions().key_padding_mask(torch::zeros({2, 5}))),
       Kind::Type, "expected key_padding_mask of dtype bool (true = padding), got Float"},
      {"MHA: attn_mask shape",
       mha_fwd(mha, x,
               MultiHeadAttentionForwardOptions().attn_mask(torch::zeros({5, 4}, torch::kBool))),
       Kind::Value, "expected attn_mask broadcastable to (2, 2, 5, 5), got (5, 4)"},
      {"MHA: attn_mask dtype",
       mha_fwd(mha, x,
               MultiHeadAttentionForwardOptions().attn_mask(torch::zeros({5, 5}, torch::kInt))),
       Kind::Type,
       "expected attn_mask of dtype bool (true = masked out) or Float (additive), got Int"},
      {"MHA: context batch",
       mha_fwd(mha_cross, x, MultiHeadAttentionForwardOptions().context(torch::randn({3, 4, 4}))),
       Kind::Value, "expected x and context with the same batch size"},
      {"MHA: context width",
       mha_fwd(mha_cross, x, MultiHeadAttentionForwardOptions().context(torch::randn({2, 4, 8}))),
       Kind::Value, "expected context (T, 4) or (B, T, 4), got (2, 4, 8)"},
      {"MHA: KV cache overflow",
       [=]() mutable {
         attention::KVCache cache(6);
         attention::MultiHeadAttention unbounded(MultiHeadAttentionOptions(8, 8, 2));
         unbounded(x, MultiHeadAttentionForwardOptions().kv_cache(&cache));
         unbounded(x.slice(1, 0, 2), MultiHeadAttentionForwardOptions().kv_cache(&cache));
       },
       Kind::Value, "cannot append 2 token(s) to the 5 cached: max_length is 6"},
      {"MHA: a KV cache past context_length",
       [=]() mutable {
         attention::KVCache cache(8);
         mha(x, MultiHeadAttentionForwardOptions().kv_cache(&cache));
         mha(x.slice(1, 0, 2), MultiHeadAttentionForwardOptions().kv_cache(&cache));
       },
       Kind::Value, "expected at most context_length = 6 keys, got 7"},
      {"MHA: KV cache of another batch",
       [=]() mutable {
         attention::KVCache cache(6);
         mha(x, MultiHeadAttentionForwardOptions().kv_cache(&cache));
         mha(torch::randn({3, 1, 8}), MultiHeadAttentionForwardOptions().kv_cache(&cache));
       },
       Kind::Value, "expected keys (2, 2, T, 4) like the cached ones, got (3, 2, 1, 4)"},
      // functional
      {"sdpa: feature sizes differ", sdpa(q, torch::randn({2, 2, 6, 5}), v), Kind::Value,
       "expected query and key with the same feature size"},
      {"sdpa: key and value lengths differ", sdpa(q, k, torch::randn({2, 2, 7, 3})), Kind::Value,
       "expected key and value that differ only in the last dimension"},
      {"sdpa: ranks differ", sdpa(q, k[0], v), Kind::Value,
       "expected query, key and value of the same rank >= 2"},
      {"sdpa: rank 1", sdpa(torch::randn({4}), torch::randn({4}), torch::randn({4})), Kind::Value,
       "of the same rank >= 2"},
      {"sdpa: heads not a multiple",
       sdpa(torch::randn({1, 3, 5, 4}), torch::randn({1, 2, 6, 4}), torch::randn({1, 2, 6, 3})),
       Kind::Value, "H a multiple of Hkv"},
      {"sdpa: dtypes differ", sdpa(q, k.to(torch::kDouble), v), Kind::Type,
       "expected query, key and value of one dtype"},
      {"sdpa: integer dtype", sdpa(q.to(torch::kLong), k.to(torch::kLong), v.to(torch::kLong)),
       Kind::Type, "expected a floating-point dtype, got Long"},
      {"sdpa: devices differ", sdpa(q, meta({2, 2, 6, 4}), v), Kind::Other,
       "expected query, key and value on one device"},
      {"sdpa: mask shape", sdpa(q, k, v, O().attn_mask(torch::zeros({5, 5}, torch::kBool))),
       Kind::Value, "expected attn_mask broadcastable to the scores (2, 2, 5, 6), got (5, 5)"},
      {"sdpa: mask dtype", sdpa(q, k, v, O().attn_mask(torch::zeros({5, 6}, torch::kInt))),
       Kind::Type,
       "expected attn_mask of dtype bool (true = masked out) or Float (additive), got Int"},
      {"sdpa: dropout_p", sdpa(q, k, v, O().dropout_p(1.0)), Kind::Value,
       "expected dropout_p in [0, 1), got 1"},
      {"sdpa: block_size", sdpa(q, k, v, O().block_size(-4)), Kind::Value,
       "expected block_size > 0, got -4"},
      {"sdpa: negative window_left", sdpa(q, k, v, O().window_left(-1)), Kind::Value,
       "attention::functional::scaled_dot_product_attention: expected window_left >= 0 (unset "
       "for no bound), got -1"},
      {"sdpa: negative window_right", sdpa(q, k, v, O().window_right(-3)), Kind::Value,
       "expected window_right >= 0 (unset for no bound), got -3"},
      {"sdpa: softcap 0", sdpa(q, k, v, O().softcap(0.0)), Kind::Value,
       "expected a finite softcap > 0 (unset for none), got 0"},
      {"sdpa: infinite softcap", sdpa(q, k, v, O().softcap(INFINITY)), Kind::Value,
       "expected a finite softcap > 0 (unset for none), got inf"},
      // Finite in double, infinite in float: softcap * tanh(s / softcap) would be NaN everywhere.
      {"sdpa: softcap beyond float", sdpa(q, k, v, O().softcap(4e38)), Kind::Value,
       "attention::functional::scaled_dot_product_attention: expected a softcap within float's "
       "range (<= 3.40282e+38) for Float queries, got 4e+38"},
      {"sdpa: scale beyond float", sdpa(q, k, v, O().scale(-1e300)), Kind::Value,
       "attention::functional::scaled_dot_product_attention: expected a scale within float's "
       "range (|scale| <= 3.40282e+38) for Float queries, got -1e+300"},
      {"MHA: softcap beyond float",
       [=] { attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).softcap(4e38))(x); },
       Kind::Value, "expected a softcap within float's range (<= 3.40282e+38) for Float queries"},
      {"sdpa: relative_buckets fields set since",
       [=] {
         auto buckets = F::RelativeBuckets::distance(2);
         buckets.max_distance = 100;
         F::scaled_dot_product_attention(
             q, k, v, O().relative_bias(torch::zeros({5, 2})).relative_buckets(buckets));
       },
       Kind::Value,
       "attention::functional::scaled_dot_product_attention: expected relative_buckets as "
       "RelativeBuckets::t5() or distance() make them (fields set since), got distance with "
       "buckets = 5, max_distance = 100, bidirectional = true"},
      {"sdpa: alibi slopes per key/value head", sdpa(q, k, v, O().alibi_slopes(torch::ones({3}))),
       Kind::Value, "expected alibi_slopes of shape (2,), one per query head, got (3,)"},
      {"sdpa: integer alibi slopes",
       sdpa(q, k, v, O().alibi_slopes(torch::ones({2}, torch::kLong))), Kind::Type,
       "expected floating-point alibi_slopes, got Long"},
      {"sdpa: NaN alibi slope", sdpa(q, k, v, O().alibi_slopes(torch::full({2}, NAN))), Kind::Value,
       "expected finite alibi_slopes, got nan"},
      {"sdpa: soft-capping on Native", sdpa(q, k, v, O().softcap(30.0).backend(F::Backend::Native)),
       Kind::Other,
       "the Native backend computes neither soft-capping, ALiBi nor attention sinks; use "
       "Backend::Math, Chunked or Auto"},
      {"sdpa: sinks per key/value head", sdpa(q, k, v, O().sinks(torch::zeros({1}))), Kind::Value,
       "expected sinks of shape (2,), one per query head, got (1,)"},
      {"sdpa: sinks of another dtype", sdpa(q, k, v, O().sinks(torch::zeros({2}, torch::kDouble))),
       Kind::Type, "expected sinks of dtype Float (the queries'), got Double"},
      {"sdpa: infinite sink", sdpa(q, k, v, O().sinks(torch::full({2}, INFINITY))), Kind::Value,
       "expected finite sinks"},
      {"apply_rotary: odd rotary_dim",
       [] {
         F::apply_rotary(torch::randn({5, 8}), torch::arange(5), F::RotaryOptions().rotary_dim(3));
       },
       Kind::Value,
       "attention::functional::apply_rotary: expected an even rotary_dim in [2, 8] (the head "
       "size; 0 for all of it), got 3"},
      {"apply_rotary: rotary_dim beyond the head",
       [] {
         F::apply_rotary(torch::randn({5, 8}), torch::arange(5), F::RotaryOptions().rotary_dim(10));
       },
       Kind::Value,
       "expected an even rotary_dim in [2, 8] (the head size; 0 for all of it), got 10"},
      {"apply_rotary: theta 0",
       [] {
         F::apply_rotary(torch::randn({5, 8}), torch::arange(5), F::RotaryOptions().theta(0.0));
       },
       Kind::Value, "expected a finite rotary theta > 1, got 0"},
      {"apply_rotary: positions per token",
       [] {
         F::apply_rotary(torch::randn({2, 5, 8}), torch::arange(6));
       },
       Kind::Value, "expected positions (5,), one per token of x (2, 5, 8), got (6,)"},
      {"apply_rotary: float positions",
       [] {
         F::apply_rotary(torch::randn({5, 8}), torch::rand({5}));
       },
       Kind::Type, "expected integer positions, got Float"},
      {"apply_rotary: integer x",
       [] {
         F::apply_rotary(torch::ones({5, 8}, torch::kLong), torch::arange(5));
       },
       Kind::Type, "expected floating-point x, got Long"},
      {"apply_rotary: llama3 frequency factors reversed",
       [] {
         F::apply_rotary(torch::randn({5, 8}), torch::arange(5),
                         F::RotaryOptions().llama3_scaling(
                             F::Llama3RopeScaling().low_freq_factor(4.0).high_freq_factor(1.0)));
       },
       Kind::Value,
       "expected llama3_scaling with 0 < low_freq_factor < high_freq_factor, got 4 and 1"},
      {"alibi_slopes: no heads", [] { F::alibi_slopes(0); }, Kind::Value,
       "attention::functional::alibi_slopes: expected num_heads > 0, got 0"},
      {"sdpa: weights from Chunked",
       sdpa(q, k, v, O().need_weights(true).backend(F::Backend::Chunked)), Kind::Other,
       "the Chunked backend computes neither attention weights nor dropout"},
      {"sdpa: weights from Native",
       sdpa(q, k, v, O().need_weights(true).backend(F::Backend::Native)), Kind::Other,
       "the Native backend returns no attention weights"},
      {"sdpa: zero key/value heads beside query heads",
       sdpa(torch::randn({1, 2, 5, 4}), torch::randn({1, 0, 6, 4}), torch::randn({1, 0, 6, 3})),
       Kind::Value, "H a multiple of Hkv >= 1, got query (1, 2, 5, 4) and key (1, 0, 6, 4)"},
      {"sdpa: zero key/value heads on Chunked",
       sdpa(torch::randn({1, 2, 5, 4}), torch::randn({1, 0, 6, 4}), torch::randn({1, 0, 6, 3}),
            O().backend(F::Backend::Chunked)),
       Kind::Value, "H a multiple of Hkv >= 1"},
      {"sdpa: leading dims differ",
       sdpa(torch::randn({2, 2, 5, 4}), torch::randn({3, 2, 6, 4}), torch::randn({3, 2, 6, 3})),
       Kind::Value, "with equal leading dimensions"},
      {"sdpa: undefined key", sdpa(q, torch::Tensor(), v), Kind::Value,
       "expected defined query, key and value tensors"},
      {"sdpa: NaN scale", sdpa(q, k, v, O().scale(std::nan(""))), Kind::Value,
       "expected a finite scale, got nan"},
      {"sdpa: infinite scale", sdpa(q, k, v, O().scale(INFINITY)), Kind::Value,
       "expected a finite scale, got inf"},
      {"sdpa: NaN dropout_p", sdpa(q, k, v, O().dropout_p(std::nan(""))), Kind::Value,
       "expected dropout_p in [0, 1), got nan"},
      {"sdpa: half on the CPU", sdpa(q.to(torch::kHalf), k.to(torch::kHalf), v.to(torch::kHalf)),
       Kind::Type, "expected Float, Double or BFloat16 on the CPU, got Half"},
      {"sdpa: float mask of another dtype",
       sdpa(q, k, v, O().attn_mask(torch::zeros({5, 6}, torch::kDouble))), Kind::Type,
       "expected attn_mask of dtype bool (true = masked out) or Float (additive), got Double"},
      {"sdpa: mask on another device", sdpa(q, k, v, O().attn_mask(meta({5, 6}).to(torch::kBool))),
       Kind::Other, "expected attn_mask on device cpu, got meta"},
      {"sdpa: dropout on Chunked", sdpa(q, k, v, O().dropout_p(0.1).backend(F::Backend::Chunked)),
       Kind::Other, "the Chunked backend computes neither attention weights nor dropout"},
      {"sdpa: a mask that requires grad on Chunked",
       sdpa(q, k, v,
            O().attn_mask(torch::zeros({5, 6}).requires_grad_(true)).backend(F::Backend::Chunked)),
       Kind::Other, "the Chunked backend does not differentiate attn_mask"},
      {"sdpa: infinite keys on Native",
       sdpa(q, k.clone().fill_(-INFINITY), v, O().backend(F::Backend::Native)), Kind::Other,
       "the Native backend cannot take non-finite queries or keys"},
      {"sdpa: NaN in a query on Native",
       sdpa(q.clone().fill_(NAN), k, v, O().backend(F::Backend::Native)), Kind::Other,
       "the Native backend cannot take non-finite queries or keys"},
      // projected_attention (the article modules' functional form and its direct path)
      {"projected: W_query rows beyond x_q's features",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({4, 2}), torch::rand({3, 2}),
                                torch::rand({3, 4}));
       },
       Kind::Value,
       "attention::functional::projected_attention: expected W_query (3, d_kq) for x_q (6, 3), "
       "got (4, 2)"},
      {"projected: x_kv 2-D beside a 3-D x_q",
       [] {
         F::projected_attention(torch::rand({1, 6, 3}), torch::rand({6, 3}), torch::rand({3, 2}),
                                torch::rand({3, 2}), torch::rand({3, 4}));
       },
       Kind::Value, "expected x_kv of the same rank and batch size as x_q (1, 6, 3), got (6, 3)"},
      {"projected: 4-D x_q",
       [] {
         auto x = torch::rand({1, 1, 6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), torch::rand({3, 2}),
                                torch::rand({3, 4}));
       },
       Kind::Value, "expected x_q (T, d_in) or (B, T, d_in), got (1, 1, 6, 3)"},
      {"projected: W_key columns differ from W_query's",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), torch::rand({3, 5}),
                                torch::rand({3, 4}));
       },
       Kind::Value, "expected W_key (3, 2) for x_kv (6, 3) and W_query (3, 2), got (3, 5)"},
      {"projected: W_value rows differ from x_kv's features",
       [] {
         F::projected_attention(torch::rand({6, 3}), torch::rand({8, 5}), torch::rand({3, 2}),
                                torch::rand({5, 2}), torch::rand({4, 4}));
       },
       Kind::Value, "expected W_value (5, d_v) for x_kv (8, 5), got (4, 4)"},
      {"projected: batch sizes differ",
       [] {
         F::projected_attention(torch::rand({2, 6, 3}), torch::rand({3, 6, 3}), torch::rand({3, 2}),
                                torch::rand({3, 2}), torch::rand({3, 4}));
       },
       Kind::Value,
       "expected x_kv of the same rank and batch size as x_q (2, 6, 3), got (3, 6, 3)"},
      {"projected: 1-D weight",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3}), torch::rand({3, 2}), torch::rand({3, 4}));
       },
       Kind::Value, "expected W_query (3, d_kq) for x_q (6, 3), got (3,)"},
      {"projected: dtypes differ",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), torch::rand({3, 2}),
                                torch::rand({3, 4}, torch::kDouble));
       },
       Kind::Type,
       "expected x_q, x_kv, W_query, W_key and W_value of one dtype, got Float, Float, Float, "
       "Float, Double"},
      {"projected: devices differ",
       [=] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), meta({3, 2}), torch::rand({3, 4}));
       },
       Kind::Other, "expected x_q, x_kv, W_query, W_key and W_value on one device"},
      {"projected: integer inputs",
       [] {
         auto x = torch::ones({6, 3}, torch::kLong);
         F::projected_attention(x, x, torch::ones({3, 2}, torch::kLong),
                                torch::ones({3, 2}, torch::kLong),
                                torch::ones({3, 4}, torch::kLong));
       },
       Kind::Type, "expected a floating-point dtype, got Long"},
      {"projected: undefined weight",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), torch::Tensor(), torch::rand({3, 4}));
       },
       Kind::Value, "expected defined x_q, x_kv, W_query, W_key and W_value tensors"},
      {"projected: mask of the wrong shape",
       [] {
         auto x = torch::rand({6, 3});
         F::projected_attention(x, x, torch::rand({3, 2}), torch::rand({3, 2}), torch::rand({3, 4}),
                                O().attn_mask(torch::zeros({6, 5}, torch::kBool)));
       },
       Kind::Value, "expected attn_mask broadcastable to the scores (6, 6), got (6, 5)"},
      // KVCache
      {"KVCache: integer keys",
       [] {
         attention::KVCache cache(4);
         auto t = torch::ones({1, 2, 1, 4}, torch::kLong);
         cache.append(t, t);
       },
       Kind::Type, "expected floating keys and values of one dtype, got Long and Long"},
      {"KVCache: keys and values of different shapes",
       [] {
         attention::KVCache cache(4);
         cache.append(torch::rand({1, 2, 1, 4}), torch::rand({1, 2, 1, 3}));
       },
       Kind::Value,
       "expected keys and values of one shape (B, Hkv, T, head_dim), got (1, 2, 1, 4)"},
      {"KVCache: undefined values",
       [] {
         attention::KVCache cache(4);
         cache.append(torch::rand({1, 2, 1, 4}), torch::Tensor());
       },
       Kind::Value, "got (1, 2, 1, 4) and undefined"},
      {"KVCache: truncate beyond the length",
       [] {
         attention::KVCache cache(4);
         cache.truncate(1);
       },
       Kind::Value, "cannot truncate to 1 tokens: 0 are cached"},
      // t_new + length must not be formed: it overflows for INT64_MAX tokens.
      {"KVCache: INT64_MAX tokens after one", int64_max_after_one(attention::KVCache(8)),
       Kind::Value, kInt64MaxAfterOne},
      {"KVCache: INT64_MAX tokens after one, 8-bit",
       int64_max_after_one(attention::KVCache(8, torch::kChar)), Kind::Value, kInt64MaxAfterOne},
      {"KVCache: 8-bit, no features",
       [] {
         attention::KVCache cache(8, torch::kChar);
         cache.append(torch::rand({1, 2, 1, 0}), torch::rand({1, 2, 1, 0}));
       },
       Kind::Value,
       "attention::KVCache: an 8-bit cache needs head_dim >= 1, got keys (1, 2, 1, 0)"},
      // Cross-layer KV sharing
      {"shared_kv: before its producer",
       [=]() mutable {
         attention::SharedKV empty;
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&empty));
       },
       Kind::Value,
       "attention::MultiHeadAttention: expected shared_kv filled by an earlier layer's forward "
       "with share_kv, got an empty SharedKV (does this layer run before its producer?)"},
      {"shared_kv: with a kv_cache",
       [=]() mutable {
         attention::KVCache cache(8);
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&shared).kv_cache(&cache));
       },
       Kind::Value,
       "a layer that reads shared_kv keeps no cache of its own (its producing layer's cache holds "
       "the keys), got a kv_cache or sliding_kv_cache"},
      {"shared_kv: with a context",
       [=]() mutable { mha(x, MultiHeadAttentionForwardOptions().shared_kv(&shared).context(x)); },
       Kind::Value, "shared_kv gives the keys and values, got a context as well"},
      {"shared_kv and share_kv",
       [=]() mutable {
         attention::SharedKV out;
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&shared).share_kv(&out));
       },
       Kind::Value, "expected share_kv or shared_kv, got both"},
      {"share_kv: with a sliding_kv_cache",
       [=]() mutable {
         attention::SlidingKVCache sliding(4);
         attention::SharedKV out;
         mha(x, MultiHeadAttentionForwardOptions().sliding_kv_cache(&sliding).share_kv(&out));
       },
       Kind::Value,
       "share_kv hands on the keys of a kv_cache or of this call, not of a sliding_kv_cache"},
      {"shared_kv: another module's heads",
       [=]() mutable {
         attention::SharedKV other{torch::randn({2, 1, 5, 4}), torch::randn({2, 1, 5, 4})};
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&other));
       },
       Kind::Value,
       "expected shared keys and values (2, 2, T, 4), got (2, 1, 5, 4) and (2, 1, 5, 4)"},
      {"shared_kv: keys of rank 1",
       [=]() mutable {
         attention::SharedKV flat{torch::randn({5}), torch::randn({5})};
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&flat));
       },
       Kind::Value,
       "attention::MultiHeadAttention: expected shared keys and values (2, 2, T, 4), got (5,) and "
       "(5,)"},
      {"shared_kv: keys of rank 0",
       [=]() mutable {
         attention::SharedKV scalar{torch::randn({}), torch::randn({})};
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&scalar));
       },
       Kind::Value, "expected shared keys and values (2, 2, T, 4), got () and ()"},
      {"shared_kv: fewer keys than tokens",
       [=]() mutable {
         attention::SharedKV few{torch::randn({2, 2, 3, 4}), torch::randn({2, 2, 3, 4})};
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&few));
       },
       Kind::Value, "expected shared keys of at least x's 5 tokens (they end with them), got 3"},
      {"shared_kv: dtype",
       [=]() mutable {
         attention::SharedKV wide{torch::randn({2, 2, 5, 4}, torch::kDouble),
                                  torch::randn({2, 2, 5, 4}, torch::kDouble)};
         mha(x, MultiHeadAttentionForwardOptions().shared_kv(&wide));
       },
       Kind::Type,
       "expected shared keys and values of dtype Float (the parameters' dtype), got Double and "
       "Double"},
      // MultiHeadLatentAttention and LatentCache
      {"MLA: feature size", fwd(mla, torch::rand({2, 6, 3})), Kind::Value,
       "attention::MultiHeadLatentAttention: expected x (T, 8) or (B, T, 8), got (2, 6, 3)"},
      {"MLA: dtype", fwd(mla, torch::rand({6, 8}, torch::kDouble)), Kind::Type,
       "expected x of dtype Float (the parameters' dtype), got Double"},
      {"MLA: device", fwd(mla, meta({6, 8})), Kind::Other, "got meta"},
      {"MLA: num_heads does not divide d_out", [] { attention::MultiHeadLatentAttention(8, 9, 2); },
       Kind::Value,
       "attention::MultiHeadLatentAttention: expected num_heads to divide d_out, got d_out 9 and "
       "num_heads 2"},
      {"MLA: latent_dim 0",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).latent_dim(0));
       },
       Kind::Value, "attention::MultiHeadLatentAttention: expected latent_dim > 0, got 0"},
      {"MLA: latent_dim INT64_MAX",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).latent_dim(
                 std::numeric_limits<int64_t>::max()));
       },
       Kind::Other, "overflowed"},
      {"MLA: num_heads 0", [] { attention::MultiHeadLatentAttention(8, 8, 0); }, Kind::Value,
       "expected num_heads > 0, got 0"},
      {"MLA: dropout 1",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).dropout(1.0));
       },
       Kind::Value, "expected dropout in [0, 1), got 1"},
      {"MLA: rope_dim odd",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(3));
       },
       Kind::Value,
       "attention::MultiHeadLatentAttention: expected rope_dim even and >= 0 (0: no rotary part), "
       "got 3"},
      {"MLA: rope_dim -2",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(-2));
       },
       Kind::Value, "expected rope_dim even and >= 0 (0: no rotary part), got -2"},
      {"MLA: rope_dim INT64_MAX - 1",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(
                 std::numeric_limits<int64_t>::max() - 1));
       },
       Kind::Value,
       "expected num_heads x rope_dim within int64, got num_heads 2 and rope_dim "
       "9223372036854775806"},
      {"MLA: rope_theta 1",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(2).rope_theta(1.0));
       },
       Kind::Value, "expected a finite rope_theta > 1, got 1"},
      {"MLA: rope_theta NaN",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(2).rope_theta(
                 std::nan("")));
       },
       Kind::Value, "expected a finite rope_theta > 1, got nan"},
      {"MLA: q_latent_dim -1",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).q_latent_dim(-1));
       },
       Kind::Value,
       "attention::MultiHeadLatentAttention: expected q_latent_dim >= 0 (0: no query latent), got "
       "-1"},
      {"MLA: q_latent_dim INT64_MAX",
       [] {
         attention::MultiHeadLatentAttention(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).q_latent_dim(
                 std::numeric_limits<int64_t>::max()));
       },
       Kind::Other, "overflowed"},
      {"MLA with a rotary part: a cache of the book's latent",
       [] {
         attention::MultiHeadLatentAttention book(8, 8, 2);
         attention::MultiHeadLatentAttention rope(
             attention::MultiHeadLatentAttentionOptions(8, 8, 2).rope_dim(2));
         attention::LatentCache cache(8);
         book(torch::rand({1, 2, 8}), &cache);
         rope(torch::rand({1, 2, 8}), &cache);
       },
       Kind::Value,
       "attention::LatentCache: expected a latent (1, T, 16) like the cached one, got (1, 2, 18)"},
      {"LatentCache: max_length 0", [] { attention::LatentCache(0); }, Kind::Value,
       "attention::LatentCache: expected max_length > 0, got 0"},
      {"LatentCache: rank 4",
       [] {
         attention::LatentCache(4).append(torch::rand({1, 1, 2, 4}));
       },
       Kind::Value,
       "attention::LatentCache: expected a latent (B, T, latent_dim), got (1, 1, 2, 4)"},
      {"LatentCache: undefined", [] { attention::LatentCache(4).append(torch::Tensor()); },
       Kind::Value, "got undefined"},
      {"LatentCache: integer latent",
       [] {
         attention::LatentCache(4).append(torch::ones({1, 1, 4}, torch::kLong));
       },
       Kind::Type, "attention::LatentCache: expected a floating latent, got Long"},
      {"LatentCache: another dtype",
       [] {
         attention::LatentCache cache(4);
         cache.append(torch::rand({1, 1, 4}));
         cache.append(torch::rand({1, 1, 4}, torch::kDouble));
       },
       Kind::Type, "expected a latent of dtype Float like the cached one, got Double"},
      {"LatentCache: another device",
       [=] {
         attention::LatentCache cache(4);
         cache.append(torch::rand({1, 1, 4}));
         cache.append(meta({1, 1, 4}));
       },
       Kind::Other, "expected a latent on device cpu like the cached one, got meta"},
      {"LatentCache: INT64_MAX tokens of storage",
       [] {
         attention::LatentCache(std::numeric_limits<int64_t>::max())
             .append(torch::rand({2, 1, 16}));
       },
       Kind::Value,
       "attention::LatentCache: storage for max_length = 9223372036854775807 tokens of (2, T, 16) "
       "would exceed 2^63 - 1 bytes"},
      {"LatentCache: truncate to -1", [] { attention::LatentCache(4).truncate(-1); }, Kind::Value,
       "attention::LatentCache: cannot truncate to -1 tokens: 0 are cached"},
      // gated_delta_rule, GatedDeltaNet, GatedDeltaNetState and RMSNorm
      {"gated_delta_rule: rank 3 query",
       [=] {
         F::gated_delta_rule(rand({2, 5, 4}), rand({2, 5, 4}), rand({2, 5, 4}), rand({2, 5}),
                             rand({2, 5}));
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected query of shape (B, H, T, d_k), got (2, "
       "5, 4)"},
      {"gated_delta_rule: key of another shape",
       [=] {
         F::gated_delta_rule(dq, rand({2, 2, 5, 3}), dv, dlog, dbeta);
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected key of query's shape (2, 2, 5, 4), got "
       "(2, 2, 5, 3)"},
      {"gated_delta_rule: value of other tokens",
       [=] {
         F::gated_delta_rule(dq, dq, rand({2, 2, 6, 3}), dlog, dbeta);
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected value of shape (2, 2, 5, d_v), got (2, "
       "2, 6, 3)"},
      {"gated_delta_rule: log_decay per feature",
       [=] {
         F::gated_delta_rule(dq, dq, dv, rand({2, 2, 5, 4}), dbeta);
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected log_decay of shape (2, 2, 5), got (2, 2, "
       "5, 4)"},
      {"gated_delta_rule: beta of the keys' width",
       [=] {
         F::gated_delta_rule(dq, dq, dv, dlog, rand({2, 2, 5, 4}));
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected beta of shape (2, 2, 5, 3) or (2, 2, 5), "
       "got (2, 2, 5, 4)"},
      {"gated_delta_rule: initial_state of another shape",
       [=] {
         F::gated_delta_rule(dq, dq, dv, dlog, dbeta,
                             F::GatedDeltaRuleOptions().initial_state(rand({2, 2, 3, 4})));
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: expected initial_state of shape (2, 2, 4, 3), got "
       "(2, 2, 3, 4)"},
      {"gated_delta_rule: initial_state of another dtype",
       [=] {
         F::gated_delta_rule(
             dq, dq, dv, dlog, dbeta,
             F::GatedDeltaRuleOptions().initial_state(torch::zeros({2, 2, 4, 3}, torch::kDouble)));
       },
       Kind::Type,
       "attention::functional::gated_delta_rule: expected query, key, value, log_decay, beta and "
       "initial_state of one dtype, got Float and Double"},
      {"gated_delta_rule: integer tensors",
       [=] {
         const auto i = [](std::vector<int64_t> shape) { return torch::ones(shape, torch::kLong); };
         F::gated_delta_rule(i({1, 1, 2, 2}), i({1, 1, 2, 2}), i({1, 1, 2, 2}), i({1, 1, 2}),
                             i({1, 1, 2}));
       },
       Kind::Type,
       "attention::functional::gated_delta_rule: expected a floating-point dtype, got Long"},
      {"gated_delta_rule: half on the CPU",
       [=] {
         const auto h = [](torch::Tensor x) { return x.to(torch::kHalf); };
         F::gated_delta_rule(h(dq), h(dq), h(dv), h(dlog), h(dbeta));
       },
       Kind::Type,
       "attention::functional::gated_delta_rule: expected Float, Double or BFloat16 on the CPU, "
       "got Half"},
      {"gated_delta_rule: another device",
       [=] {
         F::gated_delta_rule(dq, dq, dv, dlog, meta({2, 2, 5}));
       },
       Kind::Other,
       "attention::functional::gated_delta_rule: expected every tensor on one device, got cpu and "
       "meta"},
      {"gated_delta_rule: Native",
       [=] {
         F::gated_delta_rule(dq, dq, dv, dlog, dbeta,
                             F::GatedDeltaRuleOptions().backend(F::Backend::Native));
       },
       Kind::Value,
       "attention::functional::gated_delta_rule: Backend::Native has no gated delta rule; use "
       "Auto, Chunked or Math"},
      {"gated_delta_rule: undefined beta",
       [=] { F::gated_delta_rule(dq, dq, dv, dlog, torch::Tensor()); }, Kind::Value,
       "attention::functional::gated_delta_rule: expected defined query, key, value, log_decay and "
       "beta tensors"},
      {"GatedDeltaNet: feature size", fwd(delta_net, torch::rand({2, 6, 3})), Kind::Value,
       "attention::GatedDeltaNet: expected x (T, 8) or (B, T, 8), got (2, 6, 3)"},
      {"GatedDeltaNet: dtype", fwd(delta_net, torch::rand({6, 8}, torch::kDouble)), Kind::Type,
       "attention::GatedDeltaNet: expected x of dtype Float (the parameters' dtype), got Double"},
      {"GatedDeltaNet: device", fwd(delta_net, meta({6, 8})), Kind::Other, "got meta"},
      {"GatedDeltaNet: num_heads does not divide d_out", [] { attention::GatedDeltaNet(8, 9, 2); },
       Kind::Value,
       "attention::GatedDeltaNet: expected num_heads to divide d_out, got d_out 9 and num_heads 2"},
      {"GatedDeltaNet: num_heads 0", [] { attention::GatedDeltaNet(8, 8, 0); }, Kind::Value,
       "attention::GatedDeltaNet: expected num_heads > 0, got 0"},
      {"GatedDeltaNet: num_heads INT64_MAX",
       [] { attention::GatedDeltaNet(8, 8, std::numeric_limits<int64_t>::max()); }, Kind::Value,
       "attention::GatedDeltaNet: expected num_heads to divide d_out, got d_out 8 and num_heads "
       "9223372036854775807"},
      {"GatedDeltaNet: dropout 1",
       [] { attention::GatedDeltaNet(attention::GatedDeltaNetOptions(8, 8, 2).dropout(1.0)); },
       Kind::Value, "attention::GatedDeltaNet: expected dropout in [0, 1), got 1"},
      {"GatedDeltaNet: a state of another batch size",
       [=]() mutable {
         attention::GatedDeltaNetState state;
         delta_net(torch::rand({2, 3, 8}), &state);
         delta_net(torch::rand({1, 1, 8}), &state);
       },
       Kind::Value, "attention::GatedDeltaNet: expected x of the state's batch size 2, got 1"},
      {"RMSNorm: normalized_shape 0", [] { attention::RMSNorm(0); }, Kind::Value,
       "attention::RMSNorm: expected normalized_shape > 0, got 0"},
      {"RMSNorm: last dimension",
       [] {
         attention::RMSNorm(4)(torch::rand({2, 3}));
       },
       Kind::Value, "attention::RMSNorm: expected input whose last dimension is 4, got (2, 3)"},
      {"RMSNorm: dtype",
       [] {
         attention::RMSNorm(4)(torch::rand({2, 4}, torch::kDouble));
       },
       Kind::Type, "attention::RMSNorm: expected input of the weight's dtype Float, got Double"},
      {"RMSNorm: infinite eps",
       [] { attention::RMSNorm(attention::RMSNormOptions(4).eps(INFINITY)); }, Kind::Value,
       "attention::RMSNorm: expected a finite eps >= 0, got inf"},
      {"RMSNorm: negative eps", [] { attention::RMSNorm(attention::RMSNormOptions(4).eps(-1e-6)); },
       Kind::Value, "attention::RMSNorm: expected a finite eps >= 0, got -1e-06"},
      {"RMSNorm: device",
       [=] {
         attention::RMSNorm(4)(meta({2, 4}));
       },
       Kind::Other, "attention::RMSNorm: expected input on the weight's device cpu, got meta"},
      {"GatedDeltaNet: Native",
       [] {
         attention::GatedDeltaNet(
             attention::GatedDeltaNetOptions(8, 8, 2).backend(F::Backend::Native));
       },
       Kind::Value,
       "attention::GatedDeltaNet: Backend::Native has no gated delta rule; use Auto, Chunked or "
       "Math"},
      {"DeepSeekSparseAttention: Native",
       [] {
         attention::DeepSeekSparseAttention(
             attention::DeepSeekSparseAttentionOptions(8, 8, 2).backend(F::Backend::Native));
       },
       Kind::Value,
       "attention::DeepSeekSparseAttention: Backend::Native has no sparse attention; use Auto, "
       "Chunked or Math"},
      // sparse_attention, LightningIndexer, DeepSeekSparseAttention and SparseAttentionCache
      {"sparse_attention: an index past the keys",
       [=] {
         F::sparse_attention(q, k, v, torch::full({2, 5, 3}, 6, torch::kLong));
       },
       Kind::Value,
       "attention::functional::sparse_attention: expected indices in [-1, 6) (-1 for none; S = 6 "
       "keys), got values from 6 to 6"},
      {"sparse_attention: an index below -1",
       [=] {
         F::sparse_attention(q, k, v, torch::full({2, 5, 3}, -2, torch::kLong));
       },
       Kind::Value, "got values from -2 to -2"},
      {"sparse_attention: INT64_MAX index",
       [=] {
         F::sparse_attention(
             q, k, v, torch::full({2, 5, 1}, std::numeric_limits<int64_t>::max(), torch::kLong));
       },
       Kind::Value, "got values from 9223372036854775807 to 9223372036854775807"},
      {"sparse_attention: indices of other tokens",
       [=] {
         F::sparse_attention(q, k, v, torch::zeros({2, 4, 3}, torch::kLong));
       },
       Kind::Value,
       "attention::functional::sparse_attention: expected indices of shape (2, 5, K), got (2, 4, "
       "3)"},
      {"sparse_attention: float indices",
       [=] {
         F::sparse_attention(q, k, v, torch::zeros({2, 5, 3}));
       },
       Kind::Type,
       "attention::functional::sparse_attention: expected Long or Int indices, got Float"},
      {"sparse_attention: heads that do not group",
       [=] {
         F::sparse_attention(q, torch::rand({2, 3, 6, 4}), torch::rand({2, 3, 6, 3}),
                             torch::zeros({2, 5, 1}, torch::kLong));
       },
       Kind::Value,
       "with H_kv dividing H, got query (2, 2, 5, 4), key (2, 3, 6, 4), value (2, 3, 6, 3)"},
      {"sparse_attention: Native",
       [=] {
         F::sparse_attention(q, k, v, torch::zeros({2, 5, 1}, torch::kLong),
                             F::SparseAttentionOptions().backend(F::Backend::Native));
       },
       Kind::Value,
       "attention::functional::sparse_attention: Backend::Native has no sparse attention; use "
       "Auto, Chunked or Math"},
      {"sparse_attention: Chunked with dropout",
       [=] {
         F::sparse_attention(
             q, k, v, torch::zeros({2, 5, 1}, torch::kLong),
             F::SparseAttentionOptions().backend(F::Backend::Chunked).dropout_p(0.5));
       },
       Kind::Value,
       "attention::functional::sparse_attention: Backend::Chunked runs on the CPU without dropout; "
       "use Auto or Math"},
      {"sparse_attention: scale NaN",
       [=] {
         F::sparse_attention(q, k, v, torch::zeros({2, 5, 1}, torch::kLong),
                             F::SparseAttentionOptions().scale(NAN));
       },
       Kind::Value, "attention::functional::sparse_attention: expected a finite scale, got nan"},
      {"sparse_attention: indices on another device",
       [=] {
         F::sparse_attention(
             q, k, v,
             torch::zeros({2, 5, 1},
                          torch::TensorOptions().dtype(torch::kLong).device(torch::kMeta)));
       },
       Kind::Other, "expected query, key, value and indices on one device, got cpu and meta"},
      {"LightningIndexer: topk 0",
       [] {
         attention::LightningIndexer indexer(
             attention::LightningIndexerOptions(8).index_head_dim(4));
         const auto x = torch::rand({1, 3, 8});
         indexer(x, indexer->keys(x), 0);
       },
       Kind::Value, "attention::LightningIndexer: expected topk >= 1, got 0"},
      {"LightningIndexer: fewer keys than queries",
       [] {
         attention::LightningIndexer indexer(
             attention::LightningIndexerOptions(8).index_head_dim(4));
         indexer(torch::rand({1, 3, 8}), torch::rand({1, 2, 4}), 2);
       },
       Kind::Value,
       "attention::LightningIndexer: expected index_keys (1, S >= 3, 4) for x (1, 3, 8), got (1, "
       "2, 4)"},
      {"LightningIndexer: index_n_heads 0",
       [] { attention::LightningIndexer(attention::LightningIndexerOptions(8).index_n_heads(0)); },
       Kind::Value, "attention::LightningIndexer: expected index_n_heads > 0, got 0"},
      {"DeepSeekSparseAttention: topk 0",
       [] {
         attention::DeepSeekSparseAttention(
             attention::DeepSeekSparseAttentionOptions(8, 8, 2).topk(0));
       },
       Kind::Value, "attention::DeepSeekSparseAttention: expected topk > 0, got 0"},
      {"DeepSeekSparseAttention: index_head_dim INT64_MAX",
       [] {
         attention::DeepSeekSparseAttention(
             attention::DeepSeekSparseAttentionOptions(8, 8, 2).index_head_dim(
                 std::numeric_limits<int64_t>::max()));
       },
       Kind::Value,
       "attention::LightningIndexer: index_n_heads x index_head_dim = 4 x 9223372036854775807 "
       "overflows int64"},
      {"DeepSeekSparseAttention: feature size", fwd(sparse, torch::rand({2, 6, 3})), Kind::Value,
       "attention::DeepSeekSparseAttention: expected x (T, 8) or (B, T, 8), got (2, 6, 3)"},
      {"DeepSeekSparseAttention: dtype", fwd(sparse, torch::rand({6, 8}, torch::kDouble)),
       Kind::Type,
       "attention::DeepSeekSparseAttention: expected x of dtype Float (the parameters' dtype), got "
       "Double"},
      {"SparseAttentionCache: index keys of other tokens",
       [] {
         attention::SparseAttentionCache(4).append(
             torch::rand({1, 2, 2, 3}), torch::rand({1, 2, 2, 3}), torch::rand({1, 1, 5}));
       },
       Kind::Value,
       "attention::SparseAttentionCache: expected keys (B, H, T, head_dim) and index keys (B, T, "
       "index_head_dim) of one B and T, got (1, 2, 2, 3) and (1, 1, 5)"},
      {"SparseAttentionCache: max_length 0", [] { attention::SparseAttentionCache(0); },
       Kind::Value, "attention::KVCache: expected max_length > 0, got 0"},
      // conversions
      {"to_torch: grouped heads",
       [] {
         attention::to_torch(
             *attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).num_kv_heads(1)));
       },
       Kind::Value, "num_kv_heads == num_heads"},
      {"to_torch: an output gate",
       [] {
         attention::to_torch(
             *attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).gate(true)));
       },
       Kind::Value,
       "attention::to_torch: torch::nn::MultiheadAttention has no rotary embedding, soft-capping, "
       "ALiBi, sinks, output gate or relative position bias, and this module uses one of them"},
      {"to_fused: d_out_kq != d_out_v",
       [] { attention::to_fused(*attention::MultiHeadAttentionWrapper(3, 2, 4, 2)); }, Kind::Value,
       "attention::to_fused: expected a wrapper with"},
      {"from_torch: separate key and value sizes",
       [] {
         attention::from_torch(*torch::nn::MultiheadAttention(
             torch::nn::MultiheadAttentionOptions(8, 2).kdim(4).vdim(4)));
       },
       Kind::Value, "attention::from_torch: expected a torch::nn::MultiheadAttention without"},
      // weights and safetensors
      {"load_weights: missing file",
       [] {
         auto m = attention::SelfAttention(3, 2, 4);
         attention::load_weights(*m, "/nonexistent/weights.safetensors");
       },
       Kind::Other, "/nonexistent/weights.safetensors"},
      {"load_weights_from_memory: empty buffer",
       [] {
         auto m = attention::SelfAttention(3, 2, 4);
         attention::load_weights_from_memory(*m, "", 0);
       },
       Kind::Other, "<memory>"},
      {"safetensors: truncated header", [] { attention::parse_safetensors("\x08\0\0\0", 4); },
       Kind::Other, "safetensors"},
      {"safetensors: an undefined tensor to write",
       [] {
         attention::serialize_safetensors({{"w", torch::Tensor()}});
       },
       Kind::Value, "tensor 'w' is undefined"},
      // presentation
      {"heatmap: undefined weights", [] { attention::heatmap_svg(torch::Tensor(), {"a"}, {"a"}); },
       Kind::Value, "got undefined"},
      {"heatmap: rank 3",
       [] {
         attention::heatmap_svg(torch::rand({1, 1, 1}), {"a"}, {"a"});
       },
       Kind::Value, "expected weights (1, 1) matching the labels, got (1, 1, 1)"},
      {"heatmap: complex weights",
       [] {
         attention::heatmap_svg(torch::ones({1, 1}, torch::kComplexFloat), {"a"}, {"a"});
       },
       Kind::Type, "attention::heatmap_svg: expected real weights, got ComplexFloat"},
      {"heatmap: weights without data",
       [=] {
         attention::heatmap_svg(meta({1, 1}), {"a"}, {"a"});
       },
       Kind::Other, "expected weights with data, got a tensor on the meta device"},
      {"format: negative precision", [] { attention::format_tensor(torch::ones({2}), -1); },
       Kind::Value, "attention::format_tensor: expected a precision in [0, 17], got -1"},
      {"format: complex tensor",
       [] { attention::format_tensor(torch::ones({2}, torch::kComplexFloat)); }, Kind::Type,
       "attention::format_tensor: expected a real tensor, got ComplexFloat"},
      {"format: tensor without data", [=] { attention::format_tensor(meta({2})); }, Kind::Other,
       "expected a tensor with data, got one on the meta device"},
      {"format: shape of an undefined tensor", [] { attention::format_shape(torch::Tensor()); },
       Kind::Value, "attention::format_shape: expected a defined tensor"},
      {"load_weights_from_memory: null data",
       [] {
         auto m = attention::SelfAttention(3, 2, 4);
         attention::load_weights_from_memory(*m, nullptr, 10);
       },
       Kind::Value, "expected data for 10 bytes, got a null pointer (<memory>)"},
      {"heatmap: labels",
       [] {
         attention::heatmap_svg(torch::rand({2, 2}), {"a"}, {"a", "b"});
       },
       Kind::Value, "matching the labels"},
      {"workspace: slot out of range", [] { attention::Workspace().take(16, {2}, torch::kFloat); },
       Kind::Value, "attention::Workspace::take: expected a slot in [0, 16), got 16"},
      {"workspace: negative size",
       [] {
         attention::Workspace().take(0, {2, -1}, torch::kFloat);
       },
       Kind::Value, "attention::Workspace::take: expected sizes >= 0, got (2, -1)"},
      {"large buffer cache: negative limit", [] { attention::set_large_buffer_cache_limit(-1); },
       Kind::Value, "attention::set_large_buffer_cache_limit: expected a limit >= 0 bytes, got -1"},
  };
}

// functional::varlen_attention: packed tensors, the sequences' offsets (their dtype, device,
// shape, order, ends and extremes) and the options it refuses.
std::vector<BadInput> varlen_cases() {
  constexpr const char* kName = "attention::functional::varlen_attention: ";
  const auto q = torch::randn({10, 4, 8}), k = torch::randn({12, 2, 8}),
             v = torch::randn({12, 2, 3});
  const auto offsets = [](std::vector<int64_t> values, torch::Dtype dtype = torch::kLong) {
    return torch::tensor(values, torch::kLong).to(dtype);
  };
  const auto cu_q = offsets({0, 4, 10}), cu_k = offsets({0, 5, 12});
  using O = F::ScaledDotProductAttentionOptions;
  const auto varlen = [=](torch::Tensor q_, torch::Tensor k_, torch::Tensor v_, torch::Tensor cq,
                          torch::Tensor ck,
                          O o = {}) { return [=] { F::varlen_attention(q_, k_, v_, cq, ck, o); }; };
  const auto with_q_offsets = [=](torch::Tensor cq) { return varlen(q, k, v, cq, cu_k); };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::string ends_q = std::string(kName) +
                             "expected cu_seqlens_q to end at total_q (the queries' first "
                             "dimension) = 10, got ";
  return {
      {"varlen: undefined query", varlen(torch::Tensor(), k, v, cu_q, cu_k), Kind::Value,
       std::string(kName) + "expected defined query, key and value tensors"},
      {"varlen: batched (B, T, H, d) query", varlen(q.unsqueeze(0), k, v, cu_q, cu_k), Kind::Value,
       std::string(kName) +
           "expected packed query (total_q, H, d), key (total_k, Hkv, d) and value (total_k, Hkv, "
           "dv) with H a multiple of Hkv >= 1, got query (1, 10, 4, 8), key (12, 2, 8), value "
           "(12, 2, 3)"},
      {"varlen: feature sizes differ", varlen(q, torch::randn({12, 2, 7}), v, cu_q, cu_k),
       Kind::Value, "got query (10, 4, 8), key (12, 2, 7), value (12, 2, 3)"},
      {"varlen: keys and values of other token counts",
       varlen(q, k, torch::randn({11, 2, 3}), cu_q, cu_k), Kind::Value, "value (11, 2, 3)"},
      {"varlen: H not a multiple of Hkv", varlen(q, torch::randn({12, 3, 8}), v, cu_q, cu_k),
       Kind::Value, "with H a multiple of Hkv >= 1"},
      {"varlen: no key/value heads",
       varlen(q, torch::randn({12, 0, 8}), torch::randn({12, 0, 3}), cu_q, cu_k), Kind::Value,
       "with H a multiple of Hkv >= 1"},
      {"varlen: dtypes differ", varlen(q, k.to(torch::kDouble), v, cu_q, cu_k), Kind::Type,
       std::string(kName) + "expected query, key and value of one dtype, got Float, Double, Float"},
      {"varlen: half on the CPU",
       varlen(q.to(torch::kHalf), k.to(torch::kHalf), v.to(torch::kHalf), cu_q, cu_k), Kind::Type,
       "expected Float, Double or BFloat16 on the CPU, got Half"},
      {"varlen: devices differ", varlen(q, torch::empty({12, 2, 8}, torch::kMeta), v, cu_q, cu_k),
       Kind::Other, "expected query, key and value on one device, got cpu, meta, cpu"},
      {"varlen: undefined offsets", with_q_offsets(torch::Tensor()), Kind::Value,
       std::string(kName) + "expected a defined cu_seqlens_q tensor"},
      {"varlen: float offsets", with_q_offsets(offsets({0, 4, 10}, torch::kFloat)), Kind::Type,
       std::string(kName) + "expected cu_seqlens_q of dtype Int or Long, got Float"},
      {"varlen: int16 offsets", varlen(q, k, v, cu_q, offsets({0, 5, 12}, torch::kShort)),
       Kind::Type, "expected cu_seqlens_k of dtype Int or Long, got Short"},
      {"varlen: offsets on another device",
       with_q_offsets(
           torch::empty({3}, torch::TensorOptions().dtype(torch::kLong).device(torch::kMeta))),
       Kind::Other,
       std::string(kName) +
           "expected cu_seqlens_q on the CPU or on the queries' device (cpu), got meta"},
      {"varlen: offsets of rank 2", with_q_offsets(cu_q.view({1, 3})), Kind::Value,
       std::string(kName) +
           "expected cu_seqlens_q of shape (S + 1,) for S >= 0 sequences, got (1, 3)"},
      {"varlen: no offsets at all", with_q_offsets(offsets({})), Kind::Value,
       "expected cu_seqlens_q of shape (S + 1,) for S >= 0 sequences, got (0,)"},
      {"varlen: offsets that do not start at 0", with_q_offsets(offsets({1, 4, 10})), Kind::Value,
       std::string(kName) + "expected cu_seqlens_q to start at 0, got 1"},
      {"varlen: offsets that start at -1", with_q_offsets(offsets({-1, 4, 10})), Kind::Value,
       "expected cu_seqlens_q to start at 0, got -1"},
      {"varlen: decreasing offsets", with_q_offsets(offsets({0, 7, 4, 10})), Kind::Value,
       std::string(kName) + "expected nondecreasing cu_seqlens_q, got 4 after 7 (entry 2)"},
      {"varlen: offsets past the keys", varlen(q, k, v, cu_q, offsets({0, 5, 13})), Kind::Value,
       std::string(kName) +
           "expected cu_seqlens_k to end at total_k (the keys' first dimension) = 12, got 13"},
      {"varlen: offsets short of the queries", with_q_offsets(offsets({0, 4, 9})), Kind::Value,
       ends_q + "9"},
      {"varlen: one offset, tokens left over", varlen(q, k, v, offsets({0}), offsets({0})),
       Kind::Value, ends_q + "0"},
      {"varlen: offsets of 1", with_q_offsets(offsets({0, 1})), Kind::Value, ends_q + "1"},
      {"varlen: offsets of 2^31", with_q_offsets(offsets({0, int64_t{1} << 31})), Kind::Value,
       ends_q + "2147483648"},
      {"varlen: offsets of 2^53", with_q_offsets(offsets({0, 4, int64_t{1} << 53})), Kind::Value,
       ends_q + "9007199254740992"},
      {"varlen: offsets of INT64_MAX", with_q_offsets(offsets({0, 4, kMax})), Kind::Value,
       ends_q + "9223372036854775807"},
      {"varlen: INT64_MAX, then 10", with_q_offsets(offsets({0, kMax, 10})), Kind::Value,
       "expected nondecreasing cu_seqlens_q, got 10 after 9223372036854775807 (entry 2)"},
      {"varlen: INT64_MIN", with_q_offsets(offsets({0, std::numeric_limits<int64_t>::min(), 10})),
       Kind::Value, "got -9223372036854775808 after 0 (entry 1)"},
      {"varlen: int32 INT32_MAX",
       with_q_offsets(offsets({0, std::numeric_limits<int32_t>::max()}, torch::kInt)), Kind::Value,
       ends_q + "2147483647"},
      {"varlen: int32 INT32_MIN",
       with_q_offsets(offsets({0, 4, std::numeric_limits<int32_t>::min()}, torch::kInt)),
       Kind::Value, "got -2147483648 after 4 (entry 2)"},
      {"varlen: counts of sequences differ", varlen(q, k, v, cu_q, offsets({0, 5, 5, 12})),
       Kind::Value,
       std::string(kName) +
           "expected cu_seqlens_q and cu_seqlens_k of one length (S + 1 for S sequences), got 3 "
           "and 4 entries"},
      {"varlen: attn_mask", varlen(q, k, v, cu_q, cu_k, O().attn_mask(torch::ones({10, 12}))),
       Kind::Value,
       std::string(kName) +
           "takes no attn_mask (each query sees the keys of its own sequence, through is_causal "
           "and the window); use scaled_dot_product_attention per sequence for a mask"},
      {"varlen: need_weights", varlen(q, k, v, cu_q, cu_k, O().need_weights(true)), Kind::Value,
       std::string(kName) + "returns no attention weights (need_weights)"},
      {"varlen: sinks of another count", varlen(q, k, v, cu_q, cu_k, O().sinks(torch::zeros({3}))),
       Kind::Value,
       std::string(kName) + "expected sinks of shape (4,), one per query head, got (3,)"},
      {"varlen: ALiBi slopes of another count",
       varlen(q, k, v, cu_q, cu_k, O().alibi_slopes(F::alibi_slopes(2))), Kind::Value,
       "expected alibi_slopes of shape (4,), one per query head, got (2,)"},
      {"varlen: block_size 0", varlen(q, k, v, cu_q, cu_k, O().block_size(0)), Kind::Value,
       "expected block_size > 0, got 0"},
      {"varlen: negative window", varlen(q, k, v, cu_q, cu_k, O().window_left(-1)), Kind::Value,
       "expected window_left >= 0 (unset for no bound), got -1"},
      {"varlen: dropout on Chunked",
       varlen(q, k, v, cu_q, cu_k, O().dropout_p(0.5).backend(F::Backend::Chunked)), Kind::Other,
       std::string(kName) + "the Chunked backend computes neither attention weights nor dropout"},
      {"varlen: ALiBi on Native",
       varlen(q, k, v, cu_q, cu_k,
              O().alibi_slopes(F::alibi_slopes(4).to(torch::kFloat)).backend(F::Backend::Native)),
       Kind::Other,
       std::string(kName) + "the Native backend computes neither soft-capping, ALiBi nor attention "
                            "sinks"},
  };
}

void check_table(const std::vector<BadInput>& table) {
  for (const auto& c : table) {
    INFO(c.what);
    switch (c.kind) {
      case Kind::Value:
        CHECK_THROWS_C10(c.call(), c10::ValueError, c.fragment);
        break;
      case Kind::Type:
        CHECK_THROWS_C10(c.call(), c10::TypeError, c.fragment);
        break;
      case Kind::Other:
        CHECK_THROWS_C10(c.call(), c10::Error, c.fragment);
        break;
    }
  }
}

}  // namespace

TEST_CASE("bad input: each case raises the right error type with a message that says what to fix",
          "[errors]") {
  const auto table = cases();
  CHECK(table.size() >= 80);
  check_table(table);
}

TEST_CASE("bad input: varlen_attention names what is wrong with packed tensors and offsets",
          "[errors][varlen]") {
  check_table(varlen_cases());
}

TEST_CASE("bad input: an empty sequence (T = 0) gives an empty output from every module",
          "[errors]") {
  torch::manual_seed(3);
  auto empty = torch::randn({2, 0, 3});
  CHECK(attention::SelfAttention(3, 2, 4)(empty).sizes() == torch::IntArrayRef({2, 0, 4}));
  CHECK(attention::CausalSelfAttention(3, 2, 4)(empty).sizes() == torch::IntArrayRef({2, 0, 4}));
  CHECK(attention::MultiHeadAttentionWrapper(3, 2, 4, 2)(empty).sizes() ==
        torch::IntArrayRef({2, 0, 8}));
  CHECK(attention::CrossAttention(3, 2, 4)(empty, torch::randn({2, 5, 3})).sizes() ==
        torch::IntArrayRef({2, 0, 4}));
  // No keys at all: every query sees nothing and gets zeros.
  auto no_keys = attention::CrossAttention(3, 2, 4)(torch::randn({2, 4, 3}), empty);
  CHECK(no_keys.sizes() == torch::IntArrayRef({2, 4, 4}));
  CHECK(torch::isfinite(no_keys).all().item<bool>());
  attention::MultiHeadAttention mha(MultiHeadAttentionOptions(3, 4, 2));
  CHECK(mha(empty).output.sizes() == torch::IntArrayRef({2, 0, 4}));
  // A state that has seen no tokens is the zero state.
  attention::GatedDeltaNet delta_net(3, 4, 2);
  attention::GatedDeltaNetState state;
  CHECK(delta_net(empty, &state).sizes() == torch::IntArrayRef({2, 0, 4}));
  CHECK(state.length() == 0);
  CHECK(state.state().abs().max().item<float>() == 0.0f);
  attention::SparseAttentionCache sparse_cache(4);
  CHECK(attention::DeepSeekSparseAttention(3, 4, 2)(empty, &sparse_cache).sizes() ==
        torch::IntArrayRef({2, 0, 4}));
  CHECK(sparse_cache.length() == 0);
  // Each head's width is named where a view of an empty batch cannot infer it, rotary part too.
  attention::MultiHeadLatentAttention mla(3, 4, 2);
  CHECK(mla(empty).sizes() == torch::IntArrayRef({2, 0, 4}));
  CHECK(mla(torch::randn({0, 3, 3})).sizes() == torch::IntArrayRef({0, 3, 4}));
  CHECK(mla(torch::randn({0, 3})).sizes() == torch::IntArrayRef({0, 4}));
  attention::MultiHeadLatentAttention mla_rope(
      attention::MultiHeadLatentAttentionOptions(3, 4, 2).rope_dim(2));
  attention::LatentCache latent_cache(4);
  CHECK(mla_rope(empty, &latent_cache).sizes() == torch::IntArrayRef({2, 0, 4}));
  CHECK(latent_cache.length() == 0);
}

TEST_CASE("bad input: a forward refused after its cache's append leaves the cache as it was",
          "[errors]") {
  namespace F = attention::functional;
  torch::manual_seed(5);
  const auto x = torch::randn({1, 4, 8});
  SECTION("DeepSeekSparseAttention: dropout on the Chunked backend") {
    attention::DeepSeekSparseAttention dsa(attention::DeepSeekSparseAttentionOptions(8, 8, 2)
                                               .index_head_dim(4)
                                               .topk(3)
                                               .dropout(0.5)
                                               .backend(F::Backend::Chunked));
    attention::SparseAttentionCache cache(16);
    CHECK_THROWS_C10(dsa(x, &cache), c10::Error,
                     "attention::functional::sparse_attention: Backend::Chunked runs on the CPU "
                     "without dropout");
    CHECK(cache.length() == 0);
    CHECK(cache.bytes_per_token() == 0);
    // Not even the first append's shape stays: a cache of other sizes still fits.
    attention::SparseAttentionCache::Cached other = cache.append(
        torch::randn({3, 1, 2, 8}), torch::randn({3, 1, 2, 8}), torch::randn({3, 2, 5}));
    CHECK(other.keys.sizes() == torch::IntArrayRef({3, 1, 2, 8}));
  }
  SECTION("MultiHeadLatentAttention: dropout on the Chunked backend, and NaN on Native") {
    attention::MultiHeadLatentAttention chunked(
        attention::MultiHeadLatentAttentionOptions(8, 8, 2).dropout(0.5).backend(
            F::Backend::Chunked));
    attention::LatentCache cache(16);
    CHECK_THROWS_C10(chunked(x, &cache), c10::Error,
                     "the Chunked backend computes neither attention weights nor dropout");
    CHECK(cache.length() == 0);
    CHECK_FALSE(cache.latent().defined());
    attention::MultiHeadLatentAttention native(
        attention::MultiHeadLatentAttentionOptions(8, 8, 2).backend(F::Backend::Native));
    native->eval();
    native(x, &cache);
    const auto latent = cache.latent().clone();
    auto nan = x.clone();
    nan[0][1][2] = NAN;
    CHECK_THROWS_C10(native(nan, &cache), c10::Error,
                     "the Native backend cannot take non-finite queries or keys");
    CHECK(cache.length() == 4);
    CHECK(torch::equal(cache.latent(), latent));
  }
}

TEST_CASE("bad input: a refused first append of a SparseAttentionCache leaves it empty",
          "[errors]") {
  attention::SparseAttentionCache cache(4);
  // Index keys whose storage for max_length tokens would not fit in memory's addresses.
  const auto huge = torch::zeros({1, 1, 1}).expand({1, 1, int64_t{1} << 61});
  CHECK_THROWS_C10(cache.append(torch::randn({1, 2, 1, 4}), torch::randn({1, 2, 1, 4}), huge),
                   c10::ValueError,
                   "attention::SparseAttentionCache: storage for max_length = 4 tokens of index "
                   "keys (1, T, 2305843009213693952) would exceed 2^63 - 1 bytes");
  CHECK(cache.length() == 0);
  CHECK(cache.bytes_per_token() == 0);
  // The keys' shape was not fixed by the refused call.
  const auto other =
      cache.append(torch::randn({3, 1, 1, 8}), torch::randn({3, 1, 1, 8}), torch::randn({3, 1, 2}));
  CHECK(other.keys.sizes() == torch::IntArrayRef({3, 1, 1, 8}));
  CHECK(cache.length() == 1);
}

TEST_CASE("bad input: NaN and Inf propagate through every module without a crash", "[errors]") {
  auto x = torch::randn({2, 5, 3});
  x[0][2][1] = NAN;
  x[1][3][0] = INFINITY;
  std::vector<torch::Tensor> outputs = {
      attention::SelfAttention(3, 2, 4)(x),
      attention::CausalSelfAttention(3, 2, 4)(x),
      attention::MultiHeadAttentionWrapper(3, 2, 4, 2)(x),
      attention::CrossAttention(3, 2, 4)(x, x),
      attention::MultiHeadAttention(MultiHeadAttentionOptions(3, 4, 2).causal(false))(x).output,
      attention::GatedDeltaNet(3, 4, 2)(x),
      attention::DeepSeekSparseAttention(3, 4, 2)(x)};
  for (const auto& out : outputs) {
    CHECK_FALSE(torch::isfinite(out[0]).all().item<bool>());
    CHECK_FALSE(torch::isfinite(out[1]).all().item<bool>());
  }
}

namespace {

// A refusal of the paged cache, of attention over its pages or of the module's step: the exact
// message, and the cache exactly as it was.
struct PagedBadInput {
  std::string what;
  std::function<void(attention::PagedKVCache&)> call;
  Kind kind;
  std::string message;
};

std::vector<PagedBadInput> paged_cases() {
  using attention::PagedKVCache;
  using attention::PagedKVCacheOptions;
  using Cache = PagedKVCache&;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t k2to31 = int64_t{1} << 31;
  const auto make = [](PagedKVCacheOptions o) { return [o](Cache) { PagedKVCache cache(o); }; };
  const auto one = torch::tensor({0, 1}), lengths = torch::tensor({3}),
             table = torch::tensor({{0}});
  const auto q = torch::randn({1, 2, 4});
  const auto paged = [](torch::Tensor query, torch::Tensor cu, torch::Tensor lengths_,
                        torch::Tensor table_, F::ScaledDotProductAttentionOptions o = {}) {
    return [=](Cache c) {
      F::paged_attention(query, c.keys(0), c.values(0), cu, lengths_, table_, o);
    };
  };
  constexpr const char* kPaged = "attention::functional::paged_attention: ";
  return {
      // The pool's sizes at their extremes.
      {"pool: no pages", make(PagedKVCacheOptions(0, 4, 2, 4)), Kind::Value,
       "attention::PagedKVCache: expected num_pages > 0, got 0"},
      {"pool: negative page size", make(PagedKVCacheOptions(4, -1, 2, 4)), Kind::Value,
       "attention::PagedKVCache: expected page_size > 0, got -1"},
      {"pool: no heads", make(PagedKVCacheOptions(4, 4, 0, 4)), Kind::Value,
       "attention::PagedKVCache: expected num_kv_heads > 0, got 0"},
      {"pool: no features", make(PagedKVCacheOptions(4, 4, 2, 0)), Kind::Value,
       "attention::PagedKVCache: expected head_dim > 0, got 0"},
      {"pool: no layers", make(PagedKVCacheOptions(4, 4, 2, 4).num_layers(0)), Kind::Value,
       "attention::PagedKVCache: expected num_layers > 0, got 0"},
      {"pool: window 0", make(PagedKVCacheOptions(4, 4, 2, 4).sliding_window(0)), Kind::Value,
       "attention::PagedKVCache: expected sliding_window >= 1 (unset for none), got 0"},
      {"pool: 2^31 pages of 2^31 tokens", make(PagedKVCacheOptions(k2to31, k2to31, 2, 4)),
       Kind::Value,
       "attention::PagedKVCache: a pool of 2147483648 pages of 2147483648 tokens, 2 heads of 4 "
       "features, 1 layers in Float needs more than 2^63 bytes"},
      {"pool: INT64_MAX pages", make(PagedKVCacheOptions(kMax, 1, 1, 1)), Kind::Value,
       "attention::PagedKVCache: a pool of 9223372036854775807 pages of 1 tokens, 1 heads of 1 "
       "features, 1 layers in Float needs more than 2^63 bytes"},
      {"pool: INT64_MAX layers", make(PagedKVCacheOptions(1, 1, 1, 1).num_layers(kMax)),
       Kind::Value, "needs more than 2^63 bytes"},
      {"pool: half", make(PagedKVCacheOptions(4, 4, 2, 4).dtype(torch::kHalf)), Kind::Type,
       "attention::PagedKVCache: expected dtype Float, Double, BFloat16 or Char (8-bit), got Half"},
      {"pool: integers", make(PagedKVCacheOptions(4, 4, 2, 4).dtype(torch::kLong)), Kind::Type,
       "attention::PagedKVCache: expected dtype Float, Double, BFloat16 or Char (8-bit), got Long"},
      // Sequences: unknown, freed, repeated (the fixture holds 0, freed, and 1, 3 tokens).
      {"extend: unknown", [](Cache c) { c.extend({7}, {1}); }, Kind::Value,
       "attention::PagedKVCache::extend: unknown sequence 7 (the cache has made ids 0 to 1)"},
      {"extend: negative id", [](Cache c) { c.extend({-1}, {1}); }, Kind::Value,
       "attention::PagedKVCache::extend: unknown sequence -1 (the cache has made ids 0 to 1)"},
      {"extend: INT64_MAX id", [=](Cache c) { c.extend({kMax}, {1}); }, Kind::Value,
       "attention::PagedKVCache::extend: unknown sequence 9223372036854775807"},
      {"extend: freed",
       [](Cache c) {
         c.extend({1, 0}, {1, 1});
       },
       Kind::Value, "attention::PagedKVCache::extend: sequence 0 was freed"},
      {"extend: twice in a step",
       [](Cache c) {
         c.extend({1, 1}, {1, 1});
       },
       Kind::Value,
       "attention::PagedKVCache::extend: sequence 1 appears more than once in one step"},
      {"extend: counts",
       [](Cache c) {
         c.extend({1}, {1, 2});
       },
       Kind::Value,
       "attention::PagedKVCache::extend: expected one token count per sequence, got 1 sequences "
       "and 2 counts"},
      {"extend: negative count", [](Cache c) { c.extend({1}, {-1}); }, Kind::Value,
       "attention::PagedKVCache::extend: expected new_tokens >= 0, got -1 for sequence 1"},
      {"extend: full pool", [](Cache c) { c.extend({1}, {14}); }, Kind::Value,
       "attention::PagedKVCache::extend: out of pages: the step needs 4 new page(s) and 3 of 4 "
       "are free (free finished sequences or make a larger pool); nothing was changed"},
      {"extend: 2^31 tokens", [=](Cache c) { c.extend({1}, {k2to31}); }, Kind::Value,
       "attention::PagedKVCache::extend: out of pages: the step needs more pages than the pool "
       "has and 3 of 4 are free"},
      {"extend: INT64_MAX tokens", [=](Cache c) { c.extend({1}, {kMax}); }, Kind::Value,
       "out of pages: the step needs more pages than the pool has"},
      {"pages_needed: freed", [](Cache c) { c.pages_needed({0}, {1}); }, Kind::Value,
       "attention::PagedKVCache::pages_needed: sequence 0 was freed"},
      {"fork: unknown", [](Cache c) { c.fork_sequence(2); }, Kind::Value,
       "attention::PagedKVCache::fork_sequence: unknown sequence 2 (the cache has made ids 0 to "
       "1)"},
      {"fork: freed", [](Cache c) { c.fork_sequence(0); }, Kind::Value,
       "attention::PagedKVCache::fork_sequence: sequence 0 was freed"},
      {"free: freed", [](Cache c) { c.free_sequence(0); }, Kind::Value,
       "attention::PagedKVCache::free_sequence: sequence 0 was freed"},
      {"free: INT64_MAX", [=](Cache c) { c.free_sequence(kMax); }, Kind::Value,
       "attention::PagedKVCache::free_sequence: unknown sequence 9223372036854775807"},
      {"pages: freed", [](Cache c) { c.pages(0); }, Kind::Value,
       "attention::PagedKVCache::pages: sequence 0 was freed"},
      {"length: freed", [](Cache c) { c.length(0); }, Kind::Value,
       "attention::PagedKVCache::length: sequence 0 was freed"},
      {"truncate: longer", [=](Cache c) { c.truncate(1, kMax); }, Kind::Value,
       "attention::PagedKVCache::truncate: cannot truncate sequence 1 to 9223372036854775807 "
       "tokens: it has 3"},
      {"truncate: negative", [](Cache c) { c.truncate(1, -1); }, Kind::Value,
       "attention::PagedKVCache::truncate: cannot truncate sequence 1 to -1 tokens: it has 3"},
      {"page_references: INT64_MAX", [=](Cache c) { c.page_references(kMax); }, Kind::Value,
       "attention::PagedKVCache::page_references: expected a page in [0, 4), got "
       "9223372036854775807"},
      {"keys: layer -1", [](Cache c) { c.keys(-1); }, Kind::Value,
       "attention::PagedKVCache::keys: expected a layer in [0, 1), got -1"},
      // Writes: a stale batch (made before the cache changed), layers, shapes, dtypes, devices.
      {"write: stale batch",
       [](Cache c) {
         const auto stale = c.extend({}, {});
         c.extend({}, {});  // a change, if of nothing
         c.write(0, stale, torch::zeros({0, 2, 4}), torch::zeros({0, 2, 4}));
       },
       Kind::Value,
       "attention::PagedKVCache::write: the batch does not describe this cache as it is now (it "
       "was made before the cache last changed, or by another cache): extend() again"},
      {"write: layer INT64_MAX",
       [=](Cache c) {
         const auto k = torch::zeros({0, 2, 4});
         c.write(kMax, c.extend({}, {}), k, k);
       },
       Kind::Value,
       "attention::PagedKVCache::write: expected a layer in [0, 1), got "
       "9223372036854775807"},
      {"write: shape",
       [](Cache c) {
         const auto k = torch::zeros({1, 2, 5});
         c.write(0, c.extend({}, {}), k, k);
       },
       Kind::Value,
       "attention::PagedKVCache::write: expected keys and values of shape (0, 2, 4) "
       "(total_tokens, num_kv_heads, head_dim), got (1, 2, 5) and (1, 2, 5)"},
      {"write: dtype",
       [](Cache c) {
         const auto k = torch::zeros({0, 2, 4}, torch::kDouble);
         c.write(0, c.extend({}, {}), k, k);
       },
       Kind::Type,
       "attention::PagedKVCache::write: expected keys and values of dtype Float (the cache's), "
       "got Double and Double"},
      {"write: device",
       [](Cache c) {
         const auto k = torch::empty({0, 2, 4}, torch::kMeta);
         c.write(0, c.extend({}, {}), k, k);
       },
       Kind::Other,
       "attention::PagedKVCache::write: expected keys and values on cpu (the cache's device), got "
       "meta and meta"},
      // Attention over the pages: lengths, tables and their entries.
      {"paged_attention: negative length", paged(q, one, torch::tensor({-1}), table), Kind::Value,
       std::string(kPaged) + "expected key_lengths >= 0, got -1 for sequence 0"},
      {"paged_attention: length past the table", paged(q, one, torch::tensor({5}), table),
       Kind::Value,
       std::string(kPaged) +
           "expected key_lengths of at most 4 (page_table's 1 pages of 4 tokens), got 5 for "
           "sequence 0"},
      {"paged_attention: INT64_MAX length", paged(q, one, torch::tensor({kMax}), table),
       Kind::Value, "got 9223372036854775807 for sequence 0"},
      {"paged_attention: lengths per sequence", paged(q, one, torch::tensor({3, 3}), table),
       Kind::Value,
       std::string(kPaged) + "expected key_lengths of shape (1,), one per sequence, got (2,)"},
      {"paged_attention: float lengths", paged(q, one, torch::tensor({3.0}), table), Kind::Type,
       std::string(kPaged) + "expected key_lengths of dtype Int or Long, got Float"},
      {"paged_attention: table rows", paged(q, one, lengths, torch::tensor({{0}, {1}})),
       Kind::Value,
       std::string(kPaged) +
           "expected page_table of shape (1, max_pages), one row per sequence, got (2, 1)"},
      {"paged_attention: freed page in the table", paged(q, one, lengths, torch::tensor({{-1}})),
       Kind::Value,
       std::string(kPaged) +
           "expected page_table[0][0] (a page holding keys of sequence 0 that its queries see) "
           "in [0, 4), got -1"},
      {"paged_attention: page past the pool", paged(q, one, lengths, torch::tensor({{4}})),
       Kind::Value, "in [0, 4), got 4"},
      {"paged_attention: INT64_MAX page", paged(q, one, lengths, torch::tensor({{kMax}})),
       Kind::Value, "in [0, 4), got 9223372036854775807"},
      {"paged_attention: 2^31 page", paged(q, one, lengths, torch::tensor({{k2to31}})), Kind::Value,
       "in [0, 4), got 2147483648"},
      {"paged_attention: offsets past the queries", paged(q, torch::tensor({0, 2}), lengths, table),
       Kind::Value, "expected cu_seqlens_q to end at total_q"},
      {"paged_attention: query shape", paged(torch::randn({1, 2, 5}), one, lengths, table),
       Kind::Value,
       std::string(kPaged) +
           "expected query (total_q, H, d), key_pages (num_pages, Hkv, page_size, d) and "
           "value_pages (num_pages, Hkv, page_size, dv) with H a multiple of Hkv >= 1 and "
           "page_size >= 1, got query (1, 2, 5), key_pages (4, 2, 4, 4), value_pages (4, 2, 4, 4)"},
      {"paged_attention: offsets decrease",
       paged(torch::randn({1, 2, 4}), torch::tensor({0, 1, 0}), torch::tensor({3, 3}),
             torch::tensor({{1}, {1}})),
       Kind::Value,
       std::string(kPaged) + "expected nondecreasing cu_seqlens_q, got 0 after 1 (entry 2)"},
      {"paged_attention: offsets not from 0", paged(q, torch::tensor({1, 1}), lengths, table),
       Kind::Value, std::string(kPaged) + "expected cu_seqlens_q to start at 0, got 1"},
      {"paged_attention: table on another device",
       paged(q, one, lengths,
             torch::empty({1, 1}, torch::dtype(torch::kLong).device(torch::kMeta))),
       Kind::Other,
       std::string(kPaged) +
           "expected page_table on the CPU or on the queries' device (cpu), got meta"},
      {"forward_paged: x shape",
       [](Cache c) {
         attention::MultiHeadAttention m(MultiHeadAttentionOptions(8, 8, 2));
         m->forward_paged(torch::randn({2, 8}), c, c.extend({}, {}));
       },
       Kind::Value,
       "attention::MultiHeadAttention::forward_paged: expected x (0, 8), the batch's new tokens "
       "packed, got (2, 8)"},
      {"forward_paged: stale batch",
       [](Cache c) {
         attention::MultiHeadAttention m(MultiHeadAttentionOptions(8, 8, 2));
         const auto stale = c.extend({}, {});
         c.extend({}, {});
         m->forward_paged(torch::randn({0, 8}), c, stale);
       },
       Kind::Value,
       "attention::MultiHeadAttention::forward_paged: the batch does not describe the cache as it "
       "is now"},
      {"forward_paged: cache of other heads",
       [](Cache c) {
         attention::MultiHeadAttention m(MultiHeadAttentionOptions(8, 8, 1));
         m->forward_paged(torch::randn({0, 8}), c, c.extend({}, {}));
       },
       Kind::Value,
       "attention::MultiHeadAttention::forward_paged: expected a cache of num_kv_heads = 1 and "
       "head_dim = 8 (the module's), got 2 and 4"},
      {"forward_paged: gradients",
       [](Cache c) {
         attention::MultiHeadAttention m(MultiHeadAttentionOptions(8, 8, 2));
         m->forward_paged(torch::randn({0, 8}), c, c.extend({}, {}));
       },
       Kind::Other,
       "attention::MultiHeadAttention::forward_paged: is for inference: the cache holds no "
       "gradients; call it under torch::NoGradGuard"},
      {"paged_attention: float table", paged(q, one, lengths, torch::tensor({{0.0}})), Kind::Type,
       std::string(kPaged) + "expected page_table of dtype Int or Long, got Float"},
      {"paged_attention: dtype", paged(q.to(torch::kDouble), one, lengths, table), Kind::Type,
       std::string(kPaged) + "expected query and pages of one dtype, got Double, Float, Float"},
      {"paged_attention: mask",
       paged(q, one, lengths, table, F::ScaledDotProductAttentionOptions().attn_mask(q)),
       Kind::Value, std::string(kPaged) + "takes no attn_mask"},
      {"paged_attention: dropout",
       paged(q, one, lengths, table, F::ScaledDotProductAttentionOptions().dropout_p(0.5)),
       Kind::Value, std::string(kPaged) + "computes no dropout (it is for inference); got 0.5"},
      {"paged_attention: gradients", paged(q.clone().requires_grad_(), one, lengths, table),
       Kind::Other,
       std::string(kPaged) +
           "is for inference: the pages hold no gradients; call it under torch::NoGradGuard"},
  };
}

}  // namespace

TEST_CASE("bad input: the paged cache and attention over it refuse by name and change nothing",
          "[errors][paged]") {
  for (const auto& c : paged_cases()) {
    INFO(c.what);
    attention::PagedKVCache cache(attention::PagedKVCacheOptions(4, 4, 2, 4));
    const int64_t freed = cache.add_sequence(), kept = cache.add_sequence();
    cache.write(0, cache.extend({freed, kept}, {2, 3}), torch::randn({5, 2, 4}),
                torch::randn({5, 2, 4}));
    cache.free_sequence(freed);
    const test::PagedCacheState before(cache);
    // The kept sequence's three keys.
    const auto written = [&] { return cache.keys(0)[cache.pages(kept)[0]].narrow(1, 0, 3); };
    const auto keys = written().clone();
    switch (c.kind) {
      case Kind::Value:
        CHECK_THROWS_C10(c.call(cache), c10::ValueError, c.message);
        break;
      case Kind::Type:
        CHECK_THROWS_C10(c.call(cache), c10::TypeError, c.message);
        break;
      case Kind::Other:
        CHECK_THROWS_C10(c.call(cache), c10::Error, c.message);
        break;
    }
    CHECK(test::PagedCacheState(cache) == before);
    CHECK(torch::equal(written(), keys));
  }
}

TEST_CASE("bad input: a refused forward_paged writes nothing into the cache", "[errors][paged]") {
  namespace F = attention::functional;
  using attention::PagedForwardOptions;
  constexpr const char* kStep = "attention::MultiHeadAttention::forward_paged: ";
  const attention::ScoreMod same(
      [](const torch::Tensor& s, const attention::ScoreTile&) { return s; });
  struct Case {
    std::string what;
    MultiHeadAttentionOptions options;
    PagedForwardOptions step;
    bool grad_mode;
    std::string message;
  };
  const MultiHeadAttentionOptions base(8, 8, 2);
  const std::vector<Case> cases = {
      {"ALiBi on Native", MultiHeadAttentionOptions(base).alibi(true),
       PagedForwardOptions().backend(F::Backend::Native), false,
       std::string(kStep) +
           "the Native backend computes neither soft-capping, ALiBi nor attention sinks; use "
           "Backend::Math, Chunked or Auto"},
      {"softcap on Native", MultiHeadAttentionOptions(base).softcap(30.0),
       PagedForwardOptions().backend(F::Backend::Native), false,
       std::string(kStep) + "the Native backend computes neither soft-capping"},
      {"a score_mod on Native", base,
       PagedForwardOptions().backend(F::Backend::Native).score_mod(same), false,
       std::string(kStep) +
           "the Native backend cannot apply a score_mod; use Backend::Math, Chunked or Auto"},
      // Only the sinks learn: the module's check of its parameters sees them.
      {"sinks that learn", MultiHeadAttentionOptions(base).sinks(true), PagedForwardOptions(), true,
       std::string(kStep) +
           "is for inference: the cache holds no gradients; call it under torch::NoGradGuard"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    torch::manual_seed(7);
    attention::MultiHeadAttention m(c.options);
    for (auto& p : m->parameters()) p.requires_grad_(false);
    if (c.options.sinks()) m->sinks.requires_grad_(true);
    attention::PagedKVCache cache(attention::PagedKVCacheOptions(4, 4, 2, 4));
    const auto prompt = torch::arange(9);
    const int64_t s = cache.add_sequence(prompt).sequence;
    const auto batch = cache.extend({s}, {8});
    const auto keys = cache.keys(0).clone(), values = cache.values(0).clone();
    {
      c10::AutoGradMode grad(c.grad_mode);
      CHECK_THROWS_C10(m->forward_paged(torch::randn({8, 8}), cache, batch, c.step), c10::Error,
                       c.message);
    }
    // Bit for bit: the pool is never initialized, and NaN patterns there equal nothing.
    const auto bits = [](const torch::Tensor& t) { return t.view(torch::kInt); };
    CHECK(torch::equal(bits(cache.keys(0)), bits(keys)));
    CHECK(torch::equal(bits(cache.values(0)), bits(values)));
    // Nothing counts as written: at the cache's next change no page of the prompt is offered to
    // prefix caching, so the same prompt finds none of it cached.
    CHECK(cache.add_sequence(prompt).cached_tokens == 0);
    CHECK_FALSE(cache.page_cached(cache.pages(s)[0]));
  }
}

TEST_CASE("bad input: enumeration values no case handles are refused by name", "[errors]") {
  namespace F = attention::functional;
  using attention::BlockMask;
  const auto bad_backend = static_cast<F::Backend>(9);
  const auto bad_alignment = static_cast<F::CausalAlignment>(7);
  const auto q = torch::randn({1, 2, 4, 8});
  CHECK_THROWS_C10(F::scaled_dot_product_attention(
                       q, q, q, F::ScaledDotProductAttentionOptions().backend(bad_backend)),
                   c10::ValueError,
                   "attention::functional::scaled_dot_product_attention: expected a Backend (Auto, "
                   "Math, Chunked or Native), got the value 9");
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(
          q, q, q,
          F::ScaledDotProductAttentionOptions().is_causal(true).causal_alignment(bad_alignment)),
      c10::ValueError,
      "attention::functional::scaled_dot_product_attention: expected a CausalAlignment "
      "(BottomRight or TopLeft), got the value 7");
  CHECK_THROWS_C10(BlockMask::causal(4, 6, 2, bad_alignment), c10::ValueError,
                   "BlockMask::causal: expected a CausalAlignment (BottomRight or TopLeft), got "
                   "the value 7");
  CHECK_THROWS_C10(BlockMask::sliding_window(4, 6, 1, 2, bad_alignment), c10::ValueError,
                   "BlockMask::sliding_window: expected a CausalAlignment");
  CHECK_THROWS_C10(F::sparse_attention(q, q, q, torch::zeros({1, 4, 1}, torch::kLong),
                                       F::SparseAttentionOptions().backend(bad_backend)),
                   c10::ValueError,
                   "attention::functional::sparse_attention: expected a Backend (Auto, Math, "
                   "Chunked or Native), got the value 9");
  const auto log_decay = -torch::rand({1, 2, 4}), beta = torch::rand({1, 2, 4});
  CHECK_THROWS_C10(F::gated_delta_rule(q, q, q, log_decay, beta,
                                       F::GatedDeltaRuleOptions().backend(bad_backend)),
                   c10::ValueError,
                   "attention::functional::gated_delta_rule: expected a Backend (Auto, Math, "
                   "Chunked or Native), got the value 9");
}
