#include "serialization/unpickler.h"

#include "serialization/byte_source.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

namespace attention {
namespace serialization {
namespace {

using Kind = Value::Kind;

}  // namespace

const std::map<std::string, c10::ScalarType>& storage_types() {
  static const std::map<std::string, c10::ScalarType> table = {
      {"torch.FloatStorage", c10::kFloat},
      {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},
      {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},
      {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},
      {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},
      {"torch.BoolStorage", c10::kBool},
      {"torch.ComplexFloatStorage", c10::kComplexFloat},
      {"torch.ComplexDoubleStorage", c10::kComplexDouble},
  };
  return table;
}

const std::string& Unpickled::text(uint32_t id) const {
  const Value& v = at(id);
  TORCH_CHECK(v.kind == Kind::String || v.kind == Kind::Bytes || v.kind == Kind::Global,
              "Unpickled::text of ", describe(v.kind));
  return texts.at(v.slot);
}

const std::vector<uint32_t>& Unpickled::items(uint32_t id) const {
  const Value& v = at(id);
  TORCH_CHECK(v.kind == Kind::Tuple || v.kind == Kind::List || v.kind == Kind::Dict,
              "Unpickled::items of ", describe(v.kind));
  return sequences.at(v.slot);
}

const at::Tensor& Unpickled::tensor(uint32_t id) const {
  const Value& v = at(id);
  TORCH_CHECK(v.kind == Kind::Tensor || v.kind == Kind::Storage, "Unpickled::tensor of ",
              describe(v.kind));
  return tensors.at(v.slot);
}

double Unpickled::real(uint32_t id) const {
  double out;
  std::memcpy(&out, &at(id).integer, sizeof out);
  return out;
}

namespace {

constexpr const char* kOrderedDict = "collections.OrderedDict";
constexpr const char* kRebuildTensor = "torch._utils._rebuild_tensor_v2";
constexpr const char* kRebuildParameter = "torch._utils._rebuild_parameter";
constexpr const char* kSize = "torch.Size";
constexpr const char* kDevice = "torch.device";
constexpr const char* kEncode = "_codecs.encode";
// LibTorch's torch::pickle_save (and so files of earlier versions of save_weights) wraps typed
// dicts in it; it only attaches a type name.
constexpr const char* kRestoreTypeTag = "torch.jit._pickle.restore_type_tag";
// No allowed global's name is longer.
constexpr std::size_t kMaxGlobalName = 64;
// No allowed callable takes more arguments.
constexpr std::size_t kMaxArguments = 7;

// What the arena counts for memory the C++ runtime allocates on its behalf: a tensor (its
// TensorImpl and, for a storage, its StorageImpl) and a node of a std::map.
constexpr std::size_t kTensorBytes = 512;
constexpr std::size_t kNodeBytes = 96;
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

bool allowed_global(const std::string& name) {
  return name == kOrderedDict || name == kRebuildTensor || name == kRebuildParameter ||
         name == kSize || name == kDevice || name == kEncode || name == kRestoreTypeTag ||
         storage_types().count(name) != 0;
}

// A dict key's identity as Python compares keys: equal keys have equal descriptions. Texts are
// named by the value that holds them, tuples by their items' key ids (in Machine::key_items_),
// so that no key's description is larger than the value it describes.
struct KeyDescription {
  enum class Kind : uint8_t { None, Number, Float, String, Bytes, Identity, Tuple };
  Kind kind = Kind::None;
  int64_t number = 0;   // Number: the integer; Float: the bits of a non-integral double
  uint32_t source = 0;  // String, Bytes: the value holding the text; Identity: the value
  uint32_t begin = 0;   // Tuple: its items' key ids in Machine::key_items_
  uint32_t length = 0;
};

class Machine {
 public:
  Machine(const std::string& in, const StorageLoader& load, const std::string& source,
          const UnpicklerLimits& limits)
      : in_(in), load_(load), source_(source), limits_(limits), keys_(KeyOrder{this}) {
    const std::size_t basis = limits.file_size != 0 ? limits.file_size : in.size();
    const std::size_t per_byte = limits.bytes_per_file_byte;
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    budget_ = per_byte != 0 && basis > (max - limits.bytes_constant) / per_byte
                  ? max
                  : basis * per_byte + limits.bytes_constant;
  }

  Unpickled run() {
    while (true) {
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {
        op_at_ = at;
        fail_unless(!stack_.empty(), "STOP on an empty stack");
        out_.root = stack_.back();
        finish_dicts();
        return std::move(out_);
      }
      step(op, at);
    }
  }

 private:
  // Reading the stream.
  const char* take(std::size_t n) {
    TORCH_CHECK(n <= in_.size() - pos_, "'", source_, "': its pickle ends at byte ", in_.size(),
                " before its STOP opcode (the file is truncated or damaged)");
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t unsigned_le(std::size_t n) { return little_endian(take(n), n); }
  int64_t signed_le(uint64_t n) {
    fail_unless(n <= 8, "an integer of " + std::to_string(n) + " bytes (at most 8 are read)");
    if (n == 0) return 0;
    uint64_t v = unsigned_le(n);
    if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    int64_t out;
    std::memcpy(&out, &v, sizeof out);
    return out;
  }
  std::string counted(uint64_t n) {
    fail_unless(n <= in_.size() - pos_, "a string longer than the rest of the pickle");
    return std::string(take(static_cast<std::size_t>(n)), static_cast<std::size_t>(n));
  }
  std::string line() {
    const auto end = in_.find('\n', pos_);
    fail_unless(end != std::string::npos, "a GLOBAL without its newline");
    std::string out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const {
    TORCH_CHECK(false, "'", source_, "': its pickle holds ", what, " (at byte ", op_at_, ")");
  }
  void fail_unless(bool ok, const std::string& what) const {
    if (!ok) fail(what);
  }

  // The arena's budget: every allocation is counted before it is made.
  void charge(std::size_t bytes) {
    fail_unless(bytes <= budget_ - std::min(budget_, out_.bytes),
                "values of more than " + std::to_string(budget_) + " bytes (the budget of a " +
                    std::to_string(limits_.file_size != 0 ? limits_.file_size : in_.size()) +
                    "-byte file: " + std::to_string(limits_.bytes_per_file_byte) +
                    " bytes per byte and " + std::to_string(limits_.bytes_constant) + " more)");
    out_.bytes += bytes;
  }
  // Room for `more` items, counted as the vector will grow (doubling).
  template <typename T>
  void reserve_more(std::vector<T>& v, std::size_t more) {
    if (v.size() + more <= v.capacity()) return;
    const std::size_t capacity = std::max(v.size() + more, 2 * v.capacity());
    charge((capacity - v.capacity()) * sizeof(T) + (v.capacity() == 0 ? 16 : 0));
    v.reserve(capacity);
  }

  // Values and the stack.
  uint32_t make(Kind kind, uint32_t slot = 0) {
    reserve_more(out_.values, 1);
    fail_unless(out_.values.size() < kNone, "more values than 32-bit indices reach");
    out_.values.push_back(Value{kind, false, slot, 0});
    return static_cast<uint32_t>(out_.values.size() - 1);
  }
  Value value(uint32_t id) const { return out_.values[id]; }
  std::vector<uint32_t>& sequence(uint32_t id) { return out_.sequences[out_.values[id].slot]; }
  const std::string& text(uint32_t id) const { return out_.texts[out_.values[id].slot]; }
  void push(uint32_t id) {
    reserve_more(stack_, 1);
    stack_.push_back(id);
  }
  uint32_t pop() {
    fail_unless(stack_.size() > (marks_.empty() ? 0 : marks_.back()), "a pop from an empty stack");
    const uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t top() {
    fail_unless(stack_.size() > (marks_.empty() ? 0 : marks_.back()), "a read of an empty stack");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    fail_unless(!marks_.empty(), "an opcode that needs a MARK without one");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  uint32_t make_sequence(Kind kind, std::vector<uint32_t> items) {
    reserve_more(out_.sequences, 1);
    charge(items.capacity() * sizeof(uint32_t) + (items.capacity() ? 16 : 0));
    const uint32_t id = make(kind, static_cast<uint32_t>(out_.sequences.size()));
    out_.sequences.push_back(std::move(items));
    return id;
  }
  uint32_t make_text(Kind kind, std::string text) {
    reserve_more(out_.texts, 1);
    // Beyond the 15 characters std::string keeps in itself, a heap block.
    charge(text.capacity() > 15 ? text.capacity() + 1 + 16 : 0);
    const uint32_t id = make(kind, static_cast<uint32_t>(out_.texts.size()));
    out_.texts.push_back(std::move(text));
    return id;
  }
  // Charged before the tensor is made: its TensorImpl, and its sizes and strides beyond the five
  // that it keeps in itself.
  void charge_tensor(std::size_t dims) {
    reserve_more(out_.tensors, 1);
    charge(kTensorBytes + (dims > 5 ? 16 * dims : 0));
  }
  uint32_t make_tensor(Kind kind, at::Tensor tensor) {
    const uint32_t id = make(kind, static_cast<uint32_t>(out_.tensors.size()));
    out_.tensors.push_back(std::move(tensor));
    return id;
  }
  Value expect(uint32_t id, Kind kind, const char* what) const {
    const Value v = value(id);
    fail_unless(v.kind == kind,
                std::string(what) + " that is " + describe(v.kind) + ", not " + describe(kind));
    return v;
  }

  // Dict keys: each value's key id is found once and kept, so that a key used again (through the
  // memo) costs nothing, and a tuple's id comes from its items' ids, never from their whole text.
  struct KeyOrder {
    const Machine* m;
    bool operator()(const KeyDescription& a, const KeyDescription& b) const {
      if (a.kind != b.kind) return a.kind < b.kind;
      switch (a.kind) {
        case KeyDescription::Kind::None:
          return false;
        case KeyDescription::Kind::Number:
        case KeyDescription::Kind::Float:
          return a.number < b.number;
        case KeyDescription::Kind::Identity:
          return a.source < b.source;
        case KeyDescription::Kind::String:
        case KeyDescription::Kind::Bytes:
          return m->text(a.source) < m->text(b.source);
        case KeyDescription::Kind::Tuple: {
          const uint32_t* p = m->key_items_.data();
          return std::lexicographical_compare(p + a.begin, p + a.begin + a.length, p + b.begin,
                                              p + b.begin + b.length);
        }
      }
      return false;
    }
  };
  uint32_t key_id(uint32_t id, std::size_t depth) {
    fail_unless(depth <= limits_.max_depth,
                "a dict key nested deeper than " + std::to_string(limits_.max_depth));
    if (id < key_ids_.size() && key_ids_[id] != kNone) return key_ids_[id];
    const Value v = value(id);
    KeyDescription key;
    switch (v.kind) {
      case Kind::None:
        break;
      case Kind::Bool:
      case Kind::Int:
        key.kind = KeyDescription::Kind::Number;
        key.number = v.integer;
        break;
      case Kind::Float: {
        double d;
        std::memcpy(&d, &v.integer, sizeof d);
        // 1.0 == 1 and -0.0 == 0 in Python, and a NaN equals only itself.
        if (std::isnan(d)) {
          key.kind = KeyDescription::Kind::Identity;
          key.source = id;
        } else if (std::trunc(d) == d && d >= -9.2e18 && d <= 9.2e18) {
          key.kind = KeyDescription::Kind::Number;
          key.number = static_cast<int64_t>(d);
        } else {
          key.kind = KeyDescription::Kind::Float;
          key.number = v.integer;
        }
        break;
      }
      case Kind::String:
      case Kind::Bytes:
        key.kind =
            v.kind == Kind::String ? KeyDescription::Kind::String : KeyDescription::Kind::Bytes;
        key.source = id;
        break;
      case Kind::Tuple: {
        std::vector<uint32_t> items;
        const std::size_t n = out_.sequences[v.slot].size();
        items.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
          items.push_back(key_id(out_.sequences[v.slot][i], depth + 1));
        }
        key.kind = KeyDescription::Kind::Tuple;
        key.begin = static_cast<uint32_t>(key_items_.size());
        key.length = static_cast<uint32_t>(n);
        reserve_more(key_items_, n);
        key_items_.insert(key_items_.end(), items.begin(), items.end());
        break;
      }
      default:
        fail(std::string("a dict key that is ") + describe(v.kind));
    }
    uint32_t found;
    auto it = keys_.find(key);
    if (it != keys_.end()) {
      found = it->second;
      if (key.kind == KeyDescription::Kind::Tuple) key_items_.resize(key.begin);
    } else {
      charge(kNodeBytes);
      found = static_cast<uint32_t>(keys_.size());
      keys_.emplace(key, found);
    }
    if (key_ids_.size() <= id) {
      reserve_more(key_ids_, out_.values.size() - key_ids_.size());
      key_ids_.resize(out_.values.size(), kNone);
    }
    key_ids_[id] = found;
    return found;
  }
  // Every key is appended as it is set; a key set again is merged at the end (finish_dicts), as
  // Python keeps it: the first key's place, the last value.
  void set_item(uint32_t dict, uint32_t key, uint32_t item) {
    expect(dict, Kind::Dict, "a SETITEM target");
    key_id(key, 0);
    reserve_more(sequence(dict), 2);
    sequence(dict).push_back(key);
    sequence(dict).push_back(item);
  }
  void finish_dicts() {
    for (const Value& v : out_.values) {
      if (v.kind != Kind::Dict) continue;
      std::vector<uint32_t>& items = out_.sequences[v.slot];
      const std::size_t n = items.size() / 2;
      if (n < 2) continue;
      charge(n * 2 * sizeof(uint32_t));
      std::vector<uint32_t> order(n);  // entries by key id, then by position
      for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const uint32_t ka = key_ids_[items[2 * a]], kb = key_ids_[items[2 * b]];
        return ka != kb ? ka < kb : a < b;
      });
      std::vector<uint32_t> keep(n, 1);
      for (std::size_t i = 0; i < n;) {
        std::size_t j = i + 1;
        while (j < n && key_ids_[items[2 * order[j]]] == key_ids_[items[2 * order[i]]]) {
          keep[order[j++]] = 0;
        }
        items[2 * order[i] + 1] = items[2 * order[j - 1] + 1];
        i = j;
      }
      std::size_t out = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (!keep[i]) continue;
        items[2 * out] = items[2 * i];
        items[2 * out + 1] = items[2 * i + 1];
        ++out;
      }
      items.resize(2 * out);
      out_.bytes -= n * 2 * sizeof(uint32_t);
    }
  }

  // The allowed callables.
  uint32_t call(uint32_t callable, uint32_t args_id) {
    const std::string name = out_.texts[expect(callable, Kind::Global, "a call of something").slot];
    const std::size_t count =
        out_.sequences[expect(args_id, Kind::Tuple, "call arguments").slot].size();
    fail_unless(count <= kMaxArguments,
                "a call of " + name + " with " + std::to_string(count) + " arguments");
    const std::vector<uint32_t> args = sequence(args_id);
    if (name == kOrderedDict) {
      fail_unless(args.empty(), "collections.OrderedDict called with arguments");
      const uint32_t id = make_sequence(Kind::Dict, {});
      out_.values[id].ordered = true;
      return id;
    }
    if (name == kRebuildTensor) return rebuild_tensor(args);
    if (name == kRebuildParameter) {
      fail_unless(args.size() >= 2 && args.size() <= 3,
                  "_rebuild_parameter with " + std::to_string(args.size()) + " arguments");
      expect(args[0], Kind::Tensor, "a parameter's data");
      return args[0];
    }
    if (name == kSize) {
      fail_unless(args.size() == 1, "torch.Size called without one tuple");
      const Value dims = expect(args[0], Kind::Tuple, "torch.Size's argument");
      fail_unless(out_.sequences[dims.slot].size() <= kMaxDimensions,
                  "a torch.Size of more than " + std::to_string(kMaxDimensions) + " dimensions");
      for (uint32_t d : out_.sequences[dims.slot]) expect(d, Kind::Int, "a torch.Size dimension");
      return args[0];
    }
    if (name == kDevice) {
      fail_unless(!args.empty() && args.size() <= 2, "torch.device with a wrong argument count");
      const std::string& type = out_.texts[expect(args[0], Kind::String, "a device type").slot];
      fail_unless(type.size() <= kMaxGlobalName,
                  "a device type of " + std::to_string(type.size()) + " characters");
      std::string device = type;
      if (args.size() == 2) {
        device += ":" + std::to_string(expect(args[1], Kind::Int, "a device index").integer);
      }
      return make_text(Kind::String, std::move(device));
    }
    if (name == kEncode) return encode(args);
    if (name == kRestoreTypeTag) {
      fail_unless(args.size() == 2,
                  "restore_type_tag with " + std::to_string(args.size()) + " arguments");
      return args[0];
    }
    fail("a call of " + name + ", which is not callable");
  }

  // Python 3 writes bytes in protocol 2 as _codecs.encode(text, "latin1"). Each text is encoded
  // once: encoding it again (through the memo) gives the same bytes value, as immutable bytes
  // may be shared.
  uint32_t encode(const std::vector<uint32_t>& args) {
    fail_unless(args.size() == 2,
                "_codecs.encode with " + std::to_string(args.size()) + " arguments");
    const Value source = expect(args[0], Kind::String, "encoded text");
    const std::string& codec = out_.texts[expect(args[1], Kind::String, "a codec name").slot];
    fail_unless(codec == "latin1" || codec == "latin-1", "_codecs.encode to " + excerpt(codec));
    auto cached = encoded_.find(args[0]);
    if (cached != encoded_.end()) return cached->second;
    const std::string& from = out_.texts[source.slot];
    std::string bytes;
    bytes.reserve(from.size());
    for (std::size_t i = 0; i < from.size(); ++i) {
      const auto c = static_cast<unsigned char>(from[i]);
      if (c < 0x80) {
        bytes.push_back(static_cast<char>(c));
      } else {
        fail_unless((c == 0xc2 || c == 0xc3) && i + 1 < from.size(),
                    "latin1 text with a character above U+00FF");
        const auto next = static_cast<unsigned char>(from[++i]);
        bytes.push_back(static_cast<char>(((c & 0x03) << 6) | (next & 0x3f)));
      }
    }
    const uint32_t id = make_text(Kind::Bytes, std::move(bytes));
    charge(kNodeBytes);
    encoded_.emplace(args[0], id);
    return id;
  }

  // A tuple of non-negative ints, its length checked before its items are read.
  std::vector<int64_t> int_tuple(uint32_t id, const char* what) {
    const Value tuple = expect(id, Kind::Tuple, what);
    const std::vector<uint32_t>& items = out_.sequences[tuple.slot];
    fail_unless(items.size() <= kMaxDimensions,
                "a tensor of more than " + std::to_string(kMaxDimensions) + " dimensions");
    std::vector<int64_t> out;
    for (uint32_t item : items) {
      const int64_t v = expect(item, Kind::Int, what).integer;
      fail_unless(v >= 0, std::string(what) + " with a negative entry");
      out.push_back(v);
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
  // metadata]): a strided view of a storage, checked to lie inside it.
  uint32_t rebuild_tensor(const std::vector<uint32_t>& args) {
    fail_unless(args.size() == 6 || args.size() == 7,
                "_rebuild_tensor_v2 with " + std::to_string(args.size()) + " arguments");
    const Value storage_value = expect(args[0], Kind::Storage, "a tensor's storage");
    const int64_t offset = expect(args[1], Kind::Int, "a storage offset").integer;
    const std::vector<int64_t> sizes = int_tuple(args[2], "a tensor size");
    const std::vector<int64_t> strides = int_tuple(args[3], "a tensor stride");
    fail_unless(sizes.size() == strides.size(), "a tensor whose size and stride differ in length");
    const int64_t available = out_.tensors[storage_value.slot].numel();
    fail_unless(offset >= 0 && offset <= available, "a storage offset outside its storage");
    bool empty = false;
    for (int64_t s : sizes) empty = empty || s == 0;
    if (!empty) {
      // The last element's index, offset + sum((size - 1) * stride), must lie in the storage.
      int64_t last = offset;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        int64_t step = 0;
        const bool overflow = __builtin_mul_overflow(sizes[i] - 1, strides[i], &step) ||
                              __builtin_add_overflow(last, step, &last);
        fail_unless(!overflow && last < available,
                    "a tensor that reaches past the end of its storage");
      }
    }
    charge_tensor(sizes.size());
    at::Tensor view = out_.tensors[storage_value.slot].as_strided(sizes, strides, offset);
    return make_tensor(Kind::Tensor, std::move(view));
  }

  // BINPERSID: ('storage', storage type, record, location, numel). Each record is loaded once;
  // a key used again, by the same text value (through the memo) or an equal one, finds it.
  uint32_t persistent_load(uint32_t pid_id) {
    const Value pid_value = expect(pid_id, Kind::Tuple, "a persistent id");
    fail_unless(out_.sequences[pid_value.slot].size() == 5,
                "a persistent id that is not ('storage', type, key, location, numel)");
    const std::vector<uint32_t> pid = out_.sequences[pid_value.slot];
    fail_unless(value(pid[0]).kind == Kind::String && text(pid[0]) == "storage",
                "a persistent id that is not ('storage', type, key, location, numel)");
    const std::string& type = out_.texts[expect(pid[1], Kind::Global, "a storage type").slot];
    auto dtype = storage_types().find(type);
    fail_unless(dtype != storage_types().end(), "a storage of type " + type);
    const std::string& record = out_.texts[expect(pid[2], Kind::String, "a storage key").slot];
    expect(pid[3], Kind::String, "a storage location");
    const int64_t numel = expect(pid[4], Kind::Int, "a storage size").integer;
    fail_unless(numel >= 0, "a storage of negative size");
    uint32_t storage = kNone;
    if (auto by_value = storage_of_key_.find(pid[2]); by_value != storage_of_key_.end()) {
      storage = by_value->second;
    } else if (auto by_text = storages_.find(record); by_text != storages_.end()) {
      storage = by_text->second;
    } else {
      fail_unless(record.size() <= kMaxNameLength,
                  "a storage key of " + std::to_string(record.size()) + " characters");
      const c10::ScalarType scalar_type = dtype->second;
      const std::string name = record;  // the loader may make values: `record` may move
      charge_tensor(1);
      charge(kNodeBytes + name.size());
      at::Tensor data = load_(scalar_type, name, numel);
      storage = make_tensor(Kind::Storage, std::move(data));
      storages_.emplace(name, storage);
    }
    if (!storage_of_key_.count(pid[2])) {
      charge(kNodeBytes);
      storage_of_key_.emplace(pid[2], storage);
    }
    const at::Tensor& t = out_.tensors[value(storage).slot];
    fail_unless(t.scalar_type() == dtype->second && t.numel() == numel,
                "two different storages under key " + excerpt(text(pid[2])));
    return storage;
  }

  void memo_put(uint64_t index) {
    const uint32_t id = top();
    fail_unless(index < limits_.max_memo, "a memo index of " + std::to_string(index) +
                                              " (memo slots stop at " +
                                              std::to_string(limits_.max_memo) + ")");
    if (index >= memo_.size()) {
      reserve_more(memo_, index + 1 - memo_.size());
      memo_.resize(index + 1, kNone);
    }
    if (memo_[index] == kNone) ++memo_count_;
    memo_[index] = id;
  }
  uint32_t memo_get(uint64_t index) {
    fail_unless(index < memo_.size() && memo_[index] != kNone,
                "a memo read of an empty slot " + std::to_string(index));
    return memo_[index];
  }

  void step(unsigned char op, std::size_t at) {
    op_at_ = at;
    switch (op) {
      case 0x80: {  // PROTO
        const auto version = unsigned_le(1);
        fail_unless(version >= 2 && version <= 5,
                    "pickle protocol " + std::to_string(version) + " (2 to 5 are read)");
        return;
      }
      case 0x95:  // FRAME: a length hint only
        unsigned_le(8);
        return;
      case '(':
        fail_unless(marks_.size() < limits_.max_depth,
                    "MARKs nested deeper than " + std::to_string(limits_.max_depth));
        marks_.push_back(stack_.size());
        return;
      case '0':  // POP (of the mark itself when nothing lies above it)
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();
        } else {
          pop();
        }
        return;
      case '1':  // POP_MARK
        pop_mark();
        return;
      case '2':  // DUP
        push(top());
        return;
      case 'N':
        push(make(Kind::None));
        return;
      case 0x88:
      case 0x89:
        push_integer(Kind::Bool, op == 0x88 ? 1 : 0);
        return;
      case 'J':
        push_integer(Kind::Int, signed_le(4));
        return;
      case 'K':
        push_integer(Kind::Int, static_cast<int64_t>(unsigned_le(1)));
        return;
      case 'M':
        push_integer(Kind::Int, static_cast<int64_t>(unsigned_le(2)));
        return;
      case 0x8a:  // LONG1
        push_integer(Kind::Int, signed_le(unsigned_le(1)));
        return;
      case 0x8b:  // LONG4
        push_integer(Kind::Int, signed_le(unsigned_le(4)));
        return;
      case 'G': {
        const uint64_t bits = unsigned_be(8);
        int64_t integer;
        std::memcpy(&integer, &bits, sizeof integer);
        push_integer(Kind::Float, integer);
        return;
      }
      case 'X':
        push(make_text(Kind::String, counted(unsigned_le(4))));
        return;
      case 0x8c:
        push(make_text(Kind::String, counted(unsigned_le(1))));
        return;
      case 0x8d:
        push(make_text(Kind::String, counted(unsigned_le(8))));
        return;
      case 'T':  // BINSTRING
        push(make_text(Kind::String, counted(unsigned_le(4))));
        return;
      case 'U':  // SHORT_BINSTRING
        push(make_text(Kind::String, counted(unsigned_le(1))));
        return;
      case 'B':
        push(make_text(Kind::Bytes, counted(unsigned_le(4))));
        return;
      case 'C':
        push(make_text(Kind::Bytes, counted(unsigned_le(1))));
        return;
      case 0x8e:
        push(make_text(Kind::Bytes, counted(unsigned_le(8))));
        return;
      case ')':
        push(make_sequence(Kind::Tuple, {}));
        return;
      case 't':
        push(make_sequence(Kind::Tuple, pop_mark()));
        return;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<uint32_t> items(static_cast<std::size_t>(op - 0x84));
        for (std::size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(make_sequence(Kind::Tuple, std::move(items)));
        return;
      }
      case ']':
        push(make_sequence(Kind::List, {}));
        return;
      case 'l':
        push(make_sequence(Kind::List, pop_mark()));
        return;
      case 'a': {
        const uint32_t item = pop();
        const uint32_t list = top();
        expect(list, Kind::List, "an APPEND target");
        reserve_more(sequence(list), 1);
        sequence(list).push_back(item);
        return;
      }
      case 'e': {
        const std::vector<uint32_t> items = pop_mark();
        const uint32_t list = top();
        expect(list, Kind::List, "an APPENDS target");
        reserve_more(sequence(list), items.size());
        sequence(list).insert(sequence(list).end(), items.begin(), items.end());
        return;
      }
      case '}':
        push(make_sequence(Kind::Dict, {}));
        return;
      case 'd': {
        const std::vector<uint32_t> items = pop_mark();
        fail_unless(items.size() % 2 == 0, "a DICT of an odd number of items");
        const uint32_t dict = make_sequence(Kind::Dict, {});
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        push(dict);
        return;
      }
      case 's': {
        const uint32_t item = pop();
        const uint32_t key = pop();
        set_item(top(), key, item);
        return;
      }
      case 'u': {
        const std::vector<uint32_t> items = pop_mark();
        fail_unless(items.size() % 2 == 0, "a SETITEMS of an odd number of items");
        const uint32_t dict = top();
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        return;
      }
      case 'c': {
        const std::string module = line();
        push_global(module, line());
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t name = expect(pop(), Kind::String, "a global's name").slot;
        const uint32_t module = expect(pop(), Kind::String, "a global's module").slot;
        push_global(out_.texts[module], out_.texts[name]);
        return;
      }
      case 'R': {
        const uint32_t args = pop();
        const uint32_t callable = pop();
        push(call(callable, args));
        return;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), for OrderedDict only
        const uint32_t args = pop();
        const uint32_t cls = pop();
        const std::string& name = out_.texts[expect(cls, Kind::Global, "a NEWOBJ class").slot];
        fail_unless(name == kOrderedDict, "a NEWOBJ of " + name);
        push(call(cls, args));
        return;
      }
      case 'b': {  // BUILD: an OrderedDict's attributes (its _metadata); ignored
        const uint32_t state = pop();
        const Value target = value(top());
        fail_unless(target.kind == Kind::Dict && target.ordered,
                    std::string("a BUILD of ") + describe(target.kind));
        const Kind kind = value(state).kind;
        fail_unless(kind == Kind::Dict || kind == Kind::None,
                    "an OrderedDict state that is " + std::string(describe(kind)));
        return;
      }
      case 'Q':
        push(persistent_load(pop()));
        return;
      case 'q':
        memo_put(unsigned_le(1));
        return;
      case 'r':
        memo_put(unsigned_le(4));
        return;
      case 0x94:  // MEMOIZE
        memo_put(memo_count_);
        return;
      case 'h':
        push(memo_get(unsigned_le(1)));
        return;
      case 'j':
        push(memo_get(unsigned_le(4)));
        return;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("opcode ") + hex + ", which torch.save does not write");
      }
    }
  }

  uint64_t unsigned_be(std::size_t n) {
    const char* p = take(n);
    uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
  }
  void push_integer(Kind kind, int64_t v) {
    const uint32_t id = make(kind);
    out_.values[id].integer = v;
    push(id);
  }
  void push_global(const std::string& module, const std::string& name) {
    // No allowed name is long: a long one is refused before it is joined, and quoted cut short.
    const bool short_name = module.size() + name.size() < kMaxGlobalName;
    std::string full = short_name ? module + "." + name : excerpt(module) + "." + excerpt(name);
    TORCH_CHECK(short_name && allowed_global(full), "'", source_, "' refers to the Python global '",
                full,
                "', which loading refuses: a weight file may only use the globals of PyTorch's ",
                "weights_only loader (collections.OrderedDict, torch._utils._rebuild_tensor_v2, ",
                "torch._utils._rebuild_parameter, the torch.*Storage types, torch.Size, ",
                "torch.device, _codecs.encode) and torch.jit._pickle.restore_type_tag");
    push(make_text(Kind::Global, std::move(full)));
  }

  const std::string& in_;
  const StorageLoader& load_;
  const std::string& source_;
  const UnpicklerLimits& limits_;
  std::size_t budget_ = 0;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  Unpickled out_;
  std::vector<uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::vector<uint32_t> memo_;  // value ids by memo index, kNone where empty
  std::size_t memo_count_ = 0;
  std::vector<uint32_t> key_ids_;    // by value id, kNone until asked
  std::vector<uint32_t> key_items_;  // the items' key ids of tuple keys
  std::map<KeyDescription, uint32_t, KeyOrder> keys_;
  std::map<std::string, uint32_t> storages_;     // storage values by record name
  std::map<uint32_t, uint32_t> storage_of_key_;  // storage values by the key's text value
  std::map<uint32_t, uint32_t> encoded_;         // bytes values by the encoded text value
};

}  // namespace

const char* describe(Value::Kind kind) {
  switch (kind) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "a bool";
    case Kind::Int:
      return "an int";
    case Kind::Float:
      return "a float";
    case Kind::String:
      return "a string";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "a tuple";
    case Kind::List:
      return "a list";
    case Kind::Dict:
      return "a dict";
    case Kind::Tensor:
      return "a tensor";
    case Kind::Storage:
      return "a storage";
    case Kind::Global:
      return "a global";
  }
  return "a value";
}

Unpickled unpickle(const std::string& pickle, const StorageLoader& load_storage,
                   const std::string& source, const UnpicklerLimits& limits) {
  return Machine(pickle, load_storage, source, limits).run();
}

}  // namespace serialization
}  // namespace attention
