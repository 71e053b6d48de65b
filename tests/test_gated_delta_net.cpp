// Gated DeltaNet and its gated delta rule. Python's numbers for the book's class are the golden
// cases deltanet_* (test_golden.cpp); here the fused CPU kernel against the recurrence in
// LibTorch ops (outputs, states and every gradient), splitting the tokens into calls, bfloat16,
// and the module's state from call to call.

#include <attention/gated_delta_net.h>
#include <attention/gated_delta_rule.h>

#include "golden/harness.h"
#include "helpers.h"

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <vector>

namespace {

namespace F = attention::functional;
using attention::GatedDeltaNet;
using attention::GatedDeltaNetOptions;
using attention::GatedDeltaNetState;
using test::max_abs_diff;

// One problem's inputs, as Gated DeltaNet makes them: unit queries and keys, decays <= 0,
// update gates in (0, 1).
struct Inputs {
  torch::Tensor q, k, v, log_decay, beta, state;
  std::vector<torch::Tensor> all() const { return {q, k, v, log_decay, beta, state}; }
};

Inputs make_inputs(int64_t b, int64_t h, int64_t t, int64_t dk, int64_t dv, bool per_feature,
                   torch::Dtype dtype = torch::kDouble) {
  const auto o = torch::TensorOptions().dtype(dtype);
  const auto unit = [&](torch::Tensor x) { return x / x.norm(2, -1, true); };
  Inputs in;
  in.q = unit(torch::randn({b, h, t, dk}, o)) / std::sqrt(static_cast<double>(dk));
  in.k = unit(torch::randn({b, h, t, dk}, o));
  in.v = torch::randn({b, h, t, dv}, o);
  in.log_decay = -torch::rand({b, h, t}, o) * 0.5;
  in.beta = per_feature ? torch::rand({b, h, t, dv}, o) : torch::rand({b, h, t}, o);
  in.state = torch::randn({b, h, dk, dv}, o) * 0.1;
  for (auto* x : {&in.q, &in.k, &in.v, &in.log_decay, &in.beta, &in.state}) {
    x->requires_grad_(true);
  }
  return in;
}

F::GatedDeltaRuleOutput run(const Inputs& in, F::Backend backend) {
  return F::gated_delta_rule(in.q, in.k, in.v, in.log_decay, in.beta,
                             F::GatedDeltaRuleOptions().initial_state(in.state).backend(backend));
}

}  // namespace

TEST_CASE("Gated delta rule: the fused kernel equals the recurrence, outputs and gradients",
          "[deltanet]") {
  torch::manual_seed(3);
  // T over two checkpoint intervals and a part; d_k != d_v; both forms of beta.
  for (const bool per_feature : {true, false}) {
    INFO("beta per value feature: " << per_feature);
    const auto in = make_inputs(2, 3, 150, 8, 12, per_feature);
    const auto reference = run(in, F::Backend::Math);
    const auto fused = run(in, F::Backend::Chunked);
    CHECK(max_abs_diff(fused.output, reference.output) < 1e-12);
    CHECK(max_abs_diff(fused.state, reference.state) < 1e-12);
    // A loss that reaches the output and the final state.
    const auto gy = torch::randn_like(reference.output), gs = torch::randn_like(reference.state);
    const auto grads_of = [&](const F::GatedDeltaRuleOutput& o) {
      return torch::autograd::grad({o.output, o.state}, in.all(), {gy, gs});
    };
    const auto expected = grads_of(reference), got = grads_of(fused);
    const char* names[] = {"q", "k", "v", "log_decay", "beta", "initial_state"};
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("gradient of " << names[i]);
      CHECK(max_abs_diff(got[i], expected[i]) < 1e-11);
    }
  }
}

TEST_CASE("Gated delta rule: the gradient of the output alone, and of the state alone",
          "[deltanet]") {
  torch::manual_seed(4);
  const auto in = make_inputs(1, 2, 70, 6, 6, true);
  for (const bool output_only : {true, false}) {
    INFO("loss on the output only: " << output_only);
    const auto loss = [&](const F::GatedDeltaRuleOutput& o) {
      return output_only ? o.output.pow(2).sum() : o.state.sum();
    };
    // The recurrence's graph does not reach q when only the state counts: a zero gradient.
    const auto grads = [&](F::Backend backend) {
      auto g = torch::autograd::grad({loss(run(in, backend))}, in.all(), {}, false, false,
                                     /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i) {
        if (!g[i].defined()) g[i] = torch::zeros_like(in.all()[i]);
      }
      return g;
    };
    const auto expected = grads(F::Backend::Math), got = grads(F::Backend::Chunked);
    for (size_t i = 0; i < expected.size(); ++i) {
      CHECK(max_abs_diff(got[i], expected[i]) < 1e-11);
    }
  }
}

TEST_CASE("Gated delta rule: any split of the tokens into calls equals one call", "[deltanet]") {
  torch::manual_seed(5);
  torch::NoGradGuard no_grad;
  const auto in = make_inputs(2, 2, 100, 16, 16, true, torch::kFloat);
  const auto whole = F::gated_delta_rule(in.q, in.k, in.v, in.log_decay, in.beta);
  for (const auto& split : std::vector<std::vector<int64_t>>{{1, 99}, {64, 36}, {7, 0, 50, 43}}) {
    torch::Tensor state;
    std::vector<torch::Tensor> outputs;
    int64_t start = 0;
    for (const int64_t n : split) {
      const auto part = [&](const torch::Tensor& x) { return x.narrow(2, start, n); };
      auto o = F::gated_delta_rule(part(in.q), part(in.k), part(in.v), part(in.log_decay),
                                   part(in.beta), F::GatedDeltaRuleOptions().initial_state(state));
      outputs.push_back(o.output);
      state = o.state;
      start += n;
    }
    CHECK(max_abs_diff(torch::cat(outputs, 2), whole.output) < 1e-5);
    CHECK(max_abs_diff(state, whole.state) < 1e-5);
  }
}

TEST_CASE("Gated delta rule: T = 0 returns the initial state; no features gives zeros",
          "[deltanet]") {
  torch::NoGradGuard no_grad;
  for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
    const auto in = make_inputs(2, 3, 0, 4, 5, true);
    const auto o = run(in, backend);
    CHECK(o.output.sizes() == c10::IntArrayRef({2, 3, 0, 5}));
    CHECK(torch::equal(o.state, in.state));
    const auto no_keys = make_inputs(1, 2, 9, 0, 5, false);
    const auto z = run(no_keys, backend);
    CHECK(z.output.sizes() == c10::IntArrayRef({1, 2, 9, 5}));
    CHECK(z.output.abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("Gated delta rule: bfloat16 is computed in float and rounded once", "[deltanet]") {
  torch::manual_seed(6);
  torch::NoGradGuard no_grad;
  const auto in = make_inputs(1, 2, 80, 16, 16, true, torch::kFloat);
  const auto bf = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
  const auto f = [](const torch::Tensor& x) { return x.to(torch::kFloat); };
  const auto o = F::gated_delta_rule(bf(in.q), bf(in.k), bf(in.v), bf(in.log_decay), bf(in.beta));
  REQUIRE(o.output.scalar_type() == torch::kBFloat16);
  const auto reference = F::gated_delta_rule(f(bf(in.q)), f(bf(in.k)), f(bf(in.v)),
                                             f(bf(in.log_decay)), f(bf(in.beta)));
  // One rounding of the result: half a bfloat16 unit of the largest output.
  const double bound = reference.output.abs().max().item<double>() * std::pow(2.0, -8);
  CHECK(max_abs_diff(f(o.output), reference.output) <= bound);
}

TEST_CASE("GatedDeltaNet: one seed gives the book's current weights, A_log = log U(0, 16)",
          "[deltanet]") {
  // The book's class at rasbt/LLMs-from-scratch 28c65cd draws A_log as log(uniform_(0, 16))
  // (since its commit 7d92267, November 2025) after dt_bias and before norm and out_proj; the
  // golden case's weights were written by scripts/reference.py's stand-in of that class after
  // torch.manual_seed(case seed).
  for (const auto& c : golden::read_manifest(golden::directory())) {
    if (c.name != "deltanet_T6_float64") continue;
    std::ifstream in(c.state_dict_path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    const auto python = torch::pickle_load(bytes).toGenericDict();
    const auto seeded = golden::make_module(c);
    const auto mine = seeded.module->named_parameters();
    for (const char* name : {"A_log", "dt_bias", "W_alpha.weight", "out_proj.weight"}) {
      INFO(name);
      CHECK(torch::equal(mine[name], python.at(name).toTensor()));
    }
    // Rates in (0, 16): no head starts without decay, as the zeros of earlier versions did.
    CHECK((mine["A_log"] < std::log(16.0)).all().item<bool>());
    CHECK(mine["A_log"].abs().min().item<double>() > 0);
    return;
  }
  FAIL("the golden case deltanet_T6_float64 is missing");
}

TEST_CASE("GatedDeltaNet: decoding through its state equals one forward", "[deltanet]") {
  torch::manual_seed(7);
  GatedDeltaNet net(GatedDeltaNetOptions(12, 24, 3).qkv_bias(true));
  net->to(torch::kDouble);
  net->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 37, 12}, torch::kDouble);
  const auto whole = net(x);
  for (const auto& chunks :
       std::vector<std::vector<int64_t>>{{37}, std::vector<int64_t>(37, 1), {5, 1, 31}}) {
    GatedDeltaNetState state;
    const auto decoded =
        test::in_chunks(x, chunks, [&](const torch::Tensor& part) { return net(part, &state); });
    CHECK(state.length() == 37);
    CHECK(state.state().sizes() == c10::IntArrayRef({2, 3, 8, 8}));
    CHECK(max_abs_diff(decoded, whole) < 1e-12);
  }
  // The state's size does not grow with the tokens: 3 heads x 8 x 8 doubles per sequence.
  GatedDeltaNetState state;
  net(x, &state);
  CHECK(state.bytes_per_sequence() == 3 * 8 * 8 * 8);
}

TEST_CASE("GatedDeltaNet: the fused kernel and the recurrence give one module's numbers",
          "[deltanet]") {
  torch::manual_seed(8);
  GatedDeltaNet net(GatedDeltaNetOptions(8, 16, 2));
  net->to(torch::kDouble);
  const auto x = torch::randn({2, 70, 8}, torch::kDouble).requires_grad_(true);
  const auto grads = [&](attention::functional::Backend backend) {
    net->options.backend(backend);
    net->zero_grad();
    const auto y = net(x);
    const auto gx = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true)[0];
    y.pow(2).sum().backward();
    std::vector<torch::Tensor> out{y.detach(), gx};
    for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto math = grads(F::Backend::Math), fused = grads(F::Backend::Chunked);
  for (size_t i = 0; i < math.size(); ++i) {
    INFO("tensor " << i << " (output, grad x, then the parameters' gradients)");
    CHECK(max_abs_diff(fused[i], math[i]) < 1e-11);
  }
}

TEST_CASE("GatedDeltaNet: a refused call leaves the state as it was", "[deltanet]") {
  GatedDeltaNet net(GatedDeltaNetOptions(8, 16, 2));
  GatedDeltaNetState state;
  net(torch::randn({2, 5, 8}), &state);
  const auto before = state.state().clone();
  CHECK_THROWS_AS(net(torch::randn({3, 1, 8}), &state), c10::ValueError);
  CHECK_THROWS_AS(net(torch::randn({2, 1, 7}), &state), c10::ValueError);
  CHECK_THROWS_AS(net(torch::randn({2, 1, 8}, torch::kDouble), &state), c10::TypeError);
  CHECK(state.length() == 5);
  CHECK(torch::equal(state.state(), before));
  state.reset();
  CHECK(state.length() == 0);
  CHECK(state.bytes_per_sequence() == 0);
  CHECK(net(torch::randn({3, 1, 8}), &state).sizes() == c10::IntArrayRef({3, 1, 16}));
}

TEST_CASE("Gated delta rule: a double backward through the fused kernel is refused, Math's works",
          "[deltanet]") {
  torch::manual_seed(31);
  const auto options = torch::dtype(torch::kDouble).requires_grad(true);
  const auto q = torch::randn({1, 2, 9, 4}, options), k = torch::randn({1, 2, 9, 4}, options),
             v = torch::randn({1, 2, 9, 3}, options);
  const auto log_decay = -torch::rand({1, 2, 9}, torch::kDouble),
             beta = torch::rand({1, 2, 9}, torch::kDouble);
  const auto first_order = [&](F::Backend backend) {
    const auto y =
        F::gated_delta_rule(q, k, v, log_decay, beta, F::GatedDeltaRuleOptions().backend(backend))
            .output;
    return torch::autograd::grad({y.square().sum()}, {q}, {}, true, /*create_graph=*/true)[0];
  };
  CHECK_THROWS_C10(first_order(F::Backend::Chunked), c10::Error,
                   "attention::functional::gated_delta_rule: the fused CPU backward gives "
                   "first-order gradients only");
  const auto dq = first_order(F::Backend::Math);
  CHECK(torch::autograd::grad({dq.sum()}, {v})[0].abs().sum().item<double>() > 0.0);
}
