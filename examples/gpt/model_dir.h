#pragma once

// A model directory as examples/gpt/train.py (or chapter4.py) writes it: config.json (the sizes
// and the vocabulary) and model.pth (torch.save(model.state_dict())), shared by the gpt and
// gpt-serve programs.

#include "gpt_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpt {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The model's sizes and its vocabulary: token id i is the i-th character of config.json's
/// "vocab", a UTF-8 string (vocab[i] holds that character's bytes).
struct ModelDir {
  Config config;
  std::vector<std::string> vocab;
};

/// The characters of a UTF-8 string, each as its bytes.
inline std::vector<std::string> utf8_characters(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t length = 1;  // continuation bytes are 10xxxxxx
    while (i + length < text.size() &&
           (static_cast<unsigned char>(text[i + length]) & 0xC0) == 0x80)
      ++length;
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

inline ModelDir read_config(const std::string& dir) {
  const auto json = nlohmann::json::parse(read_file(dir + "/config.json"));
  ModelDir out;
  out.config.vocab_size = json.at("vocab_size");
  out.config.context_length = json.at("context_length");
  out.config.emb_dim = json.at("emb_dim");
  out.config.n_heads = json.at("n_heads");
  out.config.n_layers = json.at("n_layers");
  out.config.drop_rate = json.at("drop_rate");
  out.config.qkv_bias = json.at("qkv_bias");
  // The sizes of a chapter-4 mechanism (examples/gpt/chapter4.py writes them with its name).
  out.config.attention = attention_named(json.value("attention", "mha"));
  out.config.latent_dim = json.value("latent_dim", int64_t{0});
  out.config.index_n_heads = json.value("index_n_heads", int64_t{0});
  out.config.index_head_dim = json.value("index_head_dim", int64_t{0});
  out.config.topk = json.value("topk", int64_t{0});
  out.config.n_kv_producing_layers = json.value("n_kv_producing_layers", int64_t{0});
  out.vocab = utf8_characters(json.at("vocab").get<std::string>());
  return out;
}

/// The model of `config` with model.pth's weights, in evaluation mode.
inline GPTModel load_model(const std::string& dir, const Config& config) {
  GPTModel model(config);
  const auto report = attention::load_weights(*model, dir + "/model.pth");
  model->eval();
  fmt::print("loaded {} tensors from model.pth (derived, skipped: {})\n", report.loaded.size(),
             report.derived.size());
  return model;
}

}  // namespace gpt
