#include "weight_names.h"

#include "hugging_face_names.h"

#include "serialization/limits.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>

#include <map>
#include <regex>
#include <set>

namespace attention {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// "blocks.0.attn.c_attn.weight" -> {"blocks.0.attn.", "c_attn", "weight"}; names with fewer than
// two components have an empty module part.
struct NameParts {
  std::string parent;  // with its trailing '.', or ""
  std::string module;
  std::string leaf;
};
NameParts split_name(const std::string& name) {
  const auto last = name.rfind('.');
  if (last == std::string::npos) return {"", "", name};
  const auto before = name.rfind('.', last == 0 ? 0 : last - 1);
  if (before == std::string::npos || last == 0) {
    return {"", name.substr(0, last), name.substr(last + 1)};
  }
  return {name.substr(0, before + 1), name.substr(before + 1, last - before - 1),
          name.substr(last + 1)};
}

const char* layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::Native:
      return "Native";
    case WeightLayout::TorchMultiheadAttention:
      return "TorchMultiheadAttention";
    case WeightLayout::Llama:
      return "Llama";
    case WeightLayout::GPT2:
      return "GPT2";
    case WeightLayout::BookMultiHeadAttentionWrapper:
      return "BookMultiHeadAttentionWrapper";
    case WeightLayout::HuggingFaceLlama:
      return "HuggingFaceLlama";
    case WeightLayout::HuggingFaceQwen3:
      return "HuggingFaceQwen3";
    case WeightLayout::HuggingFaceGemma3:
      return "HuggingFaceGemma3";
    case WeightLayout::HuggingFaceOlmo3:
      return "HuggingFaceOlmo3";
    case WeightLayout::HuggingFaceCohere2:
      return "HuggingFaceCohere2";
    case WeightLayout::HuggingFaceQwen3_5:
      return "HuggingFaceQwen3_5";
    case WeightLayout::HuggingFaceGemma4:
      return "HuggingFaceGemma4";
  }
  return "unknown";
}

// Splits a fused (3 n, ...) tensor along `dim` into the query, key and value parts.
void split_three(std::vector<detail::FileTensor>& out, const std::string& name,
                 const torch::Tensor& fused, int64_t dim, int64_t rank, const std::string& parent,
                 const std::string& leaf, WeightLayout layout, const std::string& source) {
  TORCH_CHECK_VALUE(fused.dim() == rank && fused.size(dim) % 3 == 0, detail::kLoadWeights, ": '",
                    source, "': ", name, " has shape ", fused.sizes(), "; the ",
                    layout_name(layout), " layout expects ", rank, " dimensions, dimension ", dim,
                    " holding query, key and value (a multiple of 3)");
  const auto parts = fused.chunk(3, dim);
  const char* names[] = {"W_query.", "W_key.", "W_value."};
  for (int i = 0; i < 3; ++i) out.push_back({parent + names[i] + leaf, {parts[i]}});
}

// "heads.<i>.<rest>" -> i (one to six digits) and rest (not empty, no line break); false for any
// other name. Read by hand, not by a regular expression: the names come from the file.
bool head_entry(const std::string& name, int64_t& index, std::string& rest) {
  static const std::string kHeads = "heads.";
  if (!starts_with(name, kHeads)) return false;
  std::size_t at = kHeads.size();
  int64_t value = 0;
  while (at < name.size() && at - kHeads.size() < 6 && name[at] >= '0' && name[at] <= '9') {
    value = value * 10 + (name[at++] - '0');
  }
  const std::size_t digits = at - kHeads.size();
  if (digits == 0 || at + 1 >= name.size() || name[at] != '.') return false;
  if (name.find_first_of("\r\n", at + 1) != std::string::npos) return false;
  index = value;
  rest = name.substr(at + 1);
  return true;
}

// The book's wrapper: the heads' projections concatenated, in head order, along the output
// features. The parts are checked to agree here; the concatenation waits for the module's check.
std::vector<detail::FileTensor> concatenate_heads(NamedTensors file, const std::string& source,
                                                  std::vector<std::string>& derived) {
  std::vector<std::string> order;  // "W_query.weight", ... in the file's order
  std::map<std::string, std::map<int64_t, torch::Tensor>> parts;
  std::set<int64_t> heads;
  std::vector<detail::FileTensor> out;
  for (auto& [name, tensor] : file) {
    int64_t index = 0;
    std::string rest;
    if (!head_entry(name, index, rest)) {
      out.push_back({std::move(name), {std::move(tensor)}});
      continue;
    }
    heads.insert(index);
    if (rest == "mask") {
      derived.push_back(name);
      continue;
    }
    if (!parts.count(rest)) order.push_back(rest);
    parts[rest][index] = std::move(tensor);
  }
  for (const auto& rest : order) {
    const auto& by_head = parts.at(rest);
    std::vector<torch::Tensor> tensors;
    for (int64_t h = 0; h < static_cast<int64_t>(heads.size()); ++h) {
      auto it = by_head.find(h);
      TORCH_CHECK_VALUE(it != by_head.end(), detail::kLoadWeights, ": '", source, "': the ",
                        layout_name(WeightLayout::BookMultiHeadAttentionWrapper),
                        " layout needs heads 0 to ", heads.size() - 1, " each with ", rest,
                        "; heads.", h, ".", rest, " is missing");
      const torch::Tensor& first = tensors.empty() ? it->second : tensors.front();
      const torch::Tensor& part = it->second;
      TORCH_CHECK_VALUE(part.dim() >= 1 && part.dim() == first.dim() &&
                            part.sizes().slice(1) == first.sizes().slice(1),
                        detail::kLoadWeights, ": '", source, "': the heads' ", rest,
                        " differ in shape beyond their first dimension");
      TORCH_CHECK_VALUE(part.scalar_type() == first.scalar_type(), detail::kLoadWeights, ": '",
                        source, "': the heads' ", rest, " differ in dtype");
      tensors.push_back(part);
    }
    out.push_back({rest, std::move(tensors)});
  }
  return out;
}

}  // namespace

namespace detail {

std::vector<int64_t> FileTensor::sizes() const {
  std::vector<int64_t> out = parts.front().sizes().vec();
  for (std::size_t i = 1; i < parts.size(); ++i) out[0] += parts[i].size(0);
  return out;
}

c10::ScalarType FileTensor::scalar_type() const {
  return parts.front().scalar_type();
}

torch::Tensor FileTensor::value() const {
  return parts.size() == 1 ? parts.front() : torch::cat(parts, 0);
}

NamedTensors select_prefix(NamedTensors file, const std::string& prefix,
                           const std::string& source) {
  if (prefix.empty()) return file;
  NamedTensors out;
  std::vector<std::string> prefixes;
  std::set<std::string> seen;
  for (auto& [name, tensor] : file) {
    if (starts_with(name, prefix) && name.size() > prefix.size()) {
      out.emplace_back(name.substr(prefix.size()), std::move(tensor));
    }
    const auto last = name.rfind('.');
    const std::string module = last == std::string::npos ? "" : name.substr(0, last + 1);
    if (!module.empty() && seen.insert(module).second) prefixes.push_back("'" + module + "'");
  }
  if (out.empty()) {
    constexpr std::size_t kShown = 40;
    const std::size_t more = prefixes.size() > kShown ? prefixes.size() - kShown : 0;
    prefixes.resize(std::min(prefixes.size(), kShown));
    TORCH_CHECK_VALUE(
        false, detail::kLoadWeights, ": no name in '", source, "' starts with '", prefix,
        "'; the file's prefixes: ",
        prefixes.empty() ? std::string("none") : fmt::format("{}", fmt::join(prefixes, ", ")),
        more ? fmt::format(" and {} more", more) : std::string());
  }
  return out;
}

NamedTensors rename_all(NamedTensors file, const LoadOptions::NameMap& map,
                        const std::string& source) {
  if (!map) return file;
  NamedTensors out;
  out.reserve(file.size());
  std::map<std::string, std::string> origin;
  for (auto& [name, tensor] : file) {
    // The caller's function: whatever it throws leaves as a c10::Error naming the file and the
    // name (a c10::Error of its own as it is); nothing of the module has changed yet.
    std::string renamed;
    try {
      renamed = map(name);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, detail::kLoadWeights, ": '", source, "': the rename function threw on '",
                  name, "': ", e.what());
    } catch (...) {
      TORCH_CHECK(false, detail::kLoadWeights, ": '", source, "': the rename function threw on '",
                  name, "': an exception of a type not derived from std::exception");
    }
    TORCH_CHECK_VALUE(!renamed.empty(), detail::kLoadWeights, ": '", source, "': rename maps '",
                      name, "' to an empty name");
    auto [it, inserted] = origin.emplace(renamed, name);
    TORCH_CHECK_VALUE(inserted, detail::kLoadWeights, ": '", source, "': rename maps both '",
                      it->second, "' and '", name, "' to '", renamed, "'");
    out.emplace_back(std::move(renamed), std::move(tensor));
  }
  return out;
}

std::vector<FileTensor> convert_layout(NamedTensors file, WeightLayout layout,
                                       const std::string& source,
                                       std::vector<std::string>& derived) {
  if (layout == WeightLayout::BookMultiHeadAttentionWrapper) {
    return concatenate_heads(std::move(file), source, derived);
  }
  if (is_hugging_face(layout)) return from_hugging_face(std::move(file), layout, source);
  std::vector<FileTensor> out;
  out.reserve(file.size());
  if (layout == WeightLayout::Native) {
    for (auto& [name, tensor] : file) out.push_back({std::move(name), {std::move(tensor)}});
    return out;
  }
  std::set<std::string> names;
  for (const auto& item : file) names.insert(item.first);
  for (const auto& [name, tensor] : file) {
    const NameParts n = split_name(name);
    const std::string module_path = n.parent + (n.module.empty() ? "" : n.module + ".");
    switch (layout) {
      case WeightLayout::TorchMultiheadAttention: {
        // nn.MultiheadAttention registers its fused projection directly on itself.
        if (n.leaf == "in_proj_weight" || n.leaf == "in_proj_bias") {
          const bool weight = n.leaf == "in_proj_weight";
          split_three(out, name, tensor, 0, weight ? 2 : 1, module_path, weight ? "weight" : "bias",
                      layout, source);
          continue;
        }
        if (n.leaf == "q_proj_weight" || n.leaf == "k_proj_weight" || n.leaf == "v_proj_weight") {
          const char* target = n.leaf[0] == 'q'   ? "W_query"
                               : n.leaf[0] == 'k' ? "W_key"
                                                  : "W_value";
          out.push_back({module_path + target + ".weight", {tensor}});
          continue;
        }
        TORCH_CHECK_VALUE(n.leaf != "bias_k" && n.leaf != "bias_v", detail::kLoadWeights, ": '",
                          source, "': ", name,
                          " comes from nn.MultiheadAttention(add_bias_kv=True), which "
                          "MultiHeadAttention has no counterpart for");
        break;
      }
      case WeightLayout::Llama: {
        static const std::map<std::string, std::string> targets = {{"q_proj", "W_query"},
                                                                   {"k_proj", "W_key"},
                                                                   {"v_proj", "W_value"},
                                                                   {"o_proj", "out_proj"}};
        auto it = targets.find(n.module);
        if (it != targets.end()) {
          out.push_back({n.parent + it->second + "." + n.leaf, {tensor}});
          continue;
        }
        break;
      }
      case WeightLayout::GPT2: {
        // Only the attention's own names: c_proj and the mask buffers count when c_attn sits
        // beside them (the MLP of a GPT-2 block has a c_proj of its own).
        if (n.module == "c_attn" && (n.leaf == "weight" || n.leaf == "bias")) {
          const bool weight = n.leaf == "weight";
          split_three(out, name, weight ? tensor.t() : tensor, 0, weight ? 2 : 1, n.parent, n.leaf,
                      layout, source);
          continue;
        }
        if (n.module == "c_proj" && names.count(n.parent + "c_attn.weight") &&
            (n.leaf == "weight" || n.leaf == "bias")) {
          TORCH_CHECK_VALUE(n.leaf == "bias" || tensor.dim() == 2, detail::kLoadWeights, ": '",
                            source, "': ", name, " has shape ", tensor.sizes(),
                            ", not (d_out, d_out)");
          out.push_back(
              {n.parent + "out_proj." + n.leaf, {n.leaf == "weight" ? tensor.t() : tensor}});
          continue;
        }
        if ((n.leaf == "bias" || n.leaf == "masked_bias") &&
            names.count(module_path + "c_attn.weight")) {
          derived.push_back(name);
          continue;
        }
        break;
      }
      default:
        break;
    }
    out.push_back({name, {tensor}});
  }
  return out;
}

}  // namespace detail

LoadOptions& LoadOptions::rename(const std::vector<RenameRule>& rules) {
  std::vector<std::pair<std::regex, std::string>> compiled;
  for (const auto& [pattern, replacement] : rules) {
    try {
      compiled.emplace_back(std::regex(pattern, std::regex::ECMAScript), replacement);
    } catch (const std::regex_error& e) {
      TORCH_CHECK_VALUE(false, "attention::LoadOptions::rename: '", pattern,
                        "' is not a valid regular expression: ", e.what());
    }
  }
  rename_ = [compiled = std::move(compiled), rules](const std::string& name) {
    std::string out = name;
    for (std::size_t i = 0; i < compiled.size(); ++i) {
      // std::regex recurses once per character of its subject: names are bounded before a
      // rule sees them (the file's names when the file is read, here what earlier rules made).
      TORCH_CHECK_VALUE(out.size() <= serialization::kMaxNameLength,
                        "attention::LoadOptions::rename: rule '", rules[i].first, "' is given a ",
                        out.size(), "-character name (made by the rules before it from '",
                        name.substr(0, 64), "'); names over ", serialization::kMaxNameLength,
                        " characters are refused before a regular expression sees them");
      out = std::regex_replace(out, compiled[i].first, compiled[i].second);
    }
    return out;
  };
  return *this;
}

LoadOptions& LoadOptions::rename(NameMap map) {
  rename_ = std::move(map);
  return *this;
}

}  // namespace attention
