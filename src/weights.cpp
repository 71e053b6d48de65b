#include <attention/weights.h>

#include <attention/safetensors.h>

#include "checks.h"
#include "serialization/byte_source.h"
#include "serialization/safetensors.h"
#include "serialization/torch_save.h"
#include "serialization/zip_archive.h"
#include "weight_names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

namespace attention {
namespace {

constexpr const char* kLoad = "attention::load_weights";

struct FileContents {
  std::string format;
  NamedTensors tensors;
};

NamedTensors read_torchscript(const std::string& bytes) {
  std::istringstream stream(bytes);
  auto module = torch::jit::load(stream, torch::kCPU);
  NamedTensors out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
  return out;
}

// A zip archive: torch.save (read here, by the restricted unpickler) or TorchScript (read by
// LibTorch, trusted sources only).
FileContents read_archive(const serialization::ByteSource& source, const LoadOptions& options) {
  const std::string& path = source.name();
  const serialization::ZipArchive archive(source);
  if (serialization::is_torchscript(archive)) {
    TORCH_CHECK_VALUE(options.trusted(), kLoad, ": '", path, "' is a TorchScript archive, ",
                      "which carries code and is refused with LoadOptions().trusted(false) ",
                      "(save the weights with torch.save(model.state_dict(), path) or as ",
                      "safetensors)");
    TORCH_CHECK_VALUE(options.key().empty(), kLoad, ": LoadOptions().key() picks an entry of a ",
                      "torch.save checkpoint; '", path, "' is a TorchScript archive");
    return {"torchscript", read_torchscript(source.read_string(0, source.size()))};
  }
  const auto saved = serialization::read_torch_save(archive, path);
  return {"state_dict", serialization::state_dict_entries(saved, options.key(), path)};
}

FileContents read_contents(const serialization::ByteSource& source, const LoadOptions& options) {
  const std::string& path = source.name();
  TORCH_CHECK(source.size() > 0, kLoad, ": '", path, "' is empty");
  TORCH_CHECK_VALUE(!serialization::looks_like_legacy_torch_save(source), kLoad, ": '", path,
                    "' is in the torch.save format of PyTorch before 1.6 ",
                    "(_use_new_zipfile_serialization=False), which is not read; re-save it in ",
                    "Python with torch.save(torch.load(path), path)");
  if (serialization::looks_like_zip(source)) {
    try {
      return read_archive(source, options);
    } catch (const c10::ValueError&) {
      throw;
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, kLoad, ": cannot read '", path,
                  "' as a torch.save file or a TorchScript archive: ", e.what_without_backtrace());
    }
  }
  TORCH_CHECK(serialization::looks_like_safetensors(source), kLoad, ": '", path,
              "' is neither a safetensors file, a torch.save file nor a TorchScript archive");
  TORCH_CHECK_VALUE(options.key().empty(), kLoad, ": LoadOptions().key() picks an entry of a ",
                    "torch.save checkpoint; '", path, "' is a safetensors file");
  try {
    return {"safetensors", serialization::read_safetensors(source)};
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, kLoad, ": '", path,
                      "' is not a valid safetensors file: ", e.what_without_backtrace());
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

// isfinite over slices of a million elements: the temporaries stay small and are reused, where
// one isfinite over a large weight would fault in a fresh mask as large as a quarter of it.
bool all_finite(const torch::Tensor& value) {
  constexpr int64_t kSlice = int64_t{1} << 20;
  const torch::Tensor flat = value.reshape(-1);
  for (int64_t start = 0; start < flat.numel(); start += kSlice) {
    const auto slice = flat.slice(0, start, std::min(flat.numel(), start + kSlice));
    if (!torch::isfinite(slice).all().item<bool>()) return false;
  }
  return true;
}

LoadReport load_from(torch::nn::Module& module, const serialization::ByteSource& source,
                     const LoadOptions& options) {
  const std::string& path = source.name();
  LoadReport report;
  FileContents contents = read_contents(source, options);
  report.format = contents.format;
  NamedTensors file = detail::select_prefix(contents.tensors, options.prefix(), path);
  file = detail::rename_all(file, options.rename(), path);
  file = detail::convert_layout(file, options.layout(), path, report.derived);
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, tensor] : file) {
    TORCH_CHECK_VALUE(by_name.emplace(name, tensor).second, kLoad, ": '", path,
                      "' gives two tensors the name '", name, "' (after its prefix, rename and ",
                      "layout)");
  }
  const NamedTensors targets = module_tensors(module);

  std::vector<std::string> problems;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (module tensor, new value)
  for (const auto& [name, target] : targets) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      report.missing.push_back(name);
      continue;
    }
    torch::Tensor value = it->second;
    by_name.erase(it);
    if (value.sizes() != target.sizes()) {
      problems.push_back(fmt::format("shape of {}: module {}, file {}", name,
                                     detail::shape_str(target.sizes()),
                                     detail::shape_str(value.sizes())));
      continue;
    }
    std::string cast;
    if (value.scalar_type() != target.scalar_type()) {
      const bool both_float = value.is_floating_point() && target.is_floating_point();
      const auto from = c10::toString(value.scalar_type());
      const auto to = c10::toString(target.scalar_type());
      if (!options.cast() || !both_float) {
        problems.push_back(
            fmt::format("dtype of {}: module {}, file {}{}", name, to, from,
                        both_float ? " (LoadOptions().cast(true) converts it)" : ""));
        continue;
      }
      cast = fmt::format("{}: {} -> {}", name, from, to);
      value = value.to(target.scalar_type());
    }
    if (!options.allow_non_finite() && value.is_floating_point() && !all_finite(value)) {
      problems.push_back(
          fmt::format("{} holds NaN or Inf values{}", name, cast.empty() ? "" : " once cast"));
      continue;
    }
    if (!cast.empty()) report.casts.push_back(std::move(cast));
    report.loaded.push_back(name);
    copies.emplace_back(target, value);
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

}  // namespace

LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options) {
  std::unique_ptr<serialization::FileSource> source;
  try {
    source = std::make_unique<serialization::FileSource>(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kLoad, ": ", e.what_without_backtrace());
  }
  return load_from(module, *source, options);
}

LoadReport load_weights_from_memory(torch::nn::Module& module, const char* data, std::size_t size,
                                    const LoadOptions& options, const std::string& path) {
  TORCH_CHECK_VALUE(data != nullptr || size == 0,
                    "attention::load_weights_from_memory: expected data for ", size,
                    " bytes, got a null pointer (", path, ")");
  return load_from(module, serialization::MemorySource(data, size, path), options);
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void save_weights(const torch::nn::Module& module, const std::string& path) {
  const std::string bytes = ends_with(path, ".safetensors")
                                ? serialize_safetensors(module_tensors(module))
                                : serialization::write_torch_save(module_tensors(module));
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
