#include "serialization/weight_file.h"

#include "serialization/limits.h"
#include "serialization/safetensors.h"
#include "serialization/torch_save.h"
#include "serialization/zip_archive.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <sstream>

namespace attention {
namespace serialization {
namespace {

// Messages name the public entry that reads files.
constexpr const char* kLoad = "attention::load_weights";

enum class Format { LegacyTorchSave, Zip, Safetensors, Unknown };

// The format, from the first bytes alone: a zip archive (torch.save or TorchScript, told apart by
// its records), safetensors, or the pre-1.6 torch.save format.
Format detect_format(const ByteSource& source) {
  const std::string head =
      source.read_string(0, static_cast<std::size_t>(std::min<uint64_t>(source.size(), 16)));
  // PROTO 2, then LONG1 of 10 bytes: the magic number 0x1950a86a20f9469cfc6c.
  static const std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14);
  if (head.compare(0, legacy.size(), legacy) == 0) return Format::LegacyTorchSave;
  if (head.compare(0, 4, "PK\x03\x04") == 0) return Format::Zip;
  if (safetensors_prefix(head, source.size())) return Format::Safetensors;
  return Format::Unknown;
}

NamedTensors read_torchscript(const ByteSource& source) {
  std::istringstream stream(source.read_string(0, static_cast<std::size_t>(source.size())));
  auto module = torch::jit::load(stream, c10::kCPU);
  NamedTensors out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
  return out;
}

// A zip archive: torch.save (read here, by the restricted unpickler) or TorchScript (read by
// LibTorch, trusted sources only).
WeightFile read_archive(const ByteSource& source, const ReadOptions& options) {
  const std::string& path = source.name();
  const ZipArchive archive(source);
  if (is_torchscript(archive)) {
    TORCH_CHECK_VALUE(options.trusted, kLoad, ": '", path, "' is a TorchScript archive, ",
                      "which carries code and is refused with LoadOptions().trusted(false) ",
                      "(save the weights with torch.save(model.state_dict(), path) or as ",
                      "safetensors)");
    TORCH_CHECK_VALUE(options.key.empty(), kLoad, ": LoadOptions().key() picks an entry of a ",
                      "torch.save checkpoint; '", path, "' is a TorchScript archive");
    return {"torchscript", read_torchscript(source)};
  }
  const Unpickled saved = read_torch_save(archive, path);
  return {"state_dict", state_dict_entries(saved, options.key, path)};
}

WeightFile read_by_format(const ByteSource& source, const ReadOptions& options) {
  const std::string& path = source.name();
  TORCH_CHECK(source.size() > 0, kLoad, ": '", path, "' is empty");
  switch (detect_format(source)) {
    case Format::LegacyTorchSave:
      TORCH_CHECK_VALUE(false, kLoad, ": '", path,
                        "' is in the torch.save format of PyTorch before 1.6 ",
                        "(_use_new_zipfile_serialization=False), which is not read; re-save it ",
                        "in Python with torch.save(torch.load(path), path)");
    case Format::Zip:
      try {
        return read_archive(source, options);
      } catch (const c10::ValueError&) {
        throw;
      } catch (const c10::Error& e) {
        TORCH_CHECK(
            false, kLoad, ": cannot read '", path,
            "' as a torch.save file or a TorchScript archive: ", e.what_without_backtrace());
      }
    case Format::Safetensors:
      TORCH_CHECK_VALUE(options.key.empty(), kLoad, ": LoadOptions().key() picks an entry of a ",
                        "torch.save checkpoint; '", path, "' is a safetensors file");
      try {
        return {"safetensors", read_safetensors(source)};
      } catch (const c10::Error& e) {
        TORCH_CHECK_VALUE(false, kLoad, ": '", path,
                          "' is not a valid safetensors file: ", e.what_without_backtrace());
      }
    case Format::Unknown:
      break;
  }
  TORCH_CHECK(false, kLoad, ": '", path,
              "' is neither a safetensors file, a torch.save file nor a TorchScript archive");
}

}  // namespace

WeightFile read_weight_file(const ByteSource& source, const ReadOptions& options) {
  WeightFile file = read_by_format(source, options);
  for (const auto& item : file.tensors) {
    const std::string& name = item.first;
    TORCH_CHECK_VALUE(name.size() <= kMaxNameLength, kLoad, ": '", source.name(),
                      "' names a tensor with ", name.size(), " characters, over the limit of ",
                      kMaxNameLength, " (no regular expression sees a longer name): '",
                      name.substr(0, 64), "...'");
  }
  return file;
}

}  // namespace serialization
}  // namespace attention
