#include <attention/attention.h>

#include "golden/harness.h"
#include "helpers.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

using test::snapshot;
using test::unchanged;

namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("attention-test-" + name)).string();
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
        test::contains("unexpected in the file: heads.2.W_query, heads.2.W_key, heads.2.W_value"));
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
                   "is neither a safetensors file, a torch.save file nor a TorchScript archive");
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

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("load_weights: safetensors written by Python load, and C++ writes them back",
          "[weights][safetensors]") {
  torch::manual_seed(5);
  attention::MultiHeadAttentionWrapper from_python(8, 4, 3, 3);
  const auto report =
      attention::load_weights(*from_python, golden_file("wrapper_3_heads.safetensors"));
  CHECK(report.format == "safetensors");
  CHECK(report.loaded.size() == 9);
  attention::MultiHeadAttentionWrapper from_script(8, 4, 3, 3);
  attention::load_weights(*from_script, golden_file("wrapper_3_heads.pt"));
  CHECK(unchanged(*from_python, snapshot(*from_script)));

  const auto path = temp_path("wrapper.safetensors");
  attention::save_weights(*from_python, path);
  attention::MultiHeadAttentionWrapper again(8, 4, 3, 3);
  CHECK(attention::load_weights(*again, path).format == "safetensors");
  CHECK(unchanged(*again, snapshot(*from_python)));
  std::remove(path.c_str());
}

TEST_CASE("load_weights: every truncation of a valid file fails cleanly and changes nothing",
          "[weights][errors]") {
  // The golden files, and the OrderedDict of torch.save(model.state_dict()).
  const std::string ordered = std::string(test::source_dir()) + "/models/weights/book_mha.pth";
  for (const std::string& file :
       {golden_file("wrapper_3_heads.safetensors"), golden_file("wrapper_3_heads.state_dict.pt"),
        golden_file("wrapper_3_heads.pt"), ordered}) {
    const auto bytes = test::read_bytes(file);
    REQUIRE(bytes.size() > 100);
    attention::MultiHeadAttentionWrapper mha(8, 4, 3, 3);
    const auto before = snapshot(*mha);
    const auto path = temp_path("truncated.bin");
    int64_t failures = 0;
    for (size_t length = 0; length < bytes.size(); ++length) {
      write_bytes(path, bytes.substr(0, length));
      try {
        attention::load_weights(*mha, path);
      } catch (const c10::Error&) {
        ++failures;
      }
    }
    INFO(file << ": " << bytes.size() << " truncations");
    CHECK(failures == static_cast<int64_t>(bytes.size()));
    CHECK(unchanged(*mha, before));
    std::remove(path.c_str());
  }
}

TEST_CASE("load_weights: random bytes and foreign zip archives are rejected", "[weights][errors]") {
  attention::SelfAttention sa(3, 2, 4);
  const auto before = snapshot(*sa);
  const auto path = temp_path("random.bin");
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng() % 4096, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    if (trial % 4 == 1) bytes.replace(0, std::min<size_t>(bytes.size(), 4), "PK\x03\x04");
    if (trial % 4 == 2 && bytes.size() > 9) bytes[8] = '{';
    write_bytes(path, bytes);
    CHECK_THROWS_AS(attention::load_weights(*sa, path), c10::Error);
  }
  // A well-formed zip archive of another kind.
  {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    const std::string text = "not weights";
    writer.writeRecord("notes/readme.txt", text.data(), text.size());
    writer.writeEndOfFile();
  }
  CHECK_THROWS_C10(attention::load_weights(*sa, path), c10::Error,
                   "as a torch.save file or a TorchScript archive: '" + path +
                       "' is a zip archive without data.pkl, not a torch.save file");
  CHECK(unchanged(*sa, before));
  std::remove(path.c_str());
}

TEST_CASE("load_weights: trusted(false) refuses TorchScript and reads the weights-only formats",
          "[weights][errors]") {
  attention::MultiHeadAttentionWrapper mha(8, 4, 3, 3);
  const auto before = snapshot(*mha);
  const auto untrusted = attention::LoadOptions().trusted(false);
  // Found by fuzzing: LibTorch 1.13's TorchScript importer calls std::terminate on this archive,
  // so it must never reach LibTorch when the source is not trusted.
  const auto regression = std::string(test::source_dir()) +
                          "/tests/fuzz/regressions/torchscript_type_parser_terminate.pt";
  for (const auto& path : {regression, golden_file("wrapper_3_heads.pt")}) {
    INFO(path);
    CHECK_THROWS_C10(attention::load_weights(*mha, path, untrusted), c10::ValueError,
                     "is a TorchScript archive, which carries code and is refused with "
                     "LoadOptions().trusted(false)");
  }
  CHECK(unchanged(*mha, before));
  CHECK(
      attention::load_weights(*mha, golden_file("wrapper_3_heads.safetensors"), untrusted).format ==
      "safetensors");
  CHECK(attention::load_weights(*mha, golden_file("wrapper_3_heads.state_dict.pt"), untrusted)
            .format == "state_dict");
}

TEST_CASE("load_weights: files of LibTorch's torch::pickle_save still load", "[weights]") {
  // Earlier versions of save_weights wrote this: a typed dict under restore_type_tag.
  attention::CrossAttention a(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  attention::CrossAttention b(attention::CrossAttentionOptions(3, 2, 4).d_in_kv(5));
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& p : a->named_parameters()) dict.insert(p.key(), p.value().detach());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  const auto report = attention::load_weights_from_memory(*b, bytes.data(), bytes.size(),
                                                          attention::LoadOptions().trusted(false));
  CHECK(report.format == "state_dict");
  CHECK(unchanged(*b, snapshot(*a)));
}
