// The golden harness: every case of models/golden/manifest.json, forward and backward, against
// the numbers Python computed. ctest runs the cases of each module as one test
// (--golden-module NAME); a failure names its case.

#include <attention/weights.h>

#include "golden/harness.h"
#include "helpers.h"

#include <fmt/format.h>
#include <torch/torch.h>

using test::snapshot;

TEST_CASE("golden cases", "[.golden]") {
  const auto cases = golden::read_manifest(golden::directory());
  int ran = 0;
  for (const auto& c : cases) {
    if (!golden::selected_case().empty() && c.name != golden::selected_case()) continue;
    if (!golden::selected_module().empty() && c.module != golden::selected_module()) continue;
    ++ran;
    INFO("golden case " << c.name);
    auto m = golden::make_module(c);

    // Same seed, same weights: loading Python's file must change nothing. Python's modules are
    // the project's stand-ins of the book's classes (scripts/reference.py), which follow
    // rasbt/LLMs-from-scratch at commit 28c65cd (GatedDeltaNet's A_log drawn as log U(0, 16)
    // since the book's commit 7d92267); scripts/check_book_classes.py compares them with the
    // book's own classes.
    // A case marked "seeded": false (Python's class draws in another order, or the case changed
    // its weights after seeding) loads Python's weights without that check.
    const auto seeded = snapshot(*m.module);
    const auto report = attention::load_weights(*m.module, c.weights_path, golden::load_options(c));
    CHECK(report.loaded.size() == seeded.size());
    const auto loaded = snapshot(*m.module);
    if (c.seeded) {
      for (size_t i = 0; i < seeded.size(); ++i) CHECK(torch::equal(seeded[i], loaded[i]));
    }

    const auto result = golden::compare(c, m, golden::read_tensors(c));
    for (const auto& failure : result.failures) FAIL_CHECK(failure);
    fmt::print("golden {} ({}): max |diff| {:.3e}\n", c.name, c10::toString(c.dtype),
               result.max_abs_diff);
  }
  REQUIRE(ran > 0);
}

TEST_CASE("golden: the manifest holds at least 60 cases of every module", "[golden]") {
  const auto cases = golden::read_manifest(golden::directory());
  CHECK(cases.size() >= 60);
  std::map<std::string, int> per_module;
  for (const auto& c : cases) ++per_module[c.module];
  for (const char* module :
       {"SelfAttention", "MultiHeadAttentionWrapper", "CausalSelfAttention", "CrossAttention"}) {
    INFO(module);
    CHECK(per_module[module] >= 5);
  }
}

TEST_CASE("golden: the state-dict and safetensors files of every case hold the TorchScript weights",
          "[golden][weights]") {
  for (const auto& c : golden::read_manifest(golden::directory())) {
    INFO(c.name);
    auto from_script = golden::make_module(c);
    CHECK(attention::load_weights(*from_script.module, c.weights_path, golden::load_options(c))
              .format == "torchscript");
    const auto expected = snapshot(*from_script.module);
    for (const auto& [path, format] :
         {std::pair{c.state_dict_path, "state_dict"}, {c.safetensors_path, "safetensors"}}) {
      auto other = golden::make_module(c);
      for (auto& p : other.module->parameters()) p.data().zero_();
      CHECK(attention::load_weights(*other.module, path, golden::load_options(c)).format == format);
      const auto got = snapshot(*other.module);
      for (size_t i = 0; i < got.size(); ++i) CHECK(torch::equal(expected[i], got[i]));
    }
  }
}

TEST_CASE("golden harness: a weight perturbed by 1e-3 is reported as a mismatch", "[golden]") {
  for (const char* name : {"self_batched_T6_float32", "cross_batched_T37_float64"}) {
    INFO(name);
    const auto cases = golden::read_manifest(golden::directory());
    auto it =
        std::find_if(cases.begin(), cases.end(), [&](const auto& c) { return c.name == name; });
    REQUIRE(it != cases.end());
    auto m = golden::make_module(*it);
    attention::load_weights(*m.module, it->weights_path);
    {
      torch::NoGradGuard no_grad;
      m.module->named_parameters()["W_query"][0][0] += 1e-3;
    }
    const auto result = golden::compare(*it, m, golden::read_tensors(*it));
    REQUIRE_FALSE(result.failures.empty());
    CHECK_THAT(result.failures.front(), test::starts_with("output.0: "));
    CHECK_THAT(result.failures.front(),
               test::contains(" elements beyond the tolerance; max |diff| "));
    CHECK(result.max_abs_diff > it->atol);
  }
}
