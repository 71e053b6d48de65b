#include "serialization/torch_save.h"

#include "memory/empty_large.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace attention {
namespace serialization {
namespace {

using Kind = Value::Kind;

// The directory all records of the archive live in ("archive", or the saved file's stem).
std::string archive_directory(const ZipArchive& archive, const std::string& source) {
  TORCH_CHECK(!archive.names().empty(), "'", source, "' is an empty zip archive");
  const std::string& first = archive.names().front();
  const auto slash = first.find('/');
  TORCH_CHECK(slash != std::string::npos && slash > 0, "'", source,
              "' is a zip archive whose records lie outside a directory, not a torch.save file");
  return first.substr(0, slash + 1);
}

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

// The few pickle opcodes (protocol 2) a state dict needs.
class PickleWriter {
 public:
  void op(char c) { out_ += c; }
  void text(const std::string& s) {
    out_ += 'X';
    little_endian(s.size(), 4);
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      little_endian(static_cast<uint64_t>(v), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes
      little_endian(static_cast<uint64_t>(v), 8);
    }
  }
  void global(const std::string& module, const std::string& name) {
    out_ += 'c' + module + '\n' + name + '\n';
  }
  void int_tuple(c10::IntArrayRef values) {
    op('(');
    for (int64_t v : values) integer(v);
    op('t');
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');
  }
  std::string& bytes() { return out_; }

 private:
  void little_endian(uint64_t v, int width) {
    for (int i = 0; i < width; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

std::string storage_class(c10::ScalarType dtype) {
  for (const auto& [name, type] : storage_types()) {
    if (type == dtype) return name.substr(std::string("torch.").size());
  }
  TORCH_CHECK_VALUE(false, "attention::save_weights: torch.save has no storage type for ", dtype);
}

}  // namespace

bool is_torchscript(const ZipArchive& archive) {
  for (const auto& name : archive.names()) {
    const auto slash = name.find('/');
    if (slash != std::string::npos &&
        name.compare(slash + 1, std::string::npos, "constants.pkl") == 0) {
      return true;
    }
  }
  return false;
}

Unpickled read_torch_save(const ZipArchive& archive, const std::string& source,
                          const UnpicklerLimits& limits) {
  const std::string dir = archive_directory(archive, source);
  TORCH_CHECK(archive.has(dir + "data.pkl"), "'", source,
              "' is a zip archive without data.pkl, not a torch.save file");
  if (archive.has(dir + "byteorder")) {
    const std::string order = archive.read_string(dir + "byteorder");
    TORCH_CHECK(order == "little", "'", source, "' holds ", order,
                "-endian storages; only little-endian files are read");
  }
  const std::string pickle = archive.read_string(dir + "data.pkl");
  auto load = [&](c10::ScalarType dtype, const std::string& key, int64_t numel) {
    const std::string record = dir + "data/" + key;
    TORCH_CHECK(archive.has(record), "'", source, "' lacks the record of storage '", key, "'");
    const auto item = static_cast<int64_t>(c10::elementSize(dtype));
    int64_t bytes = 0;
    TORCH_CHECK(!__builtin_mul_overflow(numel, item, &bytes) &&
                    static_cast<uint64_t>(bytes) == archive.size(record),
                "'", source, "': storage '", key, "' of ", numel, " ", c10::toString(dtype),
                " elements does not fill its record of ", archive.size(record), " bytes");
    // Large storages in huge-page-advised memory: most of a fresh buffer's cost is faulting it in.
    at::Tensor storage = detail::empty_large({numel}, at::TensorOptions().dtype(dtype));
    archive.read(record, storage.data_ptr());
    return storage;
  };
  UnpicklerLimits budget = limits;
  if (budget.file_size == 0) budget.file_size = static_cast<std::size_t>(archive.file_size());
  return unpickle(pickle, load, source, budget);
}

std::string write_torch_save(const NamedTensors& tensors) {
  std::vector<at::Tensor> storages;
  PickleWriter p;
  p.op('\x80');
  p.op('\x02');
  p.empty_ordered_dict();
  p.op('(');
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor data = tensor.detach().cpu().contiguous();
    const std::string key = std::to_string(storages.size());
    p.text(name);
    p.global("torch._utils", "_rebuild_tensor_v2");
    p.op('(');
    p.op('(');  // persistent id: ('storage', type, key, location, numel)
    p.text("storage");
    p.global("torch", storage_class(data.scalar_type()));
    p.text(key);
    p.text("cpu");
    p.integer(data.numel());
    p.op('t');
    p.op('Q');
    p.integer(0);
    p.int_tuple(data.sizes());
    p.int_tuple(data.strides());
    p.op('\x89');            // requires_grad: False
    p.empty_ordered_dict();  // backward hooks
    p.op('t');
    p.op('R');
    storages.push_back(data);
  }
  p.op('u');
  p.op('.');
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  writer.writeRecord("data.pkl", p.bytes().data(), p.bytes().size());
  for (std::size_t i = 0; i < storages.size(); ++i) {
    writer.writeRecord("data/" + std::to_string(i), storages[i].data_ptr(), storages[i].nbytes());
  }
  writer.writeEndOfFile();
  return out;
}

NamedTensors state_dict_entries(const Unpickled& saved, const std::string& key,
                                const std::string& source) {
  const Value& root = saved.at(saved.root);
  TORCH_CHECK_VALUE(root.kind == Kind::Dict, "'", source, "' holds ", describe(root.kind),
                    ", not a state dict (save one with torch.save(model.state_dict(), path))");
  // An entry's name for messages, cut short.
  auto entry_name = [&](uint32_t id) -> std::string {
    const Value& k = saved.at(id);
    return k.kind == Kind::String ? excerpt(saved.text(id))
                                  : std::string("<") + describe(k.kind) + ">";
  };
  const std::vector<uint32_t>* dict = &saved.items(saved.root);
  if (!key.empty()) {
    std::vector<std::string> keys;
    const std::vector<uint32_t>& items = *dict;
    uint32_t found = 0;
    bool has = false;
    for (std::size_t i = 0; i < items.size(); i += 2) {
      keys.push_back(quoted(entry_name(items[i])));
      if (saved.at(items[i]).kind == Kind::String && saved.text(items[i]) == key) {
        found = items[i + 1];
        has = true;
      }
    }
    TORCH_CHECK_VALUE(has, "'", source, "' has no entry '", key,
                      "'; its entries: ", fmt::format("{}", fmt::join(keys, ", ")));
    TORCH_CHECK_VALUE(saved.at(found).kind == Kind::Dict, "'", source, "': entry '", key, "' is ",
                      describe(saved.at(found).kind), ", not a state dict");
    dict = &saved.items(found);
  }
  NamedTensors out;
  std::vector<std::string> others;  // entries that are not name -> tensor
  std::string state_dict_hint;      // a nested dict of tensors, for the checkpoint message
  for (std::size_t i = 0; i < dict->size(); i += 2) {
    const uint32_t k = (*dict)[i], v = (*dict)[i + 1];
    const Kind key_kind = saved.at(k).kind, kind = saved.at(v).kind;
    if (key_kind == Kind::String && kind == Kind::Tensor) {
      out.emplace_back(saved.text(k), saved.tensor(v));
      continue;
    }
    others.push_back(fmt::format("'{}' ({})", entry_name(k), describe(kind)));
    if (kind == Kind::Dict && state_dict_hint.empty() && saved.dict_size(v) > 0) {
      bool all_tensors = true;
      const std::vector<uint32_t>& nested = saved.items(v);
      for (std::size_t j = 1; j < nested.size(); j += 2) {
        all_tensors = all_tensors && saved.at(nested[j]).kind == Kind::Tensor;
      }
      if (all_tensors) state_dict_hint = entry_name(k);
    }
  }
  if (!others.empty() && key.empty() && !state_dict_hint.empty()) {
    TORCH_CHECK_VALUE(false, "'", source, "' holds a checkpoint, not a state dict; its entries: ",
                      fmt::format("{}", fmt::join(others, ", ")),
                      ". Name the state dict with LoadOptions().key(\"", state_dict_hint, "\")");
  }
  TORCH_CHECK_VALUE(others.empty(), "'", source, "' holds a dict whose entries are not all ",
                    "name -> tensor: ", fmt::format("{}", fmt::join(others, ", ")));
  return out;
}

}  // namespace serialization
}  // namespace attention
