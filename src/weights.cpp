#include <attention/norm.h>
#include <attention/weights.h>

#include <attention/safetensors.h>

#include "checks.h"
#include "hugging_face_names.h"
#include "serialization/byte_source.h"
#include "serialization/sharded_checkpoint.h"
#include "serialization/torch_save.h"
#include "serialization/weight_file.h"
#include "weight_names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

namespace attention {
namespace {

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

// isfinite over slices of at most a million elements: the temporaries stay small and are reused,
// where one isfinite over a large weight would fault in a fresh mask as large as a quarter of it.
// A view that is not contiguous (a stride-0 tensor from a file, say) is sliced along its first
// dimension rather than flattened, which would copy the whole of it.
bool all_finite(const torch::Tensor& value) {
  constexpr int64_t kSlice = int64_t{1} << 20;
  if (value.numel() <= kSlice) return torch::isfinite(value).all().item<bool>();
  if (value.is_contiguous()) {
    const torch::Tensor flat = value.view(-1);
    for (int64_t start = 0; start < flat.numel(); start += kSlice) {
      const auto slice = flat.slice(0, start, std::min(flat.numel(), start + kSlice));
      if (!torch::isfinite(slice).all().item<bool>()) return false;
    }
    return true;
  }
  const int64_t row = value.numel() / value.size(0);
  if (row > kSlice) {
    // A row alone is over the slice: row by row, each one dimension less.
    for (int64_t i = 0; i < value.size(0); ++i) {
      if (!all_finite(value.select(0, i))) return false;
    }
    return true;
  }
  const int64_t rows = kSlice / row;
  for (int64_t start = 0; start < value.size(0); start += rows) {
    if (!all_finite(value.narrow(0, start, std::min(rows, value.size(0) - start)))) return false;
  }
  return true;
}

// A Hugging Face checkpoint stores its norms zero-centred (Gemma 3, Qwen3.5: the weight stands for
// 1 + w) or plain: loaded into a Norm of the other kind, every normalized feature would be off by
// one scale. Each loaded norm weight's module is checked.
void check_norm_kinds(torch::nn::Module& module, WeightLayout layout,
                      const std::vector<std::string>& loaded, std::vector<std::string>& problems) {
  if (!detail::is_hugging_face(layout)) return;
  const bool zero_centred = detail::zero_centred_norms(layout);
  const std::set<std::string> names(loaded.begin(), loaded.end());
  // The module itself, then its descendants (named_modules() with the module included needs it
  // held by a shared_ptr, which a caller's module on the stack is not).
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules = {{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  for (const auto& [path, submodule] : modules) {
    const auto* norm = dynamic_cast<const NormImpl*>(submodule);
    if (norm == nullptr || !norm->weight.defined()) continue;
    const char* leaf = norm->options.parameter_name() == NormParameter::Scale ? "scale" : "weight";
    const std::string weight = path.empty() ? leaf : path + "." + leaf;
    if (!names.count(weight)) continue;
    const bool centred = norm->options.kind() == NormKind::ZeroCenteredRMS;
    if (centred != zero_centred) {
      problems.push_back(
          fmt::format("{}: the checkpoint stores {} norm weights, and the module's {} is {}",
                      weight, zero_centred ? "zero-centred (1 + w)" : "plain (not zero-centred)",
                      path.empty() ? std::string("norm") : path,
                      centred ? "zero-centred (NormKind::ZeroCenteredRMS)" : "not zero-centred"));
    }
  }
}

// Loads what a weight file (or a sharded checkpoint, `path` its index) holds into the module.
LoadReport load_contents(torch::nn::Module& module, serialization::WeightFile contents,
                         const std::string& path, const LoadOptions& options) {
  LoadReport report;
  report.format = contents.format;
  NamedTensors named = detail::select_prefix(std::move(contents.tensors), options.prefix(), path);
  named = detail::rename_all(std::move(named), options.rename(), path);
  const std::vector<detail::FileTensor> file =
      detail::convert_layout(std::move(named), options.layout(), path, report.derived);
  std::map<std::string, const detail::FileTensor*> by_name;
  for (const auto& entry : file) {
    TORCH_CHECK_VALUE(by_name.emplace(entry.name, &entry).second, detail::kLoadWeights, ": '", path,
                      "' gives two tensors the name '", entry.name,
                      "' (after its prefix, rename and layout)");
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
    const detail::FileTensor& entry = *it->second;
    by_name.erase(it);
    const std::vector<int64_t> sizes = entry.sizes();
    if (c10::IntArrayRef(sizes) != target.sizes()) {
      problems.push_back(fmt::format("shape of {}: module {}, file {}", name,
                                     detail::shape_str(target.sizes()), detail::shape_str(sizes)));
      continue;
    }
    std::string cast;
    const c10::ScalarType dtype = entry.scalar_type();
    if (dtype != target.scalar_type()) {
      const bool both_float = entry.is_floating_point() && target.is_floating_point();
      const auto from = c10::toString(dtype);
      const auto to = c10::toString(target.scalar_type());
      if (!options.cast() || !both_float) {
        problems.push_back(
            fmt::format("dtype of {}: module {}, file {}{}", name, to, from,
                        both_float ? " (LoadOptions().cast(true) converts it)" : ""));
        continue;
      }
      cast = fmt::format("{}: {} -> {}", name, from, to);
    }
    // Made only now that its shape is the module's: a concatenation, and a cast.
    torch::Tensor value = entry.value();
    if (!cast.empty()) value = value.to(target.scalar_type());
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
  for (const auto& entry : file) {
    if (!by_name.count(entry.name)) continue;
    (derived.count(entry.name) ? report.derived : report.unexpected).push_back(entry.name);
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
  check_norm_kinds(module, options.layout(), report.loaded, problems);
  TORCH_CHECK_VALUE(problems.empty(), detail::kLoadWeights, ": '", path,
                    "' does not fit the module (nothing was ", "loaded):\n  ",
                    fmt::format("{}", fmt::join(problems, "\n  ")));

  // Stage every value on the module's device first, so that a failure leaves nothing half-copied.
  for (auto& [target, value] : copies) value = value.to(target.options());
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  return report;
}

LoadReport load_from(torch::nn::Module& module, const serialization::ByteSource& source,
                     const LoadOptions& options) {
  return load_contents(module,
                       serialization::read_weight_file(source, {options.trusted(), options.key()}),
                       source.name(), options);
}

}  // namespace

LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const LoadOptions& options) {
  if (serialization::is_shard_index(path)) {
    TORCH_CHECK_VALUE(options.key().empty(), detail::kLoadWeights, ": '", path,
                      "' is a sharded checkpoint's index: its shards hold tensors alone, so no key "
                      "is read (got key '",
                      options.key(), "')");
    return load_contents(module,
                         serialization::read_sharded(path, {options.trusted(), options.key()}),
                         path, options);
  }
  std::unique_ptr<serialization::FileSource> source;
  try {
    source = std::make_unique<serialization::FileSource>(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, detail::kLoadWeights, ": ", e.what_without_backtrace());
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
  // Written beside the target under a name of its own, then renamed over it: a failed write never
  // leaves a truncated weight file behind, and two saves to one path at once (threads or
  // processes) each rename a whole file of their own, the last one winning. The name is the
  // process's and a counter's; O_EXCL makes sure it is new, and the mode an ordinary new file's
  // (0666 less the umask).
  static std::atomic<uint64_t> saves{0};
  std::string partial;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    partial = fmt::format("{}.partial.{}.{}", path, ::getpid(), saves.fetch_add(1));
    fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  TORCH_CHECK(fd >= 0, "attention::save_weights: cannot write '", partial,
              "': ", std::strerror(errno));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool closed = ::close(fd) == 0;
  std::error_code ec;
  if (written != bytes.size() || !closed) {
    std::filesystem::remove(partial, ec);
    TORCH_CHECK(false, "attention::save_weights: writing '", partial, "' failed");
  }
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
  }
  TORCH_CHECK(!ec, "attention::save_weights: cannot move '", partial, "' to '", path,
              "': ", ec.message());
}

}  // namespace attention
