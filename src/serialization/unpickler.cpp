#include "serialization/unpickler.h"

#include "serialization/byte_source.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
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

bool allowed_global(const std::string& name) {
  return name == kOrderedDict || name == kRebuildTensor || name == kRebuildParameter ||
         name == kSize || name == kDevice || name == kEncode || name == kRestoreTypeTag ||
         storage_types().count(name) != 0;
}

class Machine {
 public:
  Machine(const std::string& in, const StorageLoader& load, const std::string& source,
          const UnpicklerLimits& limits)
      : in_(in), load_(load), source_(source), limits_(limits) {}

  Unpickled run() {
    while (true) {
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {
        fail_unless(!stack_.empty(), "STOP on an empty stack");
        out_.root = stack_.back();
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
  int64_t signed_le(std::size_t n) {
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

  // Values and the stack.
  uint32_t make(Kind kind) {
    fail_unless(out_.values.size() < limits_.max_values,
                "more than " + std::to_string(limits_.max_values) + " values");
    out_.values.emplace_back();
    out_.values.back().kind = kind;
    return static_cast<uint32_t>(out_.values.size() - 1);
  }
  Value& value(uint32_t id) { return out_.values[id]; }
  void push(uint32_t id) { stack_.push_back(id); }
  uint32_t pop() {
    fail_unless(stack_.size() > (marks_.empty() ? 0 : marks_.back()), "a pop from an empty stack");
    const uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  uint32_t& top() {
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
    const uint32_t id = make(kind);
    value(id).items = std::move(items);
    return id;
  }
  const Value& expect(uint32_t id, Kind kind, const char* what) {
    const Value& v = value(id);
    fail_unless(v.kind == kind,
                std::string(what) + " that is " + describe(v.kind) + ", not " + describe(kind));
    return v;
  }

  // Dict keys: a canonical text per hashable value, so that equal keys collide as in Python.
  std::string key_text(uint32_t id, std::size_t depth) {
    fail_unless(depth <= limits_.max_depth,
                "a dict key nested deeper than " + std::to_string(limits_.max_depth));
    const Value& v = value(id);
    switch (v.kind) {
      case Kind::None:
        return "N";
      case Kind::Bool:
      case Kind::Int:
        return "i" + std::to_string(v.integer);
      case Kind::Float: {
        uint64_t bits;
        std::memcpy(&bits, &v.real, sizeof bits);
        return "f" + std::to_string(bits);
      }
      case Kind::String:
        return "s" + std::to_string(v.text.size()) + ":" + v.text;
      case Kind::Bytes:
        return "y" + std::to_string(v.text.size()) + ":" + v.text;
      case Kind::Tuple: {
        std::string out = "t" + std::to_string(v.items.size()) + "(";
        // No value is made while keys are read, so `v` stays valid.
        for (uint32_t item : v.items) out += key_text(item, depth + 1) + ",";
        return out + ")";
      }
      default:
        fail(std::string("a dict key that is ") + describe(v.kind));
    }
  }
  void set_item(uint32_t dict, uint32_t key, uint32_t item) {
    expect(dict, Kind::Dict, "a SETITEM target");
    std::string text = key_text(key, 0);
    Value& d = value(dict);
    auto [it, inserted] = d.index.emplace(std::move(text), d.items.size());
    if (inserted) {
      d.items.push_back(key);
      d.items.push_back(item);
    } else {
      d.items[it->second + 1] = item;  // Python keeps the first key and the last value
    }
  }

  // The allowed callables.
  uint32_t call(uint32_t callable, uint32_t args_id) {
    const std::string name = expect(callable, Kind::Global, "a call of something").text;
    const std::vector<uint32_t> args = expect(args_id, Kind::Tuple, "call arguments").items;
    if (name == kOrderedDict) {
      fail_unless(args.empty(), "collections.OrderedDict called with arguments");
      const uint32_t id = make(Kind::Dict);
      value(id).ordered = true;
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
      const Value& dims = expect(args[0], Kind::Tuple, "torch.Size's argument");
      for (uint32_t d : dims.items) expect(d, Kind::Int, "a torch.Size dimension");
      return args[0];
    }
    if (name == kDevice) {
      fail_unless(!args.empty() && args.size() <= 2, "torch.device with a wrong argument count");
      const uint32_t id = make(Kind::String);
      value(id).text = expect(args[0], Kind::String, "a device type").text;
      if (args.size() == 2) {
        value(id).text +=
            ":" + std::to_string(expect(args[1], Kind::Int, "a device index").integer);
      }
      return id;
    }
    if (name == kEncode) return encode(args);
    if (name == kRestoreTypeTag) {
      fail_unless(args.size() == 2,
                  "restore_type_tag with " + std::to_string(args.size()) + " arguments");
      return args[0];
    }
    fail("a call of " + name + ", which is not callable");
  }

  // Python 3 writes bytes in protocol 2 as _codecs.encode(text, "latin1").
  uint32_t encode(const std::vector<uint32_t>& args) {
    fail_unless(args.size() == 2,
                "_codecs.encode with " + std::to_string(args.size()) + " arguments");
    const std::string& text = expect(args[0], Kind::String, "encoded text").text;
    const std::string& codec = expect(args[1], Kind::String, "a codec name").text;
    fail_unless(codec == "latin1" || codec == "latin-1", "_codecs.encode to " + codec);
    std::string bytes;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x80) {
        bytes.push_back(static_cast<char>(c));
      } else {
        fail_unless((c == 0xc2 || c == 0xc3) && i + 1 < text.size(),
                    "latin1 text with a character above U+00FF");
        const auto next = static_cast<unsigned char>(text[++i]);
        bytes.push_back(static_cast<char>(((c & 0x03) << 6) | (next & 0x3f)));
      }
    }
    const uint32_t id = make(Kind::Bytes);
    value(id).text = std::move(bytes);
    return id;
  }

  std::vector<int64_t> int_tuple(uint32_t id, const char* what) {
    std::vector<int64_t> out;
    for (uint32_t item : expect(id, Kind::Tuple, what).items) {
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
    const at::Tensor storage = expect(args[0], Kind::Storage, "a tensor's storage").tensor;
    const int64_t offset = expect(args[1], Kind::Int, "a storage offset").integer;
    const std::vector<int64_t> sizes = int_tuple(args[2], "a tensor size");
    const std::vector<int64_t> strides = int_tuple(args[3], "a tensor stride");
    fail_unless(sizes.size() == strides.size(), "a tensor whose size and stride differ in length");
    fail_unless(sizes.size() <= 64, "a tensor of more than 64 dimensions");
    const int64_t available = storage.numel();
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
    const uint32_t id = make(Kind::Tensor);
    value(id).tensor = storage.as_strided(sizes, strides, offset);
    return id;
  }

  // BINPERSID: ('storage', storage type, record, location, numel).
  uint32_t persistent_load(uint32_t pid_id) {
    const std::vector<uint32_t> pid = expect(pid_id, Kind::Tuple, "a persistent id").items;
    fail_unless(
        pid.size() == 5 && value(pid[0]).kind == Kind::String && value(pid[0]).text == "storage",
        "a persistent id that is not ('storage', type, key, location, numel)");
    const Value& type = expect(pid[1], Kind::Global, "a storage type");
    auto dtype = storage_types().find(type.text);
    fail_unless(dtype != storage_types().end(), "a storage of type " + type.text);
    const std::string record = expect(pid[2], Kind::String, "a storage key").text;
    expect(pid[3], Kind::String, "a storage location");
    const int64_t numel = expect(pid[4], Kind::Int, "a storage size").integer;
    fail_unless(numel >= 0, "a storage of negative size");
    auto cached = storages_.find(record);
    if (cached != storages_.end()) {
      const at::Tensor& t = value(cached->second).tensor;
      fail_unless(t.scalar_type() == dtype->second && t.numel() == numel,
                  "two different storages under key " + record);
      return cached->second;
    }
    const uint32_t id = make(Kind::Storage);
    value(id).tensor = load_(dtype->second, record, numel);
    storages_.emplace(record, id);
    return id;
  }

  void memo_put(uint64_t index) {
    const uint32_t id = top();
    auto it = memo_.find(index);
    if (it == memo_.end()) {
      fail_unless(memo_.size() < limits_.max_memo,
                  "a memo of more than " + std::to_string(limits_.max_memo) + " entries");
      memo_.emplace(index, id);
    } else {
      it->second = id;
    }
  }
  uint32_t memo_get(uint64_t index) {
    auto it = memo_.find(index);
    fail_unless(it != memo_.end(), "a memo read of an empty slot " + std::to_string(index));
    return it->second;
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
      case 0x89: {
        const uint32_t id = make(Kind::Bool);
        value(id).integer = op == 0x88 ? 1 : 0;
        push(id);
        return;
      }
      case 'J':
        push_int(signed_le(4));
        return;
      case 'K':
        push_int(static_cast<int64_t>(unsigned_le(1)));
        return;
      case 'M':
        push_int(static_cast<int64_t>(unsigned_le(2)));
        return;
      case 0x8a:
        push_int(signed_le(unsigned_le(1)));
        return;  // LONG1
      case 0x8b:
        push_int(signed_le(unsigned_le(4)));
        return;  // LONG4
      case 'G': {
        const uint64_t bits = unsigned_be(8);
        const uint32_t id = make(Kind::Float);
        std::memcpy(&value(id).real, &bits, sizeof bits);
        push(id);
        return;
      }
      case 'X':
        push_text(Kind::String, counted(unsigned_le(4)));
        return;
      case 0x8c:
        push_text(Kind::String, counted(unsigned_le(1)));
        return;
      case 0x8d:
        push_text(Kind::String, counted(unsigned_le(8)));
        return;
      case 'T':
        push_text(Kind::String, counted(unsigned_le(4)));
        return;  // BINSTRING
      case 'U':
        push_text(Kind::String, counted(unsigned_le(1)));
        return;  // SHORT_BINSTRING
      case 'B':
        push_text(Kind::Bytes, counted(unsigned_le(4)));
        return;
      case 'C':
        push_text(Kind::Bytes, counted(unsigned_le(1)));
        return;
      case 0x8e:
        push_text(Kind::Bytes, counted(unsigned_le(8)));
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
        expect(top(), Kind::List, "an APPEND target");
        value(top()).items.push_back(item);
        return;
      }
      case 'e': {
        const std::vector<uint32_t> items = pop_mark();
        expect(top(), Kind::List, "an APPENDS target");
        auto& list = value(top()).items;
        list.insert(list.end(), items.begin(), items.end());
        return;
      }
      case '}':
        push(make(Kind::Dict));
        return;
      case 'd': {
        const std::vector<uint32_t> items = pop_mark();
        fail_unless(items.size() % 2 == 0, "a DICT of an odd number of items");
        const uint32_t dict = make(Kind::Dict);
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
        std::string module = line();
        push_global(module + "." + line());
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const std::string name = expect(pop(), Kind::String, "a global's name").text;
        const std::string module = expect(pop(), Kind::String, "a global's module").text;
        push_global(module + "." + name);
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
        fail_unless(expect(cls, Kind::Global, "a NEWOBJ class").text == kOrderedDict,
                    "a NEWOBJ of " + value(cls).text);
        push(call(cls, args));
        return;
      }
      case 'b': {  // BUILD: an OrderedDict's attributes (its _metadata); ignored
        const uint32_t state = pop();
        const Value& target = value(top());
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
      case 0x94:
        memo_put(memo_.size());
        return;  // MEMOIZE
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
  void push_int(int64_t v) {
    const uint32_t id = make(Kind::Int);
    value(id).integer = v;
    push(id);
  }
  void push_text(Kind kind, std::string text) {
    const uint32_t id = make(kind);
    value(id).text = std::move(text);
    push(id);
  }
  void push_global(std::string name) {
    TORCH_CHECK(allowed_global(name), "'", source_, "' refers to the Python global '", name,
                "', which loading refuses: a weight file may only use the globals of PyTorch's ",
                "weights_only loader (collections.OrderedDict, torch._utils._rebuild_tensor_v2, ",
                "torch._utils._rebuild_parameter, the torch.*Storage types, torch.Size, ",
                "torch.device, _codecs.encode) and torch.jit._pickle.restore_type_tag");
    const uint32_t id = make(Kind::Global);
    value(id).text = std::move(name);
    push(id);
  }

  const std::string& in_;
  const StorageLoader& load_;
  const std::string& source_;
  const UnpicklerLimits& limits_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  Unpickled out_;
  std::vector<uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::map<std::string, uint32_t> storages_;
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
