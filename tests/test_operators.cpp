// The operators of namespace `attention` (src/operators/) called from C++: through the
// dispatcher and through TorchScript they give the functional API's numbers, their fused route's
// gradients are those of the functional API's fused backward bit for bit, and bad arguments are
// refused with the operator's name. python/tests/test_attention_ops.py checks them from Python
// against the formula in float64.

#include <attention/functional.h>
#include <attention/operators.h>
#include <attention/rotary.h>

#include "helpers.h"
#include "operators/kernels.h"

#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace {

namespace F = attention::functional;
namespace ops = attention::operators;
using O = F::ScaledDotProductAttentionOptions;

c10::TypedOperatorHandle<decltype(ops::attention_cpu)> attention_operator() {
  attention::register_operators();
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("attention::scaled_dot_product_attention", "")
      .typed<decltype(ops::attention_cpu)>();
}

c10::TypedOperatorHandle<decltype(ops::varlen_cpu)> varlen_operator() {
  attention::register_operators();
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("attention::varlen_attention", "")
      .typed<decltype(ops::varlen_cpu)>();
}

// One set of operator arguments and the functional options they stand for.
struct Case {
  std::string what;
  c10::optional<torch::Tensor> mask;
  bool causal = false;
  std::string alignment = "bottom_right";
  c10::optional<int64_t> window_left;
  c10::optional<torch::Tensor> alibi;
  c10::optional<double> softcap;
  bool sinks = false;
  c10::optional<double> scale;

  O options(const torch::Tensor& sink_logits) const {
    O o;
    o.is_causal(causal).window_left(window_left).softcap(softcap).scale(scale);
    if (alignment == "top_left") o.causal_alignment(F::CausalAlignment::TopLeft);
    if (mask) o.attn_mask(*mask);
    if (alibi) o.alibi_slopes(*alibi);
    if (sinks) o.sinks(sink_logits);
    return o;
  }
};

std::vector<Case> cases() {
  std::vector<Case> all(6);
  all[0].what = "causal, grouped heads";
  all[0].causal = true;
  all[1].what = "top-left causal with a window";
  all[1].causal = true;
  all[1].alignment = "top_left";
  all[1].window_left = 7;
  all[2].what = "ALiBi, soft-capping, sinks and a scale";
  all[2].causal = true;
  all[2].alibi = F::alibi_slopes(4).to(torch::kFloat);
  all[2].softcap = 5.0;
  all[2].sinks = true;
  all[2].scale = 0.2;
  all[3].what = "a bool mask";
  all[3].mask = torch::rand({37, 45}) < 0.2;
  all[4].what = "an additive mask";
  all[4].mask = torch::randn({2, 1, 37, 45});
  all[5].what = "a window up to INT64_MAX";
  all[5].causal = true;
  all[5].window_left = std::numeric_limits<int64_t>::max();
  return all;
}

std::vector<torch::Tensor> leaves(std::vector<torch::Tensor> tensors) {
  for (auto& t : tensors) t = t.detach().clone().requires_grad_(true);
  return tensors;
}

}  // namespace

TEST_CASE(
    "operators: the fused route's outputs and gradients are the functional API's, bit for bit",
    "[operators]") {
  torch::manual_seed(45);
  const auto op = attention_operator();
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const auto& c : cases()) {
      INFO(c.what << ", " << dtype);
      const auto options = torch::TensorOptions().dtype(dtype);
      const auto q = torch::randn({2, 4, 37, 16}, options),
                 k = torch::randn({2, 2, 45, 16}, options),
                 v = torch::randn({2, 2, 45, 8}, options), sinks = torch::randn({4}, options);
      auto mask = c.mask;
      if (mask && mask->is_floating_point()) mask = mask->to(dtype);
      auto alibi = c.alibi;
      const auto ours = leaves({q, k, v, sinks});
      const auto theirs = leaves({q, k, v, sinks});
      const auto out =
          op.call(ours[0], ours[1], ours[2], mask, c.causal, c.alignment, c.window_left, {}, alibi,
                  c.softcap, c.sinks ? c10::optional<torch::Tensor>(ours[3]) : c10::nullopt,
                  c.scale, 0.0, "chunked", 256);
      Case with_mask = c;
      with_mask.mask = mask;
      const auto expected =
          F::scaled_dot_product_attention(theirs[0], theirs[1], theirs[2],
                                          with_mask.options(theirs[3]).backend(F::Backend::Chunked))
              .output;
      CHECK(torch::equal(out, expected));
      const auto upstream = torch::randn_like(out);
      out.backward(upstream);
      expected.backward(upstream);
      for (size_t i = 0; i < (c.sinks ? 4u : 3u); ++i) {
        INFO("gradient " << i);
        REQUIRE(ours[i].grad().defined());
        CHECK(torch::equal(ours[i].grad(), theirs[i].grad()));
      }
      if (!c.sinks) CHECK_FALSE(ours[3].grad().defined());
    }
  }
}

TEST_CASE("operators: inference on every backend is the functional API's", "[operators]") {
  torch::manual_seed(46);
  const auto op = attention_operator();
  const auto q = torch::randn({2, 4, 37, 16}), k = torch::randn({2, 2, 45, 16}),
             v = torch::randn({2, 2, 45, 8});
  const std::vector<std::pair<std::string, F::Backend>> backends = {
      {"auto", F::Backend::Auto},
      {"math", F::Backend::Math},
      {"chunked", F::Backend::Chunked},
      {"native", F::Backend::Native}};
  for (const auto& [name, backend] : backends) {
    INFO(name);
    const auto out =
        op.call(q, k, v, {}, true, "bottom_right", {}, {}, {}, {}, {}, {}, 0.0, name, 64);
    const auto expected = F::scaled_dot_product_attention(
                              q, k, v, O().is_causal(true).backend(backend).block_size(64))
                              .output;
    CHECK(torch::equal(out, expected));
  }
}

TEST_CASE("operators: packed sequences' outputs and gradients are varlen_attention's",
          "[operators]") {
  torch::manual_seed(47);
  const auto op = varlen_operator();
  const auto cu_q = torch::tensor({0, 5, 5, 40}, torch::kInt), cu_k = torch::tensor({0, 9, 12, 50});
  const auto inputs = std::vector<torch::Tensor>{
      torch::randn({40, 4, 16}), torch::randn({50, 2, 16}), torch::randn({50, 2, 16})};
  const auto ours = leaves(inputs), theirs = leaves(inputs);
  const auto out = op.call(ours[0], ours[1], ours[2], cu_q, cu_k, true, "bottom_right", 6, {}, {},
                           2.0, {}, {}, 0.0, "auto", 256);
  const auto expected = F::varlen_attention(
      theirs[0], theirs[1], theirs[2], cu_q, cu_k,
      O().is_causal(true).window_left(6).softcap(2.0).backend(F::Backend::Chunked));
  CHECK(torch::equal(out, expected));
  const auto upstream = torch::randn_like(out);
  out.backward(upstream);
  expected.backward(upstream);
  for (size_t i = 0; i < 3; ++i) CHECK(torch::equal(ours[i].grad(), theirs[i].grad()));
}

TEST_CASE("operators: the schemas' defaults are the functional options' defaults", "[operators]") {
  attention::register_operators();
  attention::register_operators();  // a second call finds them registered
  const auto& handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("attention::scaled_dot_product_attention", "");
  const auto& schema = handle.schema();
  // A call with the three tensors alone: every other argument takes its schema default, which
  // must describe the functional layer's default options.
  torch::jit::Stack stack;
  torch::manual_seed(48);
  const auto q = torch::randn({1, 4, 300, 16}), k = torch::randn({1, 4, 300, 16}),
             v = torch::randn({1, 4, 300, 16});
  stack.emplace_back(q);
  stack.emplace_back(k);
  stack.emplace_back(v);
  for (size_t i = 3; i < schema.arguments().size(); ++i) {
    INFO(schema.arguments()[i].name());
    REQUIRE(schema.arguments()[i].default_value().has_value());
    stack.push_back(*schema.arguments()[i].default_value());
  }
  handle.callBoxed(&stack);
  REQUIRE(stack.size() == 1);
  CHECK(torch::equal(stack[0].toTensor(), F::scaled_dot_product_attention(q, k, v).output));
  const O defaults;
  CHECK(schema.arguments().back().name() == "block_size");
  CHECK(schema.arguments().back().default_value()->toInt() == defaults.block_size());

  const auto rotary = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("attention::apply_rotary", "")
                          .typed<decltype(ops::apply_rotary)>();
  const auto positions = torch::arange(3, 303);
  CHECK(torch::equal(
      rotary.call(q, positions, 500.0, 0, "interleaved"),
      F::apply_rotary(q, positions,
                      F::RotaryOptions().theta(500.0).layout(F::RotaryLayout::Interleaved))));
  CHECK_THROWS_C10(rotary.call(q, positions, 500.0, 0, "pairs"), c10::ValueError,
                   "attention::apply_rotary: expected layout 'half_split' or 'interleaved', got "
                   "'pairs'");
}

TEST_CASE("operators: bad arguments are refused with the operator's name", "[operators][errors]") {
  const auto op = attention_operator();
  const auto q = torch::randn({2, 4, 5, 8}), k = torch::randn({2, 2, 6, 8}),
             v = torch::randn({2, 2, 6, 8});
  const auto call = [&](const torch::Tensor& key, const std::string& alignment,
                        c10::optional<int64_t> window, const std::string& backend, int64_t block) {
    return op.call(q, key, v, {}, true, alignment, window, {}, {}, {}, {}, {}, 0.0, backend, block);
  };
  CHECK_THROWS_C10(call(k, "bottom", {}, "auto", 256), c10::ValueError,
                   "attention::scaled_dot_product_attention: expected causal_alignment "
                   "'bottom_right' or 'top_left', got 'bottom'");
  CHECK_THROWS_C10(call(k, "bottom_right", {}, "flash", 256), c10::ValueError,
                   "attention::scaled_dot_product_attention: expected backend 'auto', 'math', "
                   "'chunked' or 'native', got 'flash'");
  CHECK_THROWS_C10(call(k, "bottom_right", -1, "auto", 256), c10::ValueError,
                   "attention::scaled_dot_product_attention: expected window_left >= 0");
  CHECK_THROWS_C10(call(k, "bottom_right", {}, "auto", 0), c10::ValueError,
                   "attention::scaled_dot_product_attention: expected block_size > 0");
  CHECK_THROWS_C10(call(k.narrow(-1, 0, 3), "bottom_right", {}, "auto", 256), c10::ValueError,
                   "attention::scaled_dot_product_attention: expected query and key with the same");
  CHECK_THROWS_C10(call(k.to(torch::kDouble), "bottom_right", {}, "auto", 256), c10::TypeError,
                   "attention::scaled_dot_product_attention: expected query, key and value of one "
                   "dtype");
  // The extremes that hide nothing or clamp are accepted.
  for (const int64_t block : {int64_t{1}, int64_t{1} << 31, std::numeric_limits<int64_t>::max()}) {
    CHECK(
        torch::allclose(call(k, "bottom_right", std::numeric_limits<int64_t>::max(), "auto", block),
                        call(k, "bottom_right", {}, "math", 256), 1e-5, 1e-6));
  }
}
