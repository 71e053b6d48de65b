#include "golden/harness.h"

#include <attention/attention.h>

#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>

namespace golden {

std::string& directory() {
  static std::string dir = ATTENTION_GOLDEN_DIR;
  return dir;
}

std::string& selected_case() {
  static std::string name;
  return name;
}

std::vector<Case> read_manifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  TORCH_CHECK(in, "golden: cannot open ", dir, "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& entry : manifest.at("cases")) {
    Case c;
    c.name = entry.at("name");
    c.module = entry.at("module");
    c.args = entry.at("args");
    c.seed = entry.at("seed");
    c.dtype = entry.at("dtype") == "float64" ? torch::kDouble : torch::kFloat;
    c.inputs = entry.at("inputs").get<std::vector<std::string>>();
    c.atol = entry.at("tolerance").at("atol");
    c.rtol = entry.at("tolerance").at("rtol");
    c.weights_path = dir + "/" + entry.at("weights").get<std::string>();
    c.tensors_path = dir + "/" + entry.at("tensors").get<std::string>();
    c.state_dict_path = dir + "/" + entry.at("state_dict").get<std::string>();
    cases.push_back(c);
  }
  return cases;
}

Module make_module(const Case& c) {
  const auto& a = c.args;
  auto arg = [&](const char* name) { return a.at(name).get<int64_t>(); };
  torch::manual_seed(c.seed);
  Module m;
  if (c.module == "SelfAttention") {
    attention::SelfAttention sa(arg("d_in"), arg("d_out_kq"), arg("d_out_v"));
    m = {sa.ptr(), [sa](const std::vector<torch::Tensor>& x) mutable { return sa(x[0]); }};
  } else if (c.module == "MultiHeadAttentionWrapper") {
    attention::MultiHeadAttentionWrapper mha(arg("d_in"), arg("d_out_kq"), arg("d_out_v"),
                                             arg("num_heads"));
    m = {mha.ptr(), [mha](const std::vector<torch::Tensor>& x) mutable { return mha(x[0]); }};
  } else if (c.module == "CausalSelfAttention") {
    attention::CausalSelfAttention causal(arg("d_in"), arg("d_out_kq"), arg("d_out_v"));
    m = {causal.ptr(),
         [causal](const std::vector<torch::Tensor>& x) mutable { return causal(x[0]); }};
  } else if (c.module == "CrossAttention") {
    attention::CrossAttentionOptions options(arg("d_in"), arg("d_out_kq"), arg("d_out_v"));
    if (a.contains("d_in_kv")) options.d_in_kv(arg("d_in_kv"));
    attention::CrossAttention cross(options);
    m = {cross.ptr(),
         [cross](const std::vector<torch::Tensor>& x) mutable { return cross(x[0], x[1]); }};
  } else {
    TORCH_CHECK(false, "golden: case ", c.name, " names an unknown module ", c.module);
  }
  m.module->to(c.dtype);
  m.module->eval();
  return m;
}

std::map<std::string, torch::Tensor> read_tensors(const Case& c) {
  std::ifstream in(c.tensors_path, std::ios::binary);
  TORCH_CHECK(in, "golden: cannot open ", c.tensors_path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : torch::pickle_load(bytes).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

namespace {

void check_close(const std::string& what, const torch::Tensor& actual,
                 const torch::Tensor& expected, const Case& c, Comparison& result) {
  if (!actual.defined() || actual.sizes() != expected.sizes()) {
    result.failures.push_back(fmt::format("{}: shape differs from Python's", what));
    return;
  }
  const auto diff = (actual.detach() - expected).abs();
  const double max_diff = diff.numel() ? diff.max().item<double>() : 0.0;
  result.max_abs_diff = std::max(result.max_abs_diff, max_diff);
  const auto allowed = c.atol + c.rtol * expected.abs();
  if (!(diff <= allowed).all().item<bool>()) {
    result.failures.push_back(fmt::format("{}: max |diff| {:.3e} beyond atol {:g} + rtol {:g}",
                                          what, max_diff, c.atol, c.rtol));
  }
}

}  // namespace

Comparison compare(const Case& c, Module& m, const std::map<std::string, torch::Tensor>& golden) {
  std::vector<torch::Tensor> inputs;
  for (const auto& name : c.inputs) {
    inputs.push_back(golden.at("input." + name).clone().requires_grad_(true));
  }
  for (auto& p : m.module->parameters()) p.mutable_grad() = torch::Tensor();
  Comparison result;
  auto output = m.forward(inputs);
  check_close("output", output, golden.at("output"), c, result);
  output.backward(golden.at("grad_output"));
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_close("grad." + c.inputs[i], inputs[i].grad(), golden.at("grad." + c.inputs[i]), c,
                result);
  }
  for (const auto& p : m.module->named_parameters()) {
    check_close("grad." + p.key(), p.value().grad(), golden.at("grad." + p.key()), c, result);
  }
  return result;
}

}  // namespace golden
