// Checkpoints as Hugging Face publishes today's models: sharded over several safetensors files
// with a model.safetensors.index.json, under Hugging Face's names (WeightLayout::HuggingFace*).
// A sharded load gives what one file gives; a bad index is refused by name with the module as it
// was; each layout maps a checkpoint onto the book's model as examples/zoo builds it, a tied head
// included; norms of the other kind (zero-centred or plain) are refused.

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using attention::LoadOptions;
using attention::NamedTensors;
using attention::WeightLayout;

// A fresh folder for one test's files.
std::string folder(const std::string& name) {
  const auto path = fs::temp_directory_path() / ("attention-checkpoints-" + name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path.string();
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Shards of `tensors` (the first `split` in the first file) and their index.
std::string write_sharded(const std::string& dir, const NamedTensors& tensors, size_t split) {
  const NamedTensors first(tensors.begin(), tensors.begin() + static_cast<long>(split));
  const NamedTensors second(tensors.begin() + static_cast<long>(split), tensors.end());
  write(dir + "/model-00001-of-00002.safetensors", attention::serialize_safetensors(first));
  write(dir + "/model-00002-of-00002.safetensors", attention::serialize_safetensors(second));
  std::string map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    map += (i ? ", " : "") + std::string("\"") + tensors[i].first + "\": \"model-0000" +
           (i < split ? "1" : "2") + "-of-00002.safetensors\"";
  }
  const std::string index = dir + "/model.safetensors.index.json";
  write(index, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" + map + "}}");
  return index;
}

NamedTensors tensors_of(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value().detach());
  return out;
}

// A book-style model of two blocks, its names those examples/zoo gives Qwen3 (or Gemma 3, with
// `blocks`, the four sandwich norms and zero-centred ones).
struct TinyModel : torch::nn::Module {
  TinyModel(bool gemma, attention::NormKind kind) {
    const auto scale = attention::NormParameter::Scale;
    const auto norm = [&](int64_t n) {
      return attention::Norm(attention::NormOptions(n).kind(kind).parameter_name(scale));
    };
    register_module("tok_emb", torch::nn::Embedding(10, 8));
    auto blocks = register_module(gemma ? "blocks" : "trf_blocks", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      auto block = std::make_shared<torch::nn::Module>();
      block->register_module(
          "att",
          attention::MultiHeadAttention(
              attention::MultiHeadAttentionOptions(8, 8, 2).head_dim(4).out_bias(false).qk_norm(
                  attention::HeadNormOptions().kind(kind).parameter_name(scale))));
      auto ff = std::make_shared<torch::nn::Module>();
      for (const char* name : {"fc1", "fc2"}) {
        ff->register_module(name, torch::nn::Linear(torch::nn::LinearOptions(8, 16).bias(false)));
      }
      ff->register_module("fc3", torch::nn::Linear(torch::nn::LinearOptions(16, 8).bias(false)));
      block->register_module("ff", ff);
      const std::vector<std::string> norms =
          gemma
              ? std::vector<std::string>{"input_layernorm", "post_attention_layernorm",
                                         "pre_feedforward_layernorm", "post_feedforward_layernorm"}
              : std::vector<std::string>{"norm1", "norm2"};
      for (const auto& name : norms) block->register_module(name, norm(8));
      blocks->push_back(block);
    }
    register_module("final_norm", norm(8));
    register_module("out_head", torch::nn::Linear(torch::nn::LinearOptions(8, 10).bias(false)));
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.uniform_(-1, 1);
  }
};

// The Hugging Face names of a TinyModel's tensors, as the book's loaders read them.
NamedTensors hugging_face_names(const TinyModel& model, bool gemma, bool tied) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors_of(model)) {
    std::string hf = name;
    const auto replace = [&](const std::string& from, const std::string& to) {
      const auto at = hf.find(from);
      if (at != std::string::npos) hf.replace(at, from.size(), to);
    };
    replace(gemma ? "blocks." : "trf_blocks.", "model.layers.");
    replace("att.W_query", "self_attn.q_proj");
    replace("att.W_key", "self_attn.k_proj");
    replace("att.W_value", "self_attn.v_proj");
    replace("att.out_proj", "self_attn.o_proj");
    replace("att.", "self_attn.");
    replace("ff.fc1", "mlp.gate_proj");
    replace("ff.fc2", "mlp.up_proj");
    replace("ff.fc3", "mlp.down_proj");
    replace("norm1.", "input_layernorm.");
    replace("norm2.", "post_attention_layernorm.");
    replace("tok_emb", "model.embed_tokens");
    replace("final_norm", "model.norm");
    replace("out_head", "lm_head");
    replace(".scale", ".weight");
    if (tied && hf == "lm_head.weight") continue;
    out.emplace_back(hf, tensor);
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoints: a sharded checkpoint loads as one file does", "[checkpoints][weights]") {
  const std::string dir = folder("sharded");
  torch::manual_seed(1);
  attention::MultiHeadAttention source(attention::MultiHeadAttentionOptions(8, 8, 2).head_dim(6));
  attention::MultiHeadAttention target(attention::MultiHeadAttentionOptions(8, 8, 2).head_dim(6));
  const auto index = write_sharded(dir, tensors_of(*source), 3);
  const auto report = attention::load_weights(*target, index);
  CHECK(report.format == "safetensors");
  CHECK(report.loaded.size() == 5);  // three projections, out_proj's weight and bias
  for (const auto& p : source->named_parameters()) {
    CHECK(torch::equal(p.value(), target->named_parameters()[p.key()]));
  }
}

TEST_CASE("checkpoints: a bad index is refused by name, the module as it was",
          "[checkpoints][weights][errors]") {
  const std::string dir = folder("bad");
  torch::manual_seed(2);
  attention::MultiHeadAttention source(attention::MultiHeadAttentionOptions(8, 8, 2));
  attention::MultiHeadAttention target(attention::MultiHeadAttentionOptions(8, 8, 2));
  const auto before = test::snapshot(*target);
  const auto tensors = tensors_of(*source);
  const std::string index = write_sharded(dir, tensors, 3);
  const auto refused = [&](const std::string& json, const std::string& fragment,
                           const LoadOptions& options = {}) {
    const std::string path = dir + "/bad.index.json";
    write(path, json);
    CHECK_THROWS_C10(attention::load_weights(*target, path, options), c10::Error, fragment);
    CHECK(test::unchanged(*target, before));
  };
  refused("{\"weight_map\": ", "is not a JSON index");
  refused("[1, 2]", "has no \"weight_map\" object");
  refused("{\"weight_map\": {\"W_query.weight\": 3}}",
          "the file of 'W_query.weight' is not a string");
  for (const char* escape : {"../model-00001-of-00002.safetensors", "/etc/passwd", "..", "a/b"}) {
    refused(std::string("{\"weight_map\": {\"W_query.weight\": \"") + escape + "\"}}",
            "': expected a file name beside the index");
  }
  // The index gives a tensor to the other shard, or names one its shard lacks.
  refused(
      "{\"weight_map\": {\"W_query.weight\": \"model-00002-of-00002.safetensors\", "
      "\"W_key.weight\": \"model-00001-of-00002.safetensors\"}}",
      "shard 'model-00001-of-00002.safetensors' holds 'W_query.weight', which the index gives "
      "shard 'model-00002-of-00002.safetensors'");
  write(dir + "/lonely.safetensors", attention::serialize_safetensors({tensors[0]}));
  refused(
      "{\"weight_map\": {\"W_query.weight\": \"lonely.safetensors\", \"W_key.weight\": "
      "\"lonely.safetensors\"}}",
      "names 'W_key.weight' in shard 'lonely.safetensors', which lacks it");
  refused("{\"weight_map\": {\"W_query.weight\": \"missing.safetensors\"}}", "missing.safetensors");
  CHECK_THROWS_C10(attention::load_weights(*target, index, LoadOptions().key("model_state_dict")),
                   c10::ValueError,
                   "is a sharded checkpoint's index: its shards hold tensors alone");
  // Shards of two formats.
  attention::save_weights(*source, dir + "/whole.pt");
  refused(
      "{\"weight_map\": {\"W_query.weight\": \"lonely.safetensors\", \"W_key.weight\": "
      "\"whole.pt\"}}",
      "is state_dict, the others safetensors");
  CHECK(test::unchanged(*target, before));
}

TEST_CASE("checkpoints: Hugging Face names load onto the book's model, a tied head included",
          "[checkpoints][weights][zoo]") {
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    const std::string dir = folder(tied ? "qwen3-tied" : "qwen3");
    torch::manual_seed(3);
    TinyModel source(false, attention::NormKind::RMS), target(false, attention::NormKind::RMS);
    auto checkpoint = hugging_face_names(source, false, tied);
    if (tied) {
      torch::NoGradGuard no_grad;
      source.named_parameters()["out_head.weight"].copy_(
          source.named_parameters()["tok_emb.weight"].t().t());
      checkpoint = hugging_face_names(source, false, tied);
    }
    const auto index = write_sharded(dir, checkpoint, checkpoint.size() / 2);
    attention::load_weights(target, index, LoadOptions().layout(WeightLayout::HuggingFaceQwen3));
    for (const auto& p : source.named_parameters()) {
      INFO(p.key());
      CHECK(torch::equal(p.value(), target.named_parameters()[p.key()]));
    }
  }
}

TEST_CASE("checkpoints: norms of the other kind are refused by name",
          "[checkpoints][weights][zoo][errors]") {
  // Gemma 3's checkpoints store zero-centred norms; a module of plain RMSNorms would scale every
  // feature by w instead of 1 + w. And the other way round for Qwen3's.
  const std::string dir = folder("kinds");
  torch::manual_seed(4);
  TinyModel gemma_source(true, attention::NormKind::ZeroCenteredRMS);
  TinyModel plain(true, attention::NormKind::RMS),
      centred(true, attention::NormKind::ZeroCenteredRMS);
  const auto index = write_sharded(dir, hugging_face_names(gemma_source, true, false), 5);
  const auto before = test::snapshot(plain);
  CHECK_THROWS_C10(
      attention::load_weights(plain, index, LoadOptions().layout(WeightLayout::HuggingFaceGemma3)),
      c10::ValueError,
      "blocks.0.att.q_norm.scale: the checkpoint stores zero-centred (1 + w) norm weights, and the "
      "module's blocks.0.att.q_norm is not zero-centred");
  CHECK(test::unchanged(plain, before));
  CHECK_NOTHROW(attention::load_weights(centred, index,
                                        LoadOptions().layout(WeightLayout::HuggingFaceGemma3)));
  // A norm of a size that fits no head: the checkpoint's q_norm over 6 features, the heads' 4.
  auto wrong = hugging_face_names(gemma_source, true, false);
  for (auto& [name, tensor] : wrong) {
    if (name == "model.layers.1.self_attn.q_norm.weight") tensor = torch::zeros({6});
  }
  const auto before_centred = test::snapshot(centred);
  CHECK_THROWS_C10(attention::load_weights(centred, write_sharded(folder("kinds-size"), wrong, 5),
                                           LoadOptions().layout(WeightLayout::HuggingFaceGemma3)),
                   c10::ValueError, "shape of blocks.1.att.q_norm.scale: module (4,), file (6,)");
  CHECK(test::unchanged(centred, before_centred));
  const std::string qwen_dir = folder("kinds-qwen");
  TinyModel qwen_source(false, attention::NormKind::RMS),
      qwen_centred(false, attention::NormKind::ZeroCenteredRMS);
  const auto qwen_index = write_sharded(qwen_dir, hugging_face_names(qwen_source, false, false), 5);
  CHECK_THROWS_C10(attention::load_weights(qwen_centred, qwen_index,
                                           LoadOptions().layout(WeightLayout::HuggingFaceQwen3)),
                   c10::ValueError,
                   "the checkpoint stores plain (not zero-centred) norm weights, and the module's "
                   "trf_blocks.0.att.q_norm is zero-centred (NormKind::ZeroCenteredRMS)");
}
