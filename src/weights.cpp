#include <attention/weights.h>

#include <attention/safetensors.h>

#include "detail.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace attention {
namespace {

constexpr const char* kLoad = "attention::load_weights";

std::string read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TORCH_CHECK(fs::exists(path, ec), kLoad, ": no file at '", path, "'");
  TORCH_CHECK(fs::is_regular_file(path, ec), kLoad, ": '", path, "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, kLoad, ": cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes;
}

bool is_torchscript(const std::string& bytes) {
  std::istringstream stream(bytes);
  caffe2::serialize::PyTorchStreamReader reader(&stream);
  return reader.hasRecord("constants.pkl");
}

NamedTensors read_torchscript(const std::string& bytes) {
  std::istringstream stream(bytes);
  auto module = torch::jit::load(stream, torch::kCPU);
  NamedTensors out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
  return out;
}

NamedTensors read_state_dict(const std::string& bytes, const std::string& path) {
  std::vector<char> data(bytes.begin(), bytes.end());
  c10::IValue value = torch::pickle_load(data);
  TORCH_CHECK(value.isGenericDict(), kLoad, ": '", path,
              "' holds no dict of tensors (save one with torch.save(dict(m.state_dict()), path))");
  NamedTensors out;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), kLoad, ": '", path,
                "' holds a dict whose entries are not name -> tensor");
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

// Reads the tensors of a weight file held in memory and says which format they came in.
NamedTensors read_weights(const std::string& bytes, const std::string& path, bool trusted,
                          std::string& format) {
  TORCH_CHECK(!bytes.empty(), kLoad, ": '", path, "' is empty");
  if (looks_like_safetensors(bytes.data(), bytes.size())) {
    format = "safetensors";
    try {
      return parse_safetensors(bytes.data(), bytes.size());
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, kLoad, ": '", path,
                        "' is not a valid safetensors file: ", e.what_without_backtrace());
    }
  }
  TORCH_CHECK_VALUE(
      trusted, kLoad, ": '", path, "' is not a safetensors file, and only ",
      "safetensors is read with LoadOptions().trusted(false) (TorchScript archives and ",
      "pickled state dicts can carry code)");
  try {
    if (is_torchscript(bytes)) {
      format = "torchscript";
      return read_torchscript(bytes);
    }
    format = "state_dict";
    return read_state_dict(bytes, path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kLoad, ": cannot read '", path,
                "' as a safetensors file, a TorchScript archive or a torch.save state dict: ",
                e.what_without_backtrace());
  }
}

// Full names of the buffers that the module and its submodules derive themselves.
std::set<std::string> derived_names(const torch::nn::Module& module) {
  std::set<std::string> names;
  auto add = [&](const torch::nn::Module& m, const std::string& prefix) {
    if (const auto* derived = dynamic_cast<const DerivedBuffers*>(&m)) {
      for (const auto& name : derived->derived_buffer_names()) names.insert(prefix + name);
    }
  };
  add(module, "");
  // include_self=false: the module itself need not live in a shared_ptr.
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    add(*item.value(), item.key() + ".");
  }
  return names;
}

NamedTensors module_tensors(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) {
    if (b.value().defined()) out.emplace_back(b.key(), b.value());
  }
  return out;
}

}  // namespace

LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options) {
  const std::string bytes = read_file(path);
  return load_weights_from_memory(module, bytes.data(), bytes.size(), options, path);
}

LoadReport load_weights_from_memory(torch::nn::Module& module, const char* data, std::size_t size,
                                    const LoadOptions& options, const std::string& path) {
  TORCH_CHECK_VALUE(data != nullptr || size == 0,
                    "attention::load_weights_from_memory: expected data for ", size,
                    " bytes, got a null pointer (", path, ")");
  LoadReport report;
  const NamedTensors file =
      read_weights(std::string(data, size), path, options.trusted(), report.format);
  std::map<std::string, torch::Tensor> by_name(file.begin(), file.end());
  const NamedTensors targets = module_tensors(module);

  std::vector<std::string> problems;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (module tensor, new value)
  for (const auto& [name, target] : targets) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      report.missing.push_back(name);
      continue;
    }
    const torch::Tensor value = it->second;
    by_name.erase(it);
    if (value.sizes() != target.sizes()) {
      problems.push_back(fmt::format("shape of {}: module {}, file {}", name,
                                     detail::shape_str(target.sizes()),
                                     detail::shape_str(value.sizes())));
    } else if (value.scalar_type() != target.scalar_type()) {
      problems.push_back(fmt::format("dtype of {}: module {}, file {}", name,
                                     c10::toString(target.scalar_type()),
                                     c10::toString(value.scalar_type())));
    } else if (!options.allow_non_finite() && value.is_floating_point() &&
               !torch::isfinite(value).all().item<bool>()) {
      problems.push_back(fmt::format("{} holds NaN or Inf values", name));
    } else {
      report.loaded.push_back(name);
      copies.emplace_back(target, value);
    }
  }
  const auto derived = derived_names(module);
  for (const auto& [name, value] : file) {
    if (!by_name.count(name)) continue;
    (derived.count(name) ? report.derived : report.unexpected).push_back(name);
  }
  if (options.strict()) {
    if (!report.missing.empty()) {
      problems.push_back(fmt::format("missing in the file: {}", fmt::join(report.missing, ", ")));
    }
    if (!report.unexpected.empty()) {
      problems.push_back(
          fmt::format("unexpected in the file: {}", fmt::join(report.unexpected, ", ")));
    }
  }
  TORCH_CHECK_VALUE(problems.empty(), kLoad, ": '", path, "' does not fit the module (nothing was ",
                    "loaded):\n  ", fmt::format("{}", fmt::join(problems, "\n  ")));

  // Stage every value on the module's device first, so that a failure leaves nothing half-copied.
  for (auto& [target, value] : copies) value = value.to(target.options());
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  return report;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string state_dict_bytes(const torch::nn::Module& module) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, tensor] : module_tensors(module)) {
    dict.insert(name, tensor.detach().cpu());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

void save_weights(const torch::nn::Module& module, const std::string& path) {
  const std::string bytes = ends_with(path, ".safetensors")
                                ? serialize_safetensors(module_tensors(module))
                                : state_dict_bytes(module);
  // Written beside the target and renamed over it, so that a failed write never leaves a
  // truncated weight file behind.
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(out, "attention::save_weights: cannot write '", partial, "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    TORCH_CHECK(out.good(), "attention::save_weights: writing '", partial, "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  TORCH_CHECK(!ec, "attention::save_weights: cannot move '", partial, "' to '", path,
              "': ", ec.message());
}

}  // namespace attention
