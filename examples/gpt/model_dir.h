#pragma once

// A model directory as examples/gpt/train.py writes it: config.json (the sizes and the
// vocabulary) and model.pth (torch.save(model.state_dict())), shared by the gpt and gpt-serve
// programs.

#include "gpt_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace gpt {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The model's sizes and its vocabulary (one character per token id).
struct ModelDir {
  Config config;
  std::string vocab;
};

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
  out.vocab = json.at("vocab");
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
