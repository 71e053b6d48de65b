#pragma once

// A restricted unpickler for the pickles inside torch.save archives. It builds values and never
// runs code: the only globals it knows are those of PyTorch's `weights_only` loader
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and _rebuild_parameter, the storage
// types, torch.Size, torch.device, _codecs.encode for bytes) and
// torch.jit._pickle.restore_type_tag, which LibTorch's torch::pickle_save wraps around typed dicts
// and which only tags a type (read as the identity); any other is refused by name.
//
// Values live in one arena and refer to each other by index, so a pickle that makes a list hold
// itself is harmless, and nothing is destroyed recursively. The arena is counted in bytes against
// a budget in proportion to the pickle's size (serialization/limits.h), and every opcode costs
// time in proportion to the bytes it reads: a value used again through the memo is never copied,
// re-encoded or re-hashed.

#include "serialization/limits.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace attention {
namespace serialization {

/// Limits that bound the work and memory an unpickled file can demand.
struct UnpicklerLimits {
  /// The size of the file the pickle came from, the basis of the budget below (0: the pickle's).
  std::size_t file_size = 0;
  /// The arena (values, texts, item lists, dict keys, tensor views; not the storages' data) may
  /// take this many bytes per byte of the file...
  std::size_t bytes_per_file_byte = kArenaBytesPerFileByte;
  /// ... plus this many.
  std::size_t bytes_constant = kArenaBytesConstant;
  /// Memo slots: every memo index must be below it.
  std::size_t max_memo = std::size_t{1} << 20;
  /// Nesting of MARKs, and of tuples used as dict keys.
  std::size_t max_depth = kMaxPickleDepth;
};

/// One value of the arena: 16 bytes, its payload by index in the arena's tables.
struct Value {
  enum class Kind : uint8_t {
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
  bool ordered = false;  // Dict: a collections.OrderedDict
  /// String, Bytes and Global ("module.name"): in Unpickled::texts; Tuple, List and Dict: in
  /// Unpickled::sequences; Tensor and Storage (a 1-d tensor over the whole storage): in
  /// Unpickled::tensors.
  uint32_t slot = 0;
  int64_t integer = 0;  // Bool, Int; Float: the bits of the double
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
  std::vector<std::string> texts;
  /// Tuple and List items; Dict keys and values interleaved (key, value, key, value, ...), each
  /// key once (as Python compares keys), in the order of first insertion.
  std::vector<std::vector<uint32_t>> sequences;
  std::vector<at::Tensor> tensors;
  uint32_t root = 0;
  /// The arena's size as counted against UnpicklerLimits.
  std::size_t bytes = 0;

  const Value& at(uint32_t id) const { return values.at(id); }
  /// The text of a String, Bytes or Global.
  const std::string& text(uint32_t id) const;
  /// The items of a Tuple, List or Dict.
  const std::vector<uint32_t>& items(uint32_t id) const;
  /// The tensor of a Tensor or Storage.
  const at::Tensor& tensor(uint32_t id) const;
  double real(uint32_t id) const;
  std::size_t dict_size(uint32_t id) const { return items(id).size() / 2; }
};

/// Unpickles protocols 2 to 5 as torch.save writes them. Throws c10::Error for a refused global,
/// an unsupported opcode, a malformed or truncated stream, or an exceeded limit; `source` names
/// the file in every message.
Unpickled unpickle(const std::string& pickle, const StorageLoader& load_storage,
                   const std::string& source, const UnpicklerLimits& limits = {});

}  // namespace serialization
}  // namespace attention
