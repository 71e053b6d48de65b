// The restricted unpickler on hand-made pickles: what it builds, what it refuses, its limits.

#include "serialization/unpickler.h"

#include "helpers.h"

#include <torch/torch.h>

using attention::serialization::Unpickled;
using attention::serialization::UnpicklerLimits;
using attention::serialization::Value;

namespace {

// Storages of zeros, as many elements as asked for.
at::Tensor zeros_storage(c10::ScalarType dtype, const std::string&, int64_t numel) {
  return torch::zeros({numel}, torch::TensorOptions().dtype(dtype));
}

Unpickled unpickle(const std::string& pickle, const UnpicklerLimits& limits = {}) {
  return attention::serialization::unpickle(pickle, zeros_storage, "test.pkl", limits);
}

// A string literal with its embedded NUL bytes.
template <std::size_t N>
std::string b(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

const std::string kProto = b("\x80\x02");

// A pickled tensor of `numel` floats viewed with `size` and `stride` (one dimension).
std::string tensor_pickle(int sizes, int stride, int offset, int numel) {
  std::string p = kProto + "ctorch._utils\n_rebuild_tensor_v2\n(";
  p +=
      b("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
        "0X\x03\x00\x00\x00"
        "cpu");
  p += "K" + std::string(1, static_cast<char>(numel)) + "tQ";
  p += "K" + std::string(1, static_cast<char>(offset));
  p += "K" + std::string(1, static_cast<char>(sizes)) + "\x85";
  p += "K" + std::string(1, static_cast<char>(stride)) + "\x85";
  p += "\x89)tR.";
  return p;
}

}  // namespace

TEST_CASE("unpickler: builds dicts, lists, tuples and scalars as Python does", "[unpickler]") {
  // {"a": [1, -2, 3.5, None, True], "b": ("x", b"\x00"), "a": 7}: the later "a" wins, in place.
  std::string p = kProto + b("}(X\x01\x00\x00\x00"
                             "a](K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00N\x88"
                             "e");
  p +=
      b("X\x01\x00\x00\x00"
        "bX\x01\x00\x00\x00xC\x01\x00\x86");
  p +=
      b("X\x01\x00\x00\x00"
        "aK\x07u.");
  const auto out = unpickle(p);
  const Value& root = out.at(out.root);
  REQUIRE(root.kind == Value::Kind::Dict);
  REQUIRE(root.dict_size() == 2);
  CHECK(out.at(root.items[0]).text == "a");
  CHECK(out.at(root.items[1]).integer == 7);
  const Value& pair = out.at(root.items[3]);
  REQUIRE(pair.kind == Value::Kind::Tuple);
  CHECK(out.at(pair.items[1]).kind == Value::Kind::Bytes);
  CHECK(out.at(pair.items[1]).text == std::string(1, '\0'));
}

TEST_CASE("unpickler: tensors are views checked against their storage", "[unpickler]") {
  const auto good = unpickle(tensor_pickle(3, 2, 1, 7));
  const auto& t = good.at(good.root).tensor;
  CHECK(t.sizes() == c10::IntArrayRef{3});
  CHECK(t.strides() == c10::IntArrayRef{2});
  CHECK(t.storage_offset() == 1);
  CHECK_THROWS_C10(unpickle(tensor_pickle(4, 2, 1, 7)), c10::Error,
                   "a tensor that reaches past the end of its storage");
  CHECK_THROWS_C10(unpickle(tensor_pickle(1, 1, 9, 7)), c10::Error,
                   "a storage offset outside its storage");
  CHECK(unpickle(tensor_pickle(0, 1, 7, 7)).at(0).kind == Value::Kind::Global);
}

TEST_CASE("unpickler: refuses globals, opcodes and streams it does not read",
          "[unpickler][errors]") {
  CHECK_THROWS_C10(unpickle(kProto + b("cos\nsystem\n(X\x02\x00\x00\x00lstR.")), c10::Error,
                   "'test.pkl' refers to the Python global 'os.system', which loading refuses");
  CHECK_THROWS_C10(unpickle(kProto + "cbuiltins\neval\n."), c10::Error,
                   "the Python global 'builtins.eval'");
  // STACK_GLOBAL is checked the same way.
  CHECK_THROWS_C10(unpickle(std::string("\x80\x04\x8c\x02os\x8c\x06system\x93.", 16)), c10::Error,
                   "the Python global 'os.system'");
  CHECK_THROWS_C10(unpickle(kProto + "\x8f."), c10::Error,
                   "opcode 0x8f, which torch.save does not write (at byte 2)");
  CHECK_THROWS_C10(unpickle(kProto + "]K\x01"), c10::Error, "before its STOP opcode");
  CHECK_THROWS_C10(unpickle(std::string("\x80\x06N.", 4)), c10::Error, "pickle protocol 6");
  CHECK_THROWS_C10(unpickle(kProto + "ctorch._utils\n_rebuild_tensor_v2\n)R."), c10::Error,
                   "_rebuild_tensor_v2 with 0 arguments");
  CHECK_THROWS_C10(unpickle(kProto + "ctorch\nFloatStorage\n)R."), c10::Error,
                   "a call of torch.FloatStorage, which is not callable");
  CHECK_THROWS_C10(unpickle(kProto + "}]K\x01s."), c10::Error, "a dict key that is a list");
  CHECK_THROWS_C10(unpickle(kProto + b("h\x05.")), c10::Error, "a memo read of an empty slot 5");
  CHECK_THROWS_C10(unpickle(kProto + "a."), c10::Error, "a pop from an empty stack");
  CHECK_THROWS_C10(unpickle(kProto + "(K"), c10::Error, "before its STOP opcode");
}

TEST_CASE("unpickler: limits on values, memo and nesting", "[unpickler][errors]") {
  UnpicklerLimits limits;
  limits.max_values = 3;
  CHECK_THROWS_C10(unpickle(kProto + "NNNN.", limits), c10::Error, "more than 3 values");
  limits = {};
  limits.max_memo = 2;
  CHECK_THROWS_C10(unpickle(kProto + b("Nq\x00q\x01q\x02."), limits), c10::Error,
                   "a memo of more than 2 entries");
  CHECK_THROWS_C10(unpickle(kProto + std::string(300, '(') + "N."), c10::Error,
                   "MARKs nested deeper than 256");
  // A list that holds itself is a value like any other: no recursion, no leak.
  const auto out = unpickle(kProto + b("]q\x00h\x00"
                                       "a."));
  CHECK(out.at(out.root).items == std::vector<uint32_t>{out.root});
}
