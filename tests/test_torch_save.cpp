// Weight files as Python users write them: torch.save(model.state_dict()), checkpoints, whole
// models, other dtypes and other codebases' layouts (files from scripts/make_weight_files.py).

#include <attention/attention.h>

#include "helpers.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <map>

using attention::LoadOptions;
using attention::MultiHeadAttention;
using attention::MultiHeadAttentionOptions;
using attention::WeightLayout;
using test::snapshot;
using test::unchanged;

namespace {

std::string weights_file(const std::string& name) {
  return std::string(test::source_dir()) + "/models/weights/" + name;
}

// "input" and "output" of <name>.expected.pt, read with LibTorch's own unpickler.
std::map<std::string, torch::Tensor> expected(const std::string& name) {
  const std::string bytes = test::read_bytes(weights_file(name + ".expected.pt"));
  std::map<std::string, torch::Tensor> out;
  for (const auto& item :
       torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// The book's MultiHeadAttention as scripts/make_weight_files.py builds it.
MultiHeadAttention book_mha() {
  torch::manual_seed(999);  // not the file's seed: every weight must come from the file
  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).context_length(6).qkv_bias(true));
  mha->eval();
  return mha;
}

void check_output(MultiHeadAttention& mha, const std::string& name) {
  const auto e = expected(name);
  torch::NoGradGuard no_grad;
  const auto output = mha(e.at("input")).output;
  INFO(name << ": max difference " << test::max_abs_diff(output, e.at("output")));
  CHECK(torch::allclose(output, e.at("output"), 1e-5, 1e-6));
}

const std::vector<std::string> kBookNames = {"W_query.weight",  "W_query.bias",   "W_key.weight",
                                             "W_key.bias",      "W_value.weight", "W_value.bias",
                                             "out_proj.weight", "out_proj.bias"};

}  // namespace

TEST_CASE("load_weights: torch.save(model.state_dict()) loads and gives Python's output",
          "[weights][torch_save]") {
  // pytorch2.6/: the same module saved by PyTorch 2.6 (64-byte aligned records, a byteorder
  // record, a serialization id).
  for (const char* file : {"book_mha.pth", "book_mha.protocol4.pth", "book_mha.parameters.pth",
                           "pytorch2.6/book_mha.pth"}) {
    INFO(file);
    for (bool trusted : {true, false}) {
      auto mha = book_mha();
      const auto report =
          attention::load_weights(*mha, weights_file(file), LoadOptions().trusted(trusted));
      CHECK(report.format == "state_dict");
      CHECK(report.loaded == kBookNames);
      CHECK(report.missing.empty());
      CHECK(report.unexpected.empty());
      // The book's causal mask buffer is derived by the C++ module (none in a parameters dict).
      CHECK(report.derived == (std::string(file) == "book_mha.parameters.pth"
                                   ? std::vector<std::string>{}
                                   : std::vector<std::string>{"mask"}));
      check_output(mha, "book_mha");
    }
  }
  // The same bytes from memory.
  const std::string bytes = test::read_bytes(weights_file("book_mha.pth"));
  auto mha = book_mha();
  attention::load_weights_from_memory(*mha, bytes.data(), bytes.size());
  check_output(mha, "book_mha");
}

TEST_CASE("load_weights: a checkpoint loads by key, and without one the error names the keys",
          "[weights][torch_save]") {
  auto mha = book_mha();
  const auto before = snapshot(*mha);
  const auto path = weights_file("checkpoint.pth");
  CHECK_THROWS_C10(attention::load_weights(*mha, path), c10::ValueError,
                   "holds a checkpoint, not a state dict; its entries: 'model_state_dict' (a "
                   "dict), 'optimizer_state_dict' (a dict), 'epoch' (an int), 'loss' (a float), "
                   "'note' (bytes), 'best' (None). Name the state dict with "
                   "LoadOptions().key(\"model_state_dict\")");
  CHECK_THROWS_C10(attention::load_weights(*mha, path, LoadOptions().key("model")), c10::ValueError,
                   "has no entry 'model'; its entries: 'model_state_dict', "
                   "'optimizer_state_dict', 'epoch', 'loss', 'note', 'best'");
  CHECK_THROWS_C10(attention::load_weights(*mha, path, LoadOptions().key("epoch")), c10::ValueError,
                   "entry 'epoch' is an int, not a state dict");
  CHECK_THROWS_C10(attention::load_weights(*mha, path, LoadOptions().key("optimizer_state_dict")),
                   c10::ValueError, "'state' (a dict), 'param_groups' (a list)");
  CHECK(unchanged(*mha, before));
  for (const auto& file : {path, weights_file("pytorch2.6/checkpoint.pth")}) {
    INFO(file);
    auto loaded = book_mha();
    const auto report = attention::load_weights(
        *loaded, file, LoadOptions().key("model_state_dict").trusted(false));
    CHECK(report.loaded == kBookNames);
    check_output(loaded, "checkpoint");
  }
}

TEST_CASE("load_weights: a Python global outside the weights-only allowlist is refused by name",
          "[weights][torch_save][errors]") {
  auto mha = book_mha();
  const auto before = snapshot(*mha);
  CHECK_THROWS_C10(attention::load_weights(*mha, weights_file("checkpoint_with_namespace.pth"),
                                           LoadOptions().key("model_state_dict")),
                   c10::Error,
                   "refers to the Python global 'argparse.Namespace', which loading "
                   "refuses");
  CHECK(unchanged(*mha, before));
}

TEST_CASE("load_weights: the pre-1.6 torch.save format is refused with how to re-save it",
          "[weights][torch_save][errors]") {
  auto mha = book_mha();
  CHECK_THROWS_C10(attention::load_weights(*mha, weights_file("book_mha.legacy.pth")),
                   c10::ValueError,
                   "is in the torch.save format of PyTorch before 1.6 "
                   "(_use_new_zipfile_serialization=False), which is not read; re-save it in "
                   "Python with torch.save(torch.load(path), path)");
}

TEST_CASE("load_weights: prefix() loads one block of a whole model", "[weights][torch_save]") {
  auto mha = book_mha();
  const auto path = weights_file("blocks.pth");
  const auto report =
      attention::load_weights(*mha, path, LoadOptions().prefix("trf_blocks.1.att."));
  CHECK(report.loaded == kBookNames);
  check_output(mha, "blocks");
  const auto before = snapshot(*mha);
  CHECK_THROWS_C10(
      attention::load_weights(*mha, path, LoadOptions().prefix("trf_blocks.7.att.")),
      c10::ValueError,
      "no name in '" + path +
          "' starts with 'trf_blocks.7.att.'; the file's prefixes: "
          "'trf_blocks.0.att.', 'trf_blocks.0.att.W_query.', 'trf_blocks.0.att.W_key.'");
  CHECK_THROWS_C10(attention::load_weights(*mha, path, LoadOptions().prefix("trf_blocks.1.")),
                   c10::ValueError, "att.out_proj.bias, ff.weight, ff.bias");
  CHECK(unchanged(*mha, before));
}

TEST_CASE("load_weights: other dtypes are refused unless cast(true), which reports each cast",
          "[weights][torch_save]") {
  for (const char* dtype : {"bfloat16", "float16", "float64"}) {
    const std::string name = std::string("book_mha.") + dtype;
    INFO(name);
    auto mha = book_mha();
    const auto before = snapshot(*mha);
    const std::string file_type = std::string(dtype) == "bfloat16"  ? "BFloat16"
                                  : std::string(dtype) == "float16" ? "Half"
                                                                    : "Double";
    CHECK_THROWS_C10(attention::load_weights(*mha, weights_file(name + ".pth")), c10::ValueError,
                     "dtype of W_query.weight: module Float, file " + file_type +
                         " (LoadOptions().cast(true) converts it)");
    CHECK(unchanged(*mha, before));
    const auto report =
        attention::load_weights(*mha, weights_file(name + ".pth"), LoadOptions().cast(true));
    CHECK(report.loaded == kBookNames);
    REQUIRE(report.casts.size() == kBookNames.size());
    CHECK(report.casts[0] == "W_query.weight: " + file_type + " -> Float");
    check_output(mha, name);
  }
}

TEST_CASE("load_weights: the layout of torch.nn.MultiheadAttention", "[weights][torch_save]") {
  auto mha = book_mha();
  const auto path = weights_file("torch_mha.pth");
  CHECK_THROWS_C10(attention::load_weights(*mha, path), c10::ValueError,
                   "unexpected in the file: in_proj_weight, in_proj_bias");
  const auto report = attention::load_weights(
      *mha, path, LoadOptions().layout(WeightLayout::TorchMultiheadAttention));
  CHECK(report.loaded == kBookNames);
  check_output(mha, "torch_mha");
}

TEST_CASE("load_weights: the layout of Hugging Face Llama, with grouped-query shapes",
          "[weights][torch_save]") {
  torch::manual_seed(999);
  MultiHeadAttention mha(
      MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2).out_bias(false).context_length(5));
  const auto report = attention::load_weights(
      *mha, weights_file("llama_gqa.pth"),
      LoadOptions().prefix("model.layers.0.self_attn.").layout(WeightLayout::Llama));
  CHECK(report.loaded == std::vector<std::string>{"W_query.weight", "W_key.weight",
                                                  "W_value.weight", "out_proj.weight"});
  check_output(mha, "llama_gqa");
}

TEST_CASE("load_weights: the layout of GPT-2, fused and transposed as its Conv1D stores it",
          "[weights][torch_save]") {
  const auto path = weights_file("gpt2.pth");
  for (const auto& file : {path, weights_file("pytorch2.6/gpt2.pth")}) {
    INFO(file);
    auto mha = book_mha();
    const auto report = attention::load_weights(
        *mha, file, LoadOptions().prefix("h.1.attn.").layout(WeightLayout::GPT2));
    CHECK(report.loaded == kBookNames);
    CHECK(report.derived == std::vector<std::string>{"bias", "masked_bias"});
    check_output(mha, "gpt2");
  }
  // The MLP's c_proj has no c_attn beside it: it keeps its name.
  auto other = book_mha();
  const auto block = attention::load_weights(
      *other, path, LoadOptions().prefix("h.1.").layout(WeightLayout::GPT2).strict(false));
  CHECK(block.missing == kBookNames);
  CHECK(block.unexpected ==
        std::vector<std::string>{"attn.W_query.weight", "attn.W_key.weight", "attn.W_value.weight",
                                 "attn.W_query.bias", "attn.W_key.bias", "attn.W_value.bias",
                                 "attn.out_proj.weight", "attn.out_proj.bias", "mlp.c_fc.weight",
                                 "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"});
}

TEST_CASE("load_weights: rename() by rules or by a function", "[weights][torch_save]") {
  const auto path = weights_file("llama_gqa.pth");
  auto make = [] {
    torch::manual_seed(999);
    return MultiHeadAttention(
        MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2).out_bias(false).context_length(5));
  };
  auto by_rules = make();
  attention::load_weights(*by_rules, path,
                          LoadOptions().rename({{"^model\\.layers\\.0\\.self_attn\\.", ""},
                                                {"^q_proj", "W_query"},
                                                {"^k_proj", "W_key"},
                                                {"^v_proj", "W_value"},
                                                {"^o_proj", "out_proj"}}));
  check_output(by_rules, "llama_gqa");
  auto by_function = make();
  attention::load_weights(
      *by_function, path,
      LoadOptions()
          .prefix("model.layers.0.")
          .rename([](const std::string& n) { return n.substr(std::string("self_attn.").size()); })
          .layout(WeightLayout::Llama));
  check_output(by_function, "llama_gqa");

  const auto before = snapshot(*by_function);
  CHECK_THROWS_C10(LoadOptions().rename({{"(", ""}}), c10::ValueError,
                   "attention::LoadOptions::rename: '(' is not a valid regular expression");
  CHECK_THROWS_C10(
      attention::load_weights(*by_function, path, LoadOptions().rename({{"[qk]_proj", "x"}})),
      c10::ValueError,
      "rename maps both 'model.layers.0.self_attn.q_proj.weight' and "
      "'model.layers.0.self_attn.k_proj.weight' to 'model.layers.0.self_attn.x.weight'");
  CHECK_THROWS_C10(
      attention::load_weights(*by_function, path, LoadOptions().rename([](const std::string&) {
        return std::string();
      })),
      c10::ValueError, "rename maps 'model.layers.0.self_attn.q_proj.weight' to an empty name");
  // Whatever the caller's function throws leaves as a c10::Error naming the name, the module as
  // it was.
  CHECK_THROWS_C10(
      attention::load_weights(*by_function, path, LoadOptions().rename([](const std::string& n) {
        if (n.find("k_proj") != std::string::npos) throw std::out_of_range("no key here");
        return n;
      })),
      c10::Error,
      "the rename function threw on 'model.layers.0.self_attn.k_proj.weight': no key here");
  CHECK_THROWS_C10(
      attention::load_weights(
          *by_function, path,
          LoadOptions().rename([](const std::string&) -> std::string { throw 42; })),
      c10::Error,
      "the rename function threw on 'model.layers.0.self_attn.q_proj.weight': an exception of a "
      "type not derived from std::exception");
  CHECK(unchanged(*by_function, before));
}

TEST_CASE("load_weights: a torch.save file with any byte changed loads the same values or fails",
          "[weights][torch_save][errors]") {
  const std::string bytes = test::read_bytes(weights_file("book_mha.pth"));
  auto reference = book_mha();
  attention::load_weights_from_memory(*reference, bytes.data(), bytes.size());
  const auto good = snapshot(*reference);
  auto mha = book_mha();
  const auto before = snapshot(*mha);
  int64_t accepted = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string changed = bytes;
    changed[i] = static_cast<char>(changed[i] ^ 0x5a);
    try {
      attention::load_weights_from_memory(*mha, changed.data(), changed.size());
      ++accepted;
      INFO("byte " << i);
      REQUIRE(unchanged(*mha, good));  // a field no reader depends on (a date, a version)
      torch::NoGradGuard no_grad;
      for (std::size_t p = 0; p < before.size(); ++p) mha->parameters()[p].copy_(before[p]);
    } catch (const c10::Error&) {
      REQUIRE(unchanged(*mha, before));
    }
  }
  // Accepted changes lie in fields no reader needs (dates, versions, alignment padding); every
  // byte of the pickle and the storages is covered by a CRC-32.
  INFO(accepted << " of " << bytes.size() << " changed files accepted");
  CHECK(accepted < static_cast<int64_t>(bytes.size()));
}

TEST_CASE("load_weights: the book's chapter 3 CausalAttention and its MultiHeadAttentionWrapper",
          "[weights][torch_save]") {
  // CausalAttention(d_in=8, d_out=4, context_length=6, dropout=0.5, qkv_bias=True): one head,
  // no output projection, the mask buffer derived.
  torch::manual_seed(999);
  MultiHeadAttention causal(MultiHeadAttentionOptions(8, 4, 1)
                                .context_length(6)
                                .dropout(0.5)
                                .qkv_bias(true)
                                .output_projection(false));
  causal->eval();
  const auto report = attention::load_weights(*causal, weights_file("book_causal_attention.pth"));
  CHECK(report.loaded == std::vector<std::string>{"W_query.weight", "W_query.bias", "W_key.weight",
                                                  "W_key.bias", "W_value.weight", "W_value.bias"});
  CHECK(report.derived == std::vector<std::string>{"mask"});
  check_output(causal, "book_causal_attention");

  // MultiHeadAttentionWrapper(d_in=8, d_out=3, context_length=6, dropout=0.5, num_heads=3): the
  // heads' projections concatenated into one module of three heads.
  MultiHeadAttention wrapper(
      MultiHeadAttentionOptions(8, 9, 3).context_length(6).dropout(0.5).output_projection(false));
  wrapper->eval();
  const auto path = weights_file("book_wrapper.pth");
  CHECK_THROWS_C10(attention::load_weights(*wrapper, path), c10::ValueError,
                   "unexpected in the file: heads.0.mask, heads.0.W_query.weight");
  const auto heads = attention::load_weights(
      *wrapper, path, LoadOptions().layout(WeightLayout::BookMultiHeadAttentionWrapper));
  CHECK(heads.loaded ==
        std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight"});
  CHECK(heads.derived == std::vector<std::string>{"heads.0.mask", "heads.1.mask", "heads.2.mask"});
  check_output(wrapper, "book_wrapper");

  // A head missing from the file is named.
  CHECK_THROWS_C10(attention::load_weights(*wrapper, path,
                                           LoadOptions()
                                               .layout(WeightLayout::BookMultiHeadAttentionWrapper)
                                               .rename({{"^heads\\.1\\.W_key", "heads.1.other"}})),
                   c10::ValueError, "heads.1.W_key.weight is missing");
}
