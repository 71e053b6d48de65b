// The names of a Hugging Face checkpoint of a model of the book's chapter-5 zoo, under the book's
// class for that model as this library builds it (WeightLayout::HuggingFace*; examples/zoo): the
// mapping of the book's load_weights_into_<model> functions, written as one table per family.

#include "hugging_face_names.h"

#include "weight_names.h"

#include <c10/util/Exception.h>

#include <array>
#include <regex>
#include <utility>

namespace attention {
namespace detail {
namespace {

struct Family {
  const char* blocks;    // the container of the decoder layers
  bool scale;            // norms' weights named `scale` (the book's Qwen3 and Gemma 3)
  bool pre_norms;        // input_layernorm -> norm1, post_attention_layernorm -> norm2
  bool hf_feed_forward;  // mlp.gate_proj etc. kept (Gemma 4)
  bool token_mixer;      // self_attn and linear_attn -> token_mixer (Qwen3.5)
};

Family family_of(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::HuggingFaceLlama:
      return {"trf_blocks", false, true, false, false};
    case WeightLayout::HuggingFaceQwen3:
      return {"trf_blocks", true, true, false, false};
    case WeightLayout::HuggingFaceGemma3:
      return {"blocks", true, false, false, false};
    case WeightLayout::HuggingFaceOlmo3:
      return {"blocks", false, false, false, false};
    case WeightLayout::HuggingFaceCohere2:
      return {"trf_blocks", false, false, false, false};
    case WeightLayout::HuggingFaceQwen3_5:
      return {"trf_blocks", false, true, false, true};
    case WeightLayout::HuggingFaceGemma4:
      return {"blocks", false, false, true, false};
    default:
      break;
  }
  TORCH_CHECK(false, "attention: not a Hugging Face layout");
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// `name` with its leading `from` replaced by `to`, when it starts so.
bool replace_start(std::string& name, const std::string& from, const std::string& to) {
  if (!starts_with(name, from)) return false;
  name = to + name.substr(from.size());
  return true;
}

}  // namespace

bool is_hugging_face(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::HuggingFaceLlama:
    case WeightLayout::HuggingFaceQwen3:
    case WeightLayout::HuggingFaceGemma3:
    case WeightLayout::HuggingFaceOlmo3:
    case WeightLayout::HuggingFaceCohere2:
    case WeightLayout::HuggingFaceQwen3_5:
    case WeightLayout::HuggingFaceGemma4:
      return true;
    default:
      return false;
  }
}

bool zero_centred_norms(WeightLayout layout) {
  return layout == WeightLayout::HuggingFaceGemma3 || layout == WeightLayout::HuggingFaceQwen3_5;
}

std::vector<FileTensor> from_hugging_face(NamedTensors file, WeightLayout layout,
                                          const std::string& source) {
  const Family f = family_of(layout);
  // The prefixes of text and multimodal checkpoints, the longest first.
  static const std::array<const char*, 3> prefixes = {"model.language_model.", "language_model.",
                                                      "model."};
  bool head = false;
  torch::Tensor embedding;
  std::vector<FileTensor> out;
  for (auto& [original, tensor] : file) {
    std::string name = original;
    for (const char* prefix : prefixes) {
      if (replace_start(name, prefix, "")) break;
    }
    static const std::regex layer(R"(layers\.(\d+)\.(.+))");
    std::smatch m;
    if (name == "lm_head.weight") {
      name = "out_head.weight";
      head = true;
    } else if (name == "embed_tokens.weight") {
      name = "tok_emb.weight";
      embedding = tensor;
    } else if (name == "norm.weight") {
      name = std::string("final_norm.") + (f.scale ? "scale" : "weight");
    } else if (std::regex_match(name, m, layer)) {
      std::string rest = m[2];
      // The attention's projections under this library's names; everything else of self_attn
      // (its norms) keeps its own.
      static const std::array<std::pair<const char*, const char*>, 4> projections = {
          {{"q_proj.", "W_query."},
           {"k_proj.", "W_key."},
           {"v_proj.", "W_value."},
           {"o_proj.", "out_proj."}}};
      const std::string mixer = f.token_mixer ? "token_mixer." : "att.";
      if (replace_start(rest, "self_attn.", mixer)) {
        for (const auto& [from, to] : projections) {
          if (replace_start(rest, mixer + from, mixer + to)) break;
        }
      } else if (f.token_mixer) {
        replace_start(rest, "linear_attn.", "token_mixer.");
      }
      if (!f.hf_feed_forward) {
        replace_start(rest, "mlp.gate_proj.", "ff.fc1.") ||
            replace_start(rest, "mlp.up_proj.", "ff.fc2.") ||
            replace_start(rest, "mlp.down_proj.", "ff.fc3.");
      }
      if (f.pre_norms) {
        replace_start(rest, "input_layernorm.", "norm1.") ||
            replace_start(rest, "post_attention_layernorm.", "norm2.");
      }
      // A norm's weight under the book's name (a linear-attention layer's gated norm keeps
      // `weight`, as the book's class does).
      const bool norm = rest.size() > 7 && rest.compare(rest.size() - 7, 7, ".weight") == 0 &&
                        (rest.find("norm") != std::string::npos) &&
                        !starts_with(rest, "token_mixer.norm.");
      if (f.scale && norm) rest = rest.substr(0, rest.size() - 6) + "scale";
      name = std::string(f.blocks) + "." + std::string(m[1]) + "." + rest;
    }
    out.push_back({name, {tensor}});
  }
  // A tied head: the embedding serves as out_head too, as the book's loaders do.
  if (!head && embedding.defined()) out.push_back({"out_head.weight", {embedding}});
  (void)source;
  return out;
}

}  // namespace detail
}  // namespace attention
