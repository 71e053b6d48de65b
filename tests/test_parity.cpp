#include <attention/multi_head_attention.h>
#include <attention/safetensors.h>
#include <attention/testing.h>
#include <attention/testing_catch2.h>

#include "helpers.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

// The cases of models/parity/, recorded in Python by scripts/make_parity_cases.py with the kit's
// recorder (python/attention_parity).

namespace fs = std::filesystem;
using attention::testing::check_parity;
using attention::testing::load_parity_case;
using attention::testing::ParityCase;

namespace {

std::string case_dir(const std::string& name) {
  return std::string(test::source_dir()) + "/models/parity/" + name;
}

// The Python Block of make_parity_cases.py: x + att(norm(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        att(register_module("att", attention::MultiHeadAttention(d, d, heads))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + att(norm(x)).output; }
  torch::nn::LayerNorm norm;
  attention::MultiHeadAttention att;
};
TORCH_MODULE(Block);

attention::testing::ParityForward forward_of(Block& block) {
  return [&](const std::vector<torch::Tensor>& inputs) {
    return std::vector<torch::Tensor>{block(inputs.at(0))};
  };
}

// A copy of a case whose weight `name` has every element moved by `ulps` float32 ulps.
std::string nudged_copy(const std::string& name, const std::string& weight, int ulps) {
  const fs::path target = fs::temp_directory_path() / ("attention-parity-" + name + "-nudged");
  fs::remove_all(target);
  fs::create_directories(target / name);
  fs::copy(case_dir(name), target / name, fs::copy_options::recursive);
  const std::string path = (target / name / "weights.safetensors").string();
  const std::string bytes = test::read_bytes(path);
  auto tensors = attention::parse_safetensors(bytes.data(), bytes.size());
  bool found = false;
  for (auto& [tensor_name, tensor] : tensors) {
    if (tensor_name != weight) continue;
    found = true;
    tensor = tensor * (1 + ulps * std::ldexp(1.0, -23));
  }
  REQUIRE(found);
  std::ofstream(path, std::ios::binary) << attention::serialize_safetensors(tensors);
  return (target / name).string();
}

}  // namespace

TEST_CASE("parity: a block of LayerNorm and MultiHeadAttention matches Python in float64",
          "[parity]") {
  const ParityCase recorded = load_parity_case(case_dir("block_float64"));
  CHECK(recorded.name == "block_float64");
  CHECK(recorded.dtype == "float64");
  CHECK(recorded.scalar_type == c10::optional<at::ScalarType>(torch::kFloat64));
  CHECK(recorded.gradients);
  CHECK(recorded.seed == c10::optional<int64_t>(7));
  Block block(16, 4);
  block->to(torch::kDouble);
  const auto report = check_parity(*block, recorded, forward_of(block));
  CHECK_THAT(report, attention::testing::MatchesPython());
  // The output, the input's gradient and every parameter's gradient (LayerNorm's two, the four
  // projections' weights and out_proj's bias).
  CHECK(report.compared.size() == 1 + 1 + 7);
  CHECK(report.str() == "parity case 'block_float64': all 9 tensors match Python's\n");
}

TEST_CASE("parity: a weight moved by one float32 ulp fails the check, which names the tensors",
          "[parity]") {
  const ParityCase nudged = load_parity_case(nudged_copy("block_float64", "att.W_query.weight", 1));
  Block block(16, 4);
  block->to(torch::kDouble);
  const auto report = check_parity(*block, nudged, forward_of(block));
  CHECK_FALSE(report.passed());
  std::vector<std::string> names;
  for (const auto& m : report.mismatches) names.push_back(m.tensor);
  const auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  CHECK(has("output.0"));
  CHECK(has("grad.input.x"));
  CHECK(has("grad.param.att.W_key.weight"));  // the keys' gradient goes through the queries
  const std::string text = report.str();
  CHECK_THAT(text, test::starts_with("parity case 'block_float64': "));
  CHECK_THAT(text, test::contains("  output.0: "));
  CHECK_THAT(text, test::contains("elements beyond the tolerance; max |diff| "));
  CHECK_THAT(text, test::contains("worst at ["));
}

TEST_CASE("parity: a case loads with a prefix, its parameter gradients compared under it",
          "[parity]") {
  const ParityCase recorded = load_parity_case(case_dir("gqa_float32"));
  CHECK(recorded.rtol == 1e-5);
  CHECK(recorded.atol == 1e-5);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2).qkv_bias(true));
  const auto options =
      attention::testing::ParityOptions().load(attention::LoadOptions().prefix("att."));
  const auto report = check_parity(
      *mha, recorded,
      [&](const std::vector<torch::Tensor>& inputs) {
        return std::vector<torch::Tensor>{mha(inputs.at(0)).output};
      },
      options);
  CHECK_THAT(report, attention::testing::MatchesPython());
  CHECK(report.compared.size() == 1 + 1 + 8);

  // Without the prefix the file's names do not load into the module: an error, module intact.
  const auto before = test::snapshot(*mha);
  CHECK_THROWS_AS(check_parity(*mha, recorded,
                               [&](const std::vector<torch::Tensor>& inputs) {
                                 return std::vector<torch::Tensor>{mha(inputs.at(0)).output};
                               }),
                  c10::Error);
  CHECK(test::unchanged(*mha, before));
}

TEST_CASE("parity: a forward with the wrong number of outputs, or none recording gradients, fails",
          "[parity]") {
  const ParityCase recorded = load_parity_case(case_dir("block_float64"));
  Block block(16, 4);
  block->to(torch::kDouble);
  const auto report = check_parity(*block, recorded, [&](const std::vector<torch::Tensor>& in) {
    auto y = block(in.at(0));
    return std::vector<torch::Tensor>{y, y};
  });
  REQUIRE(report.mismatches.size() == 1);
  CHECK(report.mismatches[0].problem == "the forward returned 2 tensors, the case has 1 (0)");

  // A forward that records no gradient cannot pass a case that holds gradients.
  const auto detached = check_parity(*block, recorded, [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{block(in.at(0)).detach()};
  });
  REQUIRE(detached.mismatches.size() == 1);
  CHECK(detached.mismatches[0].problem ==
        "the case holds gradients, but no output of the forward records one");
  // A forward that throws: a c10::Error naming the case, whatever it threw.
  CHECK_THROWS_C10(
      check_parity(*block, recorded,
                   [](const std::vector<torch::Tensor>&) -> std::vector<torch::Tensor> {
                     throw std::logic_error("not yet");
                   }),
      c10::Error,
      "attention::testing::check_parity: the forward threw on case 'block_float64': "
      "not yet");
  CHECK_THROWS_C10(
      check_parity(
          *block, recorded,
          [](const std::vector<torch::Tensor>&) -> std::vector<torch::Tensor> { throw 42; }),
      c10::Error,
      "the forward threw on case 'block_float64': an exception of a type not derived "
      "from std::exception");
  CHECK_THROWS_C10(check_parity(*block, recorded, forward_of(block),
                                attention::testing::ParityOptions().rtol(-1.0)),
                   c10::ValueError,
                   "attention::testing::check_parity: tolerances must be finite and >= 0, got "
                   "rtol -1 and atol 1e-10");
}

TEST_CASE("parity: compare_tensor reports shapes, NaN and infinities, and the worst element",
          "[parity]") {
  using attention::testing::compare_tensor;
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const auto e = torch::tensor({1.0, nan, inf, -2.0}, torch::kDouble);
  CHECK_FALSE(compare_tensor("t", e.clone(), e, 0, 0).has_value());
  CHECK_FALSE(
      compare_tensor("t", e + torch::tensor({1e-6, 0.0, 0.0, 0.0}), e, 0, 2e-6).has_value());
  auto wrong = compare_tensor("t", torch::tensor({1.0, nan, inf, -2.5}), e, 0, 0.1);
  REQUIRE(wrong);
  CHECK(wrong->count == 1);
  CHECK(wrong->where == std::vector<int64_t>{3});
  CHECK(wrong->actual == -2.5);
  CHECK(wrong->expected == -2.0);
  CHECK(wrong->max_abs_diff == test::Approx(0.5));
  CHECK(wrong->max_rel_diff == test::Approx(0.25));
  auto nan_case = compare_tensor("t", torch::tensor({1.0, 0.0, inf, -2.0}), e, 1, 1);
  REQUIRE(nan_case);
  CHECK(nan_case->where == std::vector<int64_t>{1});
  auto inf_case = compare_tensor("t", torch::tensor({1.0, nan, -inf, -2.0}), e, 1, 1);
  REQUIRE(inf_case);
  CHECK(inf_case->where == std::vector<int64_t>{2});
  auto nan_for_inf = compare_tensor("t", torch::tensor({1.0, nan, nan, -2.0}), e, 1, 1);
  REQUIRE(nan_for_inf);
  CHECK(nan_for_inf->where == std::vector<int64_t>{2});
  CHECK(std::isinf(nan_for_inf->max_abs_diff));
  auto shape = compare_tensor("t", torch::zeros({2, 2}), e, 1, 1);
  REQUIRE(shape);
  CHECK(shape->problem == "shape [2, 2] in C++, [4] in Python");
  auto where =
      compare_tensor("m", torch::zeros({2, 3}).index_put_({1, 2}, 5.0), torch::zeros({2, 3}), 0, 1);
  REQUIRE(where);
  CHECK(where->where == std::vector<int64_t>{1, 2});
}

TEST_CASE("parity: bad case folders are refused with the file and the reason", "[parity]") {
  const fs::path missing = fs::temp_directory_path() / "attention-parity-missing";
  fs::remove_all(missing);
  CHECK_THROWS_C10(
      load_parity_case(missing.string()), c10::Error,
      "attention::testing::load_parity_case: cannot open '" + missing.string() + "/manifest.json'");

  const fs::path other = fs::temp_directory_path() / "attention-parity-other";
  fs::remove_all(other);
  fs::copy(case_dir("gqa_float32"), other, fs::copy_options::recursive);
  std::ofstream(other / "manifest.json") << R"({"format": "golden", "format_version": 1})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "' is not a parity case (format 'golden', expected 'attention-parity')");
  std::ofstream(other / "manifest.json") << R"({"format": 3, "format_version": 1})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "/manifest.json': 'format' must be a string, got 3");
  std::ofstream(other / "manifest.json")
      << R"({"format": "attention-parity", "format_version": 2})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "' has format version 2; this library reads version 1");
  std::ofstream(other / "manifest.json")
      << R"({"format": "attention-parity", "format_version": 1, "rtol": 1e-5, "atol": 1e-5,
            "inputs": ["y"], "outputs": ["0"], "parameters": []})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "/tensors.safetensors' lacks 'input.y', which '");
  std::ofstream(other / "manifest.json")
      << R"({"format": "attention-parity", "format_version": 1, "rtol": -1, "atol": 1e-5,
            "inputs": ["x"], "outputs": ["0"], "parameters": []})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "': 'rtol' must be a finite number >= 0, got -1");
}

TEST_CASE("parity: a truncated, empty or malformed manifest is reported as such", "[parity]") {
  const fs::path other = fs::temp_directory_path() / "attention-parity-truncated";
  fs::remove_all(other);
  fs::copy(case_dir("gqa_float32"), other, fs::copy_options::recursive);
  const std::string whole = test::read_bytes((other / "manifest.json").string());
  const std::string path = (other / "manifest.json").string();
  // Cut anywhere inside the document, the file is truncated, not "not a JSON object".
  for (const size_t cut : {size_t{1}, whole.size() / 2, whole.size() - 2}) {
    INFO("cut at " << cut << " of " << whole.size() << " bytes");
    std::ofstream(path, std::ios::trunc) << whole.substr(0, cut);
    CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                     "attention::testing::load_parity_case: '" + path + "' is truncated: its " +
                         std::to_string(cut) + " bytes end inside the JSON document");
  }
  std::ofstream(path, std::ios::trunc) << "";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error, "'" + path + "' is empty");
  std::ofstream(path, std::ios::trunc) << R"({"format": "attention-parity",, "x": 1})";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "'" + path + "' is not valid JSON: parse error at line 1, column 31");
  std::ofstream(path, std::ios::trunc) << R"([1, 2])";
  CHECK_THROWS_C10(load_parity_case(other.string()), c10::Error,
                   "'" + path + "' is not a JSON object");
}

TEST_CASE("parity: parity_main runs one case and says how it went", "[parity]") {
  const auto check = [](const ParityCase& c) {
    Block block(16, 4);
    block->to(torch::kDouble);
    return check_parity(*block, c, forward_of(block));
  };
  std::string good = case_dir("block_float64");
  std::string nudged = nudged_copy("block_float64", "norm.weight", 1);
  std::string missing = "/nonexistent/parity/case";
  std::vector<char*> args{const_cast<char*>("parity"), good.data()};
  CHECK(attention::testing::parity_main(2, args.data(), check) == 0);
  args[1] = nudged.data();
  CHECK(attention::testing::parity_main(2, args.data(), check) == 1);
  args[1] = missing.data();
  CHECK(attention::testing::parity_main(2, args.data(), check) == 2);
  CHECK(attention::testing::parity_main(1, args.data(), check) == 2);
}
