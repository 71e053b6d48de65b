// The attention of today's models (the book's chapter-5 zoo) as MultiHeadAttention options:
// Norm's kinds against their formulas; each family's option set against the same steps written
// out with LibTorch's ops (project, normalize, rotate, attend, gate, project) in float64; every
// cache and forward_paged against one forward; the refusals. Python's numbers for the book's
// classes are the golden cases zoo_* (test_golden.cpp).

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace F = attention::functional;
using attention::HeadNormOptions;
using attention::HeadNormScope;
using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;
using attention::NormKind;
using attention::NormParameter;
using test::max_abs_diff;

// One family's attention, as the zoo's configurations describe it (small sizes).
struct Family {
  std::string name;
  MultiHeadAttentionOptions options;
};

std::vector<Family> families() {
  const auto rms = HeadNormOptions().eps(1e-6);
  const auto rope = F::RotaryOptions().theta(10000.0);
  return {
      // Llama 3.2: no norms, head_dim from the width, Llama 3.1's frequency scaling.
      {"llama3", MultiHeadAttentionOptions(32, 32, 4).num_kv_heads(2).out_bias(false).rope(
                     F::RotaryOptions(rope).theta(500000.0).llama3_scaling(
                         F::Llama3RopeScaling().factor(8.0).original_context_length(16)))},
      // Qwen3: heads of their own size, RMSNorm per head named `scale`.
      {"qwen3", MultiHeadAttentionOptions(32, 32, 4)
                    .num_kv_heads(2)
                    .head_dim(16)
                    .out_bias(false)
                    .qk_norm(HeadNormOptions(rms).parameter_name(NormParameter::Scale))
                    .rope(rope)},
      // Gemma 3: zero-centred RMSNorm, query_pre_attn_scalar, a window.
      {"gemma3", MultiHeadAttentionOptions(24, 24, 4)
                     .num_kv_heads(1)
                     .head_dim(8)
                     .out_bias(false)
                     .qk_norm(HeadNormOptions(rms)
                                  .kind(NormKind::ZeroCenteredRMS)
                                  .parameter_name(NormParameter::Scale))
                     .scale(1.0 / std::sqrt(256.0))
                     .sliding_window(5)
                     .rope(rope)},
      // OLMo 3: RMSNorm over the whole projection, YaRN.
      {"olmo3", MultiHeadAttentionOptions(32, 32, 4)
                    .num_kv_heads(2)
                    .head_dim(8)
                    .out_bias(false)
                    .qk_norm(HeadNormOptions(rms).scope(HeadNormScope::Projection))
                    .rope(F::RotaryOptions(rope).yarn_scaling(
                        F::YarnRopeScaling().factor(8.0).original_context_length(16)))},
      // Tiny Aya: Cohere's LayerNorm is the block's (no QK-norm); interleaved rotary.
      {"tiny_aya", MultiHeadAttentionOptions(32, 32, 4)
                       .num_kv_heads(2)
                       .head_dim(8)
                       .out_bias(false)
                       .sliding_window(4)
                       .rope(F::RotaryOptions(rope).layout(F::RotaryLayout::Interleaved))},
      // Qwen3.5: zero-centred QK-norm, partial rotary, the gate's rows in W_query.
      {"qwen3_5", MultiHeadAttentionOptions(32, 32, 4)
                      .num_kv_heads(2)
                      .head_dim(16)
                      .out_bias(false)
                      .gate(true)
                      .gate_in_query(true)
                      .qk_norm(HeadNormOptions(rms).kind(NormKind::ZeroCenteredRMS))
                      .rope(F::RotaryOptions(rope).rotary_dim(4))},
      // Gemma 4's full layers: a value norm without weight, scale 1, proportional rotary.
      {"gemma4", MultiHeadAttentionOptions(32, 32, 4)
                     .num_kv_heads(2)
                     .head_dim(16)
                     .out_bias(false)
                     .qk_norm(rms)
                     .value_norm(HeadNormOptions(rms).elementwise_affine(false))
                     .scale(1.0)
                     .rope(F::RotaryOptions(rope).theta(1e6).rotated_pairs(2))},
      // LayerNorm as a QK-norm (the Tiny Aya class's option), per head.
      {"layer_norm", MultiHeadAttentionOptions(16, 16, 2).head_dim(8).qk_norm(
                         HeadNormOptions(rms).kind(NormKind::LayerNorm))},
  };
}

// The module with its parameters drawn at random (zero-centred weights included), in float64.
MultiHeadAttention make(const Family& family) {
  MultiHeadAttention mha(family.options);
  mha->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  for (auto& p : mha->parameters()) p.uniform_(-0.5, 0.5);
  return mha;
}

// A norm's formula in float64.
torch::Tensor norm_formula(const torch::Tensor& x, const HeadNormOptions& n,
                           const torch::Tensor& weight) {
  auto h = x;
  if (n.kind() == NormKind::LayerNorm) h = h - h.mean(-1, true);
  h = h / torch::sqrt(h.pow(2).mean(-1, true) + n.eps());
  if (!weight.defined()) return h;
  return n.kind() == NormKind::ZeroCenteredRMS ? h * (1 + weight) : h * weight;
}

// The module's forward written out step by step with LibTorch's ops, in float64, from its own
// parameters: the steps of the zoo's classes.
torch::Tensor by_steps(MultiHeadAttention& mha, const torch::Tensor& x) {
  const auto& o = mha->options;
  const int64_t B = x.size(0), T = x.size(1), H = o.num_heads(), Hkv = o.num_kv_heads();
  const int64_t hd = mha->head_dim();
  const auto linear = [](const torch::nn::Linear& l, const torch::Tensor& t) {
    return torch::nn::functional::linear(t, l->weight, l->bias);
  };
  auto q = linear(mha->W_query, x), k = linear(mha->W_key, x), v = linear(mha->W_value, x);
  torch::Tensor gate;
  if (o.gate_in_query()) {
    const auto both = q.view({B, T, H, 2 * hd});
    gate = both.narrow(-1, hd, hd).reshape({B, T, H * hd});
    q = both.narrow(-1, 0, hd).reshape({B, T, H * hd});
  } else if (o.gate()) {
    gate = linear(mha->W_gate, x);
  }
  const auto heads = [&](torch::Tensor t, int64_t n, const attention::Norm& norm,
                         const c10::optional<HeadNormOptions>& spec) {
    if (spec && spec->scope() == HeadNormScope::Projection)
      t = norm_formula(t, *spec, norm->weight);
    t = t.view({B, T, n, hd}).transpose(1, 2);
    if (spec && spec->scope() == HeadNormScope::PerHead) t = norm_formula(t, *spec, norm->weight);
    return t;
  };
  q = heads(q, H, mha->q_norm, o.qk_norm());
  k = heads(k, Hkv, mha->k_norm, o.qk_norm());
  v = heads(v, Hkv, mha->v_norm, o.value_norm());
  if (o.rope()) {
    q = F::apply_rotary(q, torch::arange(T), *o.rope());
    k = F::apply_rotary(k, torch::arange(T), *o.rope());
  }
  k = k.repeat_interleave(H / Hkv, 1);
  v = v.repeat_interleave(H / Hkv, 1);
  auto scores = q.matmul(k.transpose(-1, -2)) * o.scale().value_or(1.0 / std::sqrt(hd));
  const auto i = torch::arange(T).view({-1, 1}), j = torch::arange(T).view({1, -1});
  auto hidden = j > i;
  if (o.sliding_window()) hidden = hidden.logical_or(i - j >= *o.sliding_window());
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  auto context = scores.softmax(-1).matmul(v).transpose(1, 2).reshape({B, T, H * hd});
  if (gate.defined()) context = context * torch::sigmoid(gate);
  return linear(mha->out_proj, context);
}

}  // namespace

TEST_CASE("Norm: each kind is its formula; bfloat16 in float, rounded once; its names",
          "[zoo][norm]") {
  torch::manual_seed(1);
  const auto x = torch::randn({3, 5, 12}, torch::kDouble) * 3;
  for (const auto kind : {NormKind::RMS, NormKind::ZeroCenteredRMS, NormKind::LayerNorm}) {
    for (const bool affine : {true, false}) {
      attention::Norm norm(
          attention::NormOptions(12).kind(kind).eps(1e-5).elementwise_affine(affine));
      norm->to(torch::kDouble);
      if (affine) {
        // Zero-centred weights start at zeros, the others at ones: the identity scale.
        CHECK(torch::equal(norm->weight, kind == NormKind::ZeroCenteredRMS
                                             ? torch::zeros({12}, torch::kDouble)
                                             : torch::ones({12}, torch::kDouble)));
        torch::NoGradGuard no_grad;
        norm->weight.uniform_(-1, 1);
      } else {
        CHECK(norm->parameters().empty());
      }
      const auto spec = HeadNormOptions().kind(kind).eps(1e-5);
      CHECK(max_abs_diff(norm(x), norm_formula(x, spec, norm->weight)) < 1e-13);
      // bfloat16: the float computation on the same (bfloat16) values, rounded once.
      attention::Norm half(
          attention::NormOptions(12).kind(kind).eps(1e-5).elementwise_affine(affine));
      half->to(torch::kBFloat16);
      if (affine) {
        torch::NoGradGuard no_grad;
        half->weight.copy_(norm->weight);
      }
      const auto xb = x.to(torch::kBFloat16);
      const auto expected = norm_formula(xb.to(torch::kFloat), spec,
                                         affine ? half->weight.to(torch::kFloat) : torch::Tensor())
                                .to(torch::kBFloat16);
      CHECK(torch::equal(half(xb), expected));
    }
  }
  attention::Norm scale(attention::NormOptions(4).parameter_name(NormParameter::Scale));
  CHECK(scale->named_parameters().contains("scale"));
  CHECK_FALSE(scale->named_parameters().contains("weight"));
  CHECK_THROWS_C10(attention::Norm(attention::NormOptions(0)), c10::ValueError,
                   "attention::Norm: expected normalized_shape > 0, got 0");
  CHECK_THROWS_C10(attention::Norm(attention::NormOptions(4).eps(-1.0)), c10::ValueError,
                   "attention::Norm: expected a finite eps >= 0, got -1");
  CHECK_THROWS_C10(attention::Norm(attention::NormOptions(4).eps(std::nan(""))), c10::ValueError,
                   "attention::Norm: expected a finite eps >= 0, got nan");
  CHECK_THROWS_C10(scale(torch::randn({2, 5})), c10::ValueError,
                   "attention::Norm: expected input whose last dimension is 4, got (2, 5)");
  CHECK_THROWS_C10(scale(torch::randn({2, 4}, torch::kDouble)), c10::TypeError,
                   "attention::Norm: expected input of the weight's dtype Float, got Double");
}

TEST_CASE("zoo: each family's options are its steps written out, forward and backward", "[zoo]") {
  torch::manual_seed(2);
  for (const auto& family : families()) {
    INFO(family.name);
    auto mha = make(family);
    const auto x = torch::randn({2, 9, family.options.d_in()}, torch::kDouble).requires_grad_();
    const auto got = mha(x).output;
    CHECK(got.sizes() == c10::IntArrayRef({2, 9, family.options.d_out()}));
    const auto expected = by_steps(mha, x);
    CHECK(max_abs_diff(got, expected) < 1e-12);
    // The gradients of the input and of every parameter, norms' weights included.
    const auto upstream = torch::randn_like(got);
    auto params = mha->parameters();
    std::vector<torch::Tensor> inputs = {x};
    inputs.insert(inputs.end(), params.begin(), params.end());
    const auto mine = torch::autograd::grad({got}, inputs, {upstream});
    const auto theirs = torch::autograd::grad({expected}, inputs, {upstream});
    CHECK(max_abs_diff(mine, theirs) < 1e-11);
  }
}

TEST_CASE("zoo: every cache gives one forward's numbers with each family's options",
          "[zoo][kv_cache][paged]") {
  torch::manual_seed(3);
  torch::NoGradGuard no_grad;
  for (const auto& family : families()) {
    INFO(family.name);
    auto mha = make(family);
    mha->eval();
    const int64_t T = 13, d = family.options.d_in();
    const auto x = torch::randn({2, T, d}, torch::kDouble);
    const auto whole = mha(x).output;
    // A KVCache, token by token and in chunks.
    for (const auto& chunks :
         std::vector<std::vector<int64_t>>{std::vector<int64_t>(T, 1), {5, 1, 7}}) {
      attention::KVCache cache(T);
      const auto decoded = test::in_chunks(x, chunks, [&](const torch::Tensor& part) {
        return mha(part, MultiHeadAttentionForwardOptions().kv_cache(&cache)).output;
      });
      CHECK(max_abs_diff(decoded, whole) < 1e-12);
    }
    // A SlidingKVCache where the module has a window.
    if (family.options.sliding_window()) {
      attention::SlidingKVCache sliding(*family.options.sliding_window());
      const auto decoded =
          test::in_chunks(x, std::vector<int64_t>(T, 1), [&](const torch::Tensor& part) {
            return mha(part, MultiHeadAttentionForwardOptions().sliding_kv_cache(&sliding)).output;
          });
      CHECK(max_abs_diff(decoded, whole) < 1e-12);
    }
    // An 8-bit KVCache: the codes' rounding (a step of max |key| / 127 per row) bounds the gap.
    {
      MultiHeadAttention in_float(
          std::dynamic_pointer_cast<attention::MultiHeadAttentionImpl>(mha->clone()));
      in_float->to(torch::kFloat);
      const auto x32 = x.to(torch::kFloat);
      const auto whole32 = in_float(x32).output;
      attention::KVCache codes(T, torch::kChar);
      const auto decoded = test::in_chunks(x32, {6, 1, 6}, [&](const torch::Tensor& part) {
        return in_float(part, MultiHeadAttentionForwardOptions().kv_cache(&codes)).output;
      });
      CHECK(max_abs_diff(decoded, whole32) < 0.05 * whole32.abs().max().item<double>());
    }
    // Pages: a prompt's chunk and decoding steps of two sequences at once.
    attention::PagedKVCache pages(
        attention::PagedKVCacheOptions(16, 4, family.options.num_kv_heads(), mha->head_dim())
            .dtype(torch::kDouble));
    const int64_t a = pages.add_sequence(), b = pages.add_sequence();
    std::vector<torch::Tensor> out_a, out_b;
    int64_t at = 0;
    for (const int64_t n : {6, 1, 1, 5}) {
      const auto step = pages.extend({a, b}, {n, n});
      const auto packed = torch::cat({x[0].narrow(0, at, n), x[1].narrow(0, at, n)}, 0);
      const auto y = mha->forward_paged(packed, pages, step);
      out_a.push_back(y.narrow(0, 0, n));
      out_b.push_back(y.narrow(0, n, n));
      at += n;
    }
    CHECK(max_abs_diff(torch::cat(out_a, 0), whole[0]) < 1e-12);
    CHECK(max_abs_diff(torch::cat(out_b, 0), whole[1]) < 1e-12);
  }
}

TEST_CASE("zoo: a reading layer attends to its producer's normalized and rotated keys",
          "[zoo][kv_sharing]") {
  // Gemma 4's cross-layer KV sharing: the producer's keys after k_norm and rotary and its values
  // after v_norm; the reader's own queries, normalized and rotated.
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  const auto gemma4 = families().at(6);
  auto producer = make(gemma4), reader = make(gemma4);
  const auto x = torch::randn({1, 10, 32}, torch::kDouble);
  attention::SharedKV shared;
  producer(x, MultiHeadAttentionForwardOptions().share_kv(&shared));
  const auto read = reader(x, MultiHeadAttentionForwardOptions().shared_kv(&shared)).output;
  // The same as the reader with the producer's key and value weights (and norms) of its own.
  auto twin = make(gemma4);
  twin->W_query->weight.copy_(reader->W_query->weight);
  twin->q_norm->weight.copy_(reader->q_norm->weight);
  twin->out_proj->weight.copy_(reader->out_proj->weight);
  twin->W_key->weight.copy_(producer->W_key->weight);
  twin->W_value->weight.copy_(producer->W_value->weight);
  twin->k_norm->weight.copy_(producer->k_norm->weight);
  CHECK(max_abs_diff(read, twin(x).output) < 1e-12);
}

TEST_CASE("zoo: rotary tables with YaRN and with rotated pairs are their formulas",
          "[zoo][rotary]") {
  // YaRN (OLMo 3's compute_rope_params): the ramp between the pairs turning beta_fast and
  // beta_slow times in the original context, and the attention factor on cos and sin.
  const int64_t dim = 16;
  const double theta = 500000.0, factor = 8.0, original = 64.0;
  const auto yarn = F::RotaryOptions().theta(theta).rotary_dim(dim).yarn_scaling(
      F::YarnRopeScaling().factor(factor).original_context_length(64));
  const auto pos_freqs = torch::pow(theta, torch::arange(0, dim, 2, torch::kDouble) / dim);
  const auto turning = [&](double turns) {
    return dim * std::log(original / (turns * 2 * M_PI)) / (2 * std::log(theta));
  };
  const double low = std::max(std::floor(turning(32.0)), 0.0);
  const double high = std::min(std::ceil(turning(1.0)), dim - 1.0);
  const auto ramp = ((torch::arange(dim / 2, torch::kDouble) - low) / (high - low)).clamp(0, 1);
  const auto expected = (1 / (factor * pos_freqs)) * ramp + (1 / pos_freqs) * (1 - ramp);
  CHECK(max_abs_diff(F::rotary_frequencies(yarn), expected) < 1e-15);
  const auto [cos, sin] = F::rotary_tables(torch::arange(5), yarn, torch::kDouble);
  const double attention_factor = 0.1 * std::log(factor) + 1;
  const auto angles = torch::arange(5, torch::kDouble).view({-1, 1}) * expected;
  CHECK(max_abs_diff(cos, angles.cos() * attention_factor) < 1e-14);
  CHECK(max_abs_diff(sin, angles.sin() * attention_factor) < 1e-14);
  // Gemma 4's proportional rotary: the first pairs turn with the whole head's frequencies, the
  // others not at all.
  const auto proportional = F::RotaryOptions().theta(1e6).rotary_dim(12).rotated_pairs(1);
  const auto freq = F::rotary_frequencies(proportional);
  CHECK(freq[0].item<double>() == 1.0);
  CHECK(torch::equal(freq.narrow(0, 1, 5), torch::zeros({5}, torch::kDouble)));
  const auto x = torch::randn({2, 7, 12}, torch::kDouble);
  const auto rotated = F::apply_rotary(x, torch::arange(7), proportional);
  // Unchanged outside features 0 and 6 (the one pair of the half-split layout).
  const auto kept = torch::cat({rotated.narrow(-1, 1, 5), rotated.narrow(-1, 7, 5)}, -1);
  CHECK(torch::equal(kept, torch::cat({x.narrow(-1, 1, 5), x.narrow(-1, 7, 5)}, -1)));
}

TEST_CASE("zoo: options that cannot hold are refused by name, before anything is made",
          "[zoo][errors]") {
  using O = MultiHeadAttentionOptions;
  const auto name = std::string("attention::MultiHeadAttention: ");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).head_dim(-1)), c10::ValueError,
                   name + "expected head_dim >= 0 (0: d_out / num_heads), got -1");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 9, 2)), c10::ValueError,
                   name +
                       "expected num_heads to divide d_out, got d_out 9 and num_heads 2 (or "
                       "give head_dim)");
  CHECK_NOTHROW(MultiHeadAttention(O(8, 9, 2).head_dim(3)));
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).head_dim(std::numeric_limits<int64_t>::max())),
                   c10::ValueError,
                   name +
                       "num_heads x head_dim = 2 x 9223372036854775807 (twice that with "
                       "gate_in_query) exceeds INT64_MAX");
  CHECK_THROWS_C10(
      MultiHeadAttention(O(8, 8, 2).head_dim(int64_t{1} << 62).gate(true).gate_in_query(true)),
      c10::ValueError, "exceeds INT64_MAX");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).head_dim(8).output_projection(false)),
                   c10::ValueError,
                   name +
                       "without out_proj the output is the heads joined: expected d_out = "
                       "num_heads x head_dim = 16, got 8");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).gate_in_query(true)), c10::ValueError,
                   name +
                       "gate_in_query places the output gate's rows in W_query: expected "
                       "gate(true)");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).scale(std::nan(""))), c10::ValueError,
                   name + "expected a finite scale (unset for 1 / sqrt(head_dim)), got nan");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).qk_norm(HeadNormOptions().eps(-1e-6))),
                   c10::ValueError, name + "expected qk_norm with a finite eps >= 0, got -1e-06");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).value_norm(HeadNormOptions().eps(INFINITY))),
                   c10::ValueError, name + "expected value_norm with a finite eps >= 0, got inf");
  // Rotary: pairs, scalings.
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).rope(F::RotaryOptions().rotated_pairs(3))),
                   c10::ValueError,
                   name +
                       "expected rotated_pairs in [0, 2] (rotary_dim / 2; 0 for "
                       "all), got 3");
  CHECK_THROWS_C10(MultiHeadAttention(O(8, 8, 2).rope(F::RotaryOptions()
                                                          .llama3_scaling(F::Llama3RopeScaling())
                                                          .yarn_scaling(F::YarnRopeScaling()))),
                   c10::ValueError,
                   name + "expected at most one of llama3_scaling and yarn_scaling, got both");
  CHECK_THROWS_C10(
      F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).yarn_scaling(
          F::YarnRopeScaling().beta_fast(1.0).beta_slow(1.0))),
      c10::ValueError,
      "attention::functional::rotary_frequencies: expected yarn_scaling with 0 < beta_slow < "
      "beta_fast, got 1 and 1");
  CHECK_THROWS_C10(F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).yarn_scaling(
                       F::YarnRopeScaling().factor(0.5))),
                   c10::ValueError, "expected a finite yarn_scaling factor >= 1, got 0.5");
  CHECK_THROWS_C10(F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).yarn_scaling(
                       F::YarnRopeScaling().original_context_length(0))),
                   c10::ValueError, "expected yarn_scaling original_context_length > 0, got 0");
  CHECK_THROWS_C10(F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).yarn_scaling(
                       F::YarnRopeScaling().attention_factor(-1.0))),
                   c10::ValueError, "expected a finite yarn_scaling attention_factor > 0, got -1");
  // The extremes that hold: one feature per head, INT64_MAX context for the scaling.
  CHECK_NOTHROW(MultiHeadAttention(O(8, 8, 2).head_dim(1).qk_norm(HeadNormOptions())));
  CHECK_NOTHROW(F::rotary_frequencies(F::RotaryOptions().rotary_dim(8).yarn_scaling(
      F::YarnRopeScaling().original_context_length(std::numeric_limits<int64_t>::max()))));
  // A reading layer must rotate its queries as its producer rotated the keys it shares.
  {
    torch::NoGradGuard no_grad;
    MultiHeadAttention producer(O(8, 8, 2).rope(F::RotaryOptions()));
    MultiHeadAttention reader(O(8, 8, 2)), other(O(8, 8, 2).rope(F::RotaryOptions().theta(500.0)));
    const auto x = torch::randn({1, 5, 8});
    attention::SharedKV shared;
    producer(x, MultiHeadAttentionForwardOptions().share_kv(&shared));
    CHECK_THROWS_C10(reader(x, MultiHeadAttentionForwardOptions().shared_kv(&shared)),
                     c10::ValueError,
                     name +
                         "shared_kv's keys carry their producer's rotary embedding (theta "
                         "10000, rotary_dim 4, HalfSplit, rotated_pairs 0), and this layer's "
                         "is none: a reading layer needs its producer's rope");
    CHECK_THROWS_C10(other(x, MultiHeadAttentionForwardOptions().shared_kv(&shared)),
                     c10::ValueError, "and this layer's is theta 500, rotary_dim 4");
    MultiHeadAttention twin(O(8, 8, 2).rope(F::RotaryOptions()));
    CHECK_NOTHROW(twin(x, MultiHeadAttentionForwardOptions().shared_kv(&shared)));
  }
  // What torch::nn::MultiheadAttention cannot hold.
  for (const auto& family : families()) {
    if (family.name == "llama3") continue;
    INFO(family.name);
    MultiHeadAttention mha(family.options);
    CHECK_THROWS_AS(attention::to_torch(*mha), c10::ValueError);
  }
  CHECK_THROWS_C10(attention::to_torch(*MultiHeadAttention(O(8, 8, 2).qk_norm(HeadNormOptions()))),
                   c10::ValueError,
                   "attention::to_torch: torch::nn::MultiheadAttention has no QK-norm, value norm, "
                   "scale of its own or head size apart from d_out / num_heads");
}

TEST_CASE("zoo: the module loads a state dict by the book's names, norms included",
          "[zoo][weights]") {
  // Qwen3's q_norm.scale and k_norm.scale; OLMo 3's q_norm.weight over the projection.
  const auto qwen3 = families().at(1), olmo3 = families().at(3);
  const auto names = [](const MultiHeadAttention& m) {
    std::vector<std::string> out;
    for (const auto& p : m->named_parameters()) out.push_back(p.key());
    return out;
  };
  CHECK(names(MultiHeadAttention(qwen3.options)) ==
        std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight",
                                 "out_proj.weight", "q_norm.scale", "k_norm.scale"});
  MultiHeadAttention olmo(olmo3.options);
  CHECK(olmo->q_norm->weight.sizes() == c10::IntArrayRef({32}));
  CHECK(olmo->k_norm->weight.sizes() == c10::IntArrayRef({16}));
  CHECK(olmo->W_query->weight.sizes() == c10::IntArrayRef({32, 32}));
  CHECK(olmo->out_proj->weight.sizes() == c10::IntArrayRef({32, 32}));
  MultiHeadAttention qwen35(families().at(5).options);
  CHECK(qwen35->W_query->weight.sizes() == c10::IntArrayRef({128, 32}));  // queries and gates
  CHECK(qwen35->out_proj->weight.sizes() == c10::IntArrayRef({32, 64}));
  CHECK_FALSE(qwen35->W_gate);
}
