#include <attention/attention.h>

#include "golden/harness.h"
#include "helpers.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("attention-test-" + name)).string();
}

std::vector<torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool unchanged(const torch::nn::Module& m, const std::vector<torch::Tensor>& before) {
  const auto now = snapshot(m);
  for (size_t i = 0; i < now.size(); ++i) {
    if (!torch::equal(now[i], before[i])) return false;
  }
  return true;
}

std::string golden_file(const std::string& name) {
  return golden::directory() + "/" + name;
}

}  // namespace

TEST_CASE("load_weights: Python's TorchScript weights replace a module's own", "[weights]") {
  torch::manual_seed(999);  // not the case's seed: every weight must come from the file
  attention::MultiHeadAttentionWrapper mha(8, 4, 3, 3);
  const auto report = attention::load_weights(*mha, golden_file("wrapper_3_heads.pt"));
  CHECK(report.format == "torchscript");
  CHECK(report.loaded.size() == 9);
  CHECK(report.missing.empty());
  CHECK(report.unexpected.empty());
  auto script = torch::jit::load(golden_file("wrapper_3_heads.pt"));
  for (const auto& p : script.named_parameters()) {
    INFO(p.name);
    CHECK(torch::equal(mha->named_parameters()[p.name], p.value));
  }
}

TEST_CASE("load_weights: strict loading lists every problem and changes nothing", "[weights]") {
  attention::CrossAttention wrong(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  const auto before = snapshot(*wrong);
  // The file holds CrossAttention(3, 2, 4, d_in_kv=9) weights in float64.
  CHECK_THROWS_C10(attention::load_weights(*wrong, golden_file("cross_unbatched_wider_kv.pt")),
                   c10::ValueError, "shape of W_key: module (5, 2), file (9, 2)");
  CHECK(unchanged(*wrong, before));

  attention::SelfAttention self(3, 2, 4);
  const auto self_before = snapshot(*self);
  CHECK_THROWS_C10(attention::load_weights(*self, golden_file("cross_unbatched_wider_kv.pt")),
                   c10::ValueError, "dtype of W_query: module Float, file Double");
  CHECK(unchanged(*self, self_before));

  attention::MultiHeadAttentionWrapper two(8, 4, 3, 2);
  const auto two_before = snapshot(*two);
  try {
    attention::load_weights(*two, golden_file("wrapper_3_heads.pt"));
    FAIL("expected an error");
  } catch (const c10::ValueError& e) {
    CHECK_THAT(
        test::message(e),
        Catch::Contains("unexpected in the file: heads.2.W_query, heads.2.W_key, heads.2.W_value"));
  }
  CHECK(unchanged(*two, two_before));

  attention::MultiHeadAttentionWrapper four(8, 4, 3, 4);
  const auto four_before = snapshot(*four);
  CHECK_THROWS_C10(attention::load_weights(*four, golden_file("wrapper_3_heads.pt")),
                   c10::ValueError,
                   "missing in the file: heads.3.W_query, heads.3.W_key, heads.3.W_value");
  CHECK(unchanged(*four, four_before));
}

TEST_CASE("load_weights: non-strict loading skips missing and unexpected names and reports them",
          "[weights]") {
  attention::MultiHeadAttentionWrapper four(8, 4, 3, 4);
  const auto before = snapshot(*four);
  const auto report = attention::load_weights(*four, golden_file("wrapper_3_heads.pt"),
                                              attention::LoadOptions().strict(false));
  CHECK(report.loaded.size() == 9);
  CHECK(report.missing ==
        std::vector<std::string>{"heads.3.W_query", "heads.3.W_key", "heads.3.W_value"});
  CHECK(torch::equal(four->named_parameters()["heads.3.W_key"], before[10]));
  CHECK_FALSE(torch::equal(four->named_parameters()["heads.0.W_key"], before[1]));

  attention::MultiHeadAttentionWrapper two(8, 4, 3, 2);
  const auto report2 = attention::load_weights(*two, golden_file("wrapper_3_heads.pt"),
                                               attention::LoadOptions().strict(false));
  CHECK(report2.unexpected.size() == 3);
  CHECK(report2.loaded.size() == 6);
}

TEST_CASE("load_weights: unreadable files raise an error naming the path", "[weights]") {
  attention::SelfAttention sa(3, 2, 4);
  const auto before = snapshot(*sa);
  CHECK_THROWS_C10(attention::load_weights(*sa, "/nonexistent/weights.pt"), c10::Error,
                   "no file at '/nonexistent/weights.pt'");
  CHECK_THROWS_C10(attention::load_weights(*sa, fs::temp_directory_path().string()), c10::Error,
                   "is not a regular file");
  const auto empty = temp_path("empty.pt");
  std::ofstream(empty).close();
  CHECK_THROWS_C10(attention::load_weights(*sa, empty), c10::Error, "is empty");
  const auto garbage = temp_path("garbage.pt");
  std::ofstream(garbage) << "not a weight file at all";
  CHECK_THROWS_C10(attention::load_weights(*sa, garbage), c10::Error,
                   "as a TorchScript archive or a torch.save state dict");
  CHECK(unchanged(*sa, before));
  std::remove(empty.c_str());
  std::remove(garbage.c_str());
}

TEST_CASE("save_weights: C++ writes, C++ reads back the same values", "[weights]") {
  attention::CrossAttention a(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  attention::CrossAttention b(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  const auto path = temp_path("cross.pt");
  attention::save_weights(*a, path);
  CHECK(attention::load_weights(*b, path).format == "state_dict");
  CHECK(unchanged(*b, snapshot(*a)));
  std::remove(path.c_str());
}

TEST_CASE("load_weights: NaN or Inf values are rejected unless allowed", "[weights]") {
  attention::SelfAttention source(3, 2, 4), target(3, 2, 4);
  {
    torch::NoGradGuard no_grad;
    source->W_key[1][1] = NAN;
  }
  const auto path = temp_path("nan.pt");
  attention::save_weights(*source, path);
  const auto before = snapshot(*target);
  CHECK_THROWS_C10(attention::load_weights(*target, path), c10::ValueError,
                   "W_key holds NaN or Inf values");
  CHECK(unchanged(*target, before));
  attention::load_weights(*target, path, attention::LoadOptions().allow_non_finite(true));
  CHECK(std::isnan(target->W_key[1][1].item<float>()));
  std::remove(path.c_str());
}
