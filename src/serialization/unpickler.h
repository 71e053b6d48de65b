#pragma once

// A restricted unpickler for the pickles inside torch.save archives. It builds values and never
// runs code: the only globals it knows are those of PyTorch's `weights_only` loader
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and _rebuild_parameter, the storage
// types, torch.Size, torch.device, _codecs.encode for bytes) and
// torch.jit._pickle.restore_type_tag, which LibTorch's torch::pickle_save wraps around typed dicts
// and which only tags a type (read as the identity); any other is refused by name.
//
// Values live in one arena and refer to each other by index, so a pickle that makes a list hold
// itself is harmless, and nothing is destroyed recursively.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace attention {
namespace serialization {

/// Limits that bound the work and memory an unpickled file can demand.
struct UnpicklerLimits {
  /// Values the pickle may create (each opcode creates at most one).
  std::size_t max_values = std::size_t{1} << 22;
  /// Entries of the memo.
  std::size_t max_memo = std::size_t{1} << 20;
  /// Nesting of MARKs, and of tuples used as dict keys.
  std::size_t max_depth = 256;
};

struct Value {
  enum class Kind {
    None,
    Bool,
    Int,
    Float,
    String,
    Bytes,
    Tuple,
    List,
    Dict,
    Tensor,
    Storage,
    Global
  };
  Kind kind = Kind::None;
  int64_t integer = 0;  // Bool, Int
  double real = 0;      // Float
  std::string text;     // String, Bytes, Global ("module.name")
  /// Tuple and List items; Dict keys and values interleaved (key, value, key, value, ...).
  std::vector<uint32_t> items;
  /// Dict: the position in `items` of each key's entry, by the key's canonical text.
  std::unordered_map<std::string, std::size_t> index;
  bool ordered = false;  // Dict: a collections.OrderedDict
  at::Tensor tensor;     // Tensor, Storage (a 1-d tensor over the whole storage)

  std::size_t dict_size() const { return items.size() / 2; }
};

/// The storage classes torch.save names in its persistent ids ("torch.FloatStorage"), one per
/// element type.
const std::map<std::string, c10::ScalarType>& storage_types();

/// Kind names for messages ("an int", "a dict", ...).
const char* describe(Value::Kind kind);

/// Loads one storage: its element type, the name of its record ("0", "1", ...) and its element
/// count. Called once per record; the unpickler reuses the result for later references.
using StorageLoader =
    std::function<at::Tensor(c10::ScalarType dtype, const std::string& record, int64_t numel)>;

struct Unpickled {
  std::vector<Value> values;
  uint32_t root = 0;
  const Value& at(uint32_t id) const { return values.at(id); }
};

/// Unpickles protocols 2 to 5 as torch.save writes them. Throws c10::Error for a refused global,
/// an unsupported opcode, a malformed or truncated stream, or an exceeded limit; `source` names
/// the file in every message.
Unpickled unpickle(const std::string& pickle, const StorageLoader& load_storage,
                   const std::string& source, const UnpicklerLimits& limits = {});

}  // namespace serialization
}  // namespace attention
