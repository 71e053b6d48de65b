// The restricted unpickler on hand-made pickles: what it builds, what it refuses, its limits.

#include "serialization/unpickler.h"

#include "helpers.h"

#include <torch/torch.h>

#include <algorithm>

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
  REQUIRE(out.at(out.root).kind == Value::Kind::Dict);
  REQUIRE(out.dict_size(out.root) == 2);
  const auto& root = out.items(out.root);
  CHECK(out.text(root[0]) == "a");
  CHECK(out.at(root[1]).integer == 7);
  REQUIRE(out.at(root[3]).kind == Value::Kind::Tuple);
  const auto& pair = out.items(root[3]);
  CHECK(out.at(pair[1]).kind == Value::Kind::Bytes);
  CHECK(out.text(pair[1]) == std::string(1, '\0'));
}

TEST_CASE("unpickler: tensors are views checked against their storage", "[unpickler]") {
  const auto good = unpickle(tensor_pickle(3, 2, 1, 7));
  const auto& t = good.tensor(good.root);
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

TEST_CASE("unpickler: limits on memory, memo and nesting", "[unpickler][errors]") {
  UnpicklerLimits limits;
  limits.bytes_per_file_byte = 0;
  limits.bytes_constant = 100;
  CHECK_THROWS_C10(unpickle(kProto + std::string(20, 'N') + ".", limits), c10::Error,
                   "values of more than 100 bytes");
  limits = {};
  limits.max_memo = 2;
  CHECK_THROWS_C10(unpickle(kProto + b("Nq\x00q\x01q\x02."), limits), c10::Error,
                   "a memo index of 2 (memo slots stop at 2)");
  CHECK_THROWS_C10(unpickle(kProto + b("Nr\xff\xff\xff\xff.")), c10::Error,
                   "a memo index of 4294967295 (memo slots stop at 1048576)");
  CHECK_THROWS_C10(unpickle(kProto + std::string(300, '(') + "N."), c10::Error,
                   "MARKs nested deeper than 256");
  // A list that holds itself is a value like any other: no recursion, no leak.
  const auto out = unpickle(kProto + b("]q\x00h\x00"
                                       "a."));
  CHECK(out.items(out.root) == std::vector<uint32_t>{out.root});
}

TEST_CASE("unpickler: memory is counted in bytes, against the pickle's size",
          "[unpickler][errors]") {
  // NONE opcodes: a pickle of 2^22 of them made 645 MiB of values when values were counted one
  // by one. Each now takes 16 bytes and 4 on the stack: past the budget of 16 bytes per byte of
  // the file (and 16 MiB), 8 MiB of them are refused.
  const std::string nones = kProto + std::string(1 << 23, 'N') + ".";
  CHECK_THROWS_C10(unpickle(nones), c10::Error,
                   "values of more than " + std::to_string(16 * nones.size() + (16 << 20)) +
                       " bytes (the budget of a 8388611-byte file");
  // DUP grows the stack alone; it is counted as well.
  UnpicklerLimits tight;
  tight.bytes_per_file_byte = 2;
  tight.bytes_constant = 0;
  CHECK_THROWS_C10(unpickle(kProto + "N" + std::string(1 << 20, '2') + ".", tight), c10::Error,
                   "values of more than");
  // What a real state dict takes stays far below its budget.
  const std::string saved = test::read_bytes(std::string(test::source_dir()) +
                                             "/tests/fuzz/corpus/unpickler/book_mha.pkl");
  const auto book = unpickle(saved);
  INFO(book.bytes << " bytes counted for a " << saved.size() << "-byte pickle");
  CHECK(book.bytes < 16 * saved.size() + (16 << 20));
  CHECK(book.bytes > saved.size());
}

TEST_CASE("unpickler: a value used again through the memo is never copied or re-read",
          "[unpickler]") {
  // A dict key of 30 nested pairs of one empty tuple: its text doubled with each level (2^30
  // characters); its identity is now built from its items' once.
  std::string nested = kProto + "})";
  for (int i = 0; i < 30; ++i) nested += "2\x86";
  const auto keyed = unpickle(nested + "Ns.");
  CHECK(keyed.dict_size(keyed.root) == 1);
  // One 4 MiB key set 10^6 times: one entry, the key's text hashed once.
  std::string setitems = kProto + "}X" + std::string(b("\x00\x00\x40\x00")) +
                         std::string(4 << 20, 'k') +
                         b("q\x00"
                           "0"
                           "Nq\x01"
                           "0");
  for (int i = 0; i < 1000000; ++i) setitems += b("h\x00h\x01s");
  const auto set = unpickle(setitems + ".");
  CHECK(set.dict_size(set.root) == 1);
  CHECK(set.bytes < (32 << 20));
  // _codecs.encode of one memoized text, 60 times: one bytes value, shared.
  std::string encode = kProto + "]X" + std::string(b("\x00\x00\x00\x01")) +
                       std::string(16 << 20, 'a') +
                       b("q\x00"
                         "0") +
                       "c_codecs\nencode\nq\x01"
                       "0" +
                       b("X\x06\x00\x00\x00latin1q\x02"
                         "0");
  for (int i = 0; i < 60; ++i) encode += b("h\x01(h\x00h\x02tRa");
  const auto encoded = unpickle(encode + ".");
  const auto& list = encoded.items(encoded.root);
  REQUIRE(list.size() == 60);
  CHECK(std::all_of(list.begin(), list.end(), [&](uint32_t id) { return id == list[0]; }));
  CHECK(encoded.text(list[0]) == std::string(16 << 20, 'a'));
  CHECK(encoded.bytes < (40 << 20));
  // A memoized tuple of 10^5 ints as a tensor's size, again and again: refused by its length
  // before its items are read.
  std::string sizes = kProto + "(" + std::string(100000, 'N') + b("tq\x00") + "]";
  for (int i = 0; i < 1000; ++i) sizes += "ctorch\nSize\n" + b("h\x00\x85R") + "a";
  CHECK_THROWS_C10(unpickle(sizes + "."), c10::Error, "a torch.Size of more than 64 dimensions");
}

TEST_CASE("unpickler: dict keys compare as Python compares them", "[unpickler]") {
  // {1: 'a', True: 'b', 1.0: 'c', (1, 'x'): 'd', (1, 'x'): 'e', 'x': 'f', b'x': 'g'}: the first key
  // keeps its place and the last value wins; str and bytes differ.
  std::string p = kProto + "}(";
  p += "K\x01X" + b("\x01\x00\x00\x00") + "a";
  p += std::string(1, '\x88') + "X" + b("\x01\x00\x00\x00") + "b";
  p += "G" + b("\x3f\xf0\x00\x00\x00\x00\x00\x00") + "X" + b("\x01\x00\x00\x00") + "c";
  p += "K\x01X" + b("\x01\x00\x00\x00") + "x\x86X" + b("\x01\x00\x00\x00") + "d";
  p += "K\x01X" + b("\x01\x00\x00\x00") + "x\x86X" + b("\x01\x00\x00\x00") + "e";
  p += "X" + b("\x01\x00\x00\x00") + "xX" + b("\x01\x00\x00\x00") + "f";
  p += "C\x01xX" + b("\x01\x00\x00\x00") + "g";
  const auto out = unpickle(p + "u.");
  const auto& items = out.items(out.root);
  REQUIRE(out.dict_size(out.root) == 4);
  CHECK(out.at(items[0]).kind == Value::Kind::Int);
  CHECK(out.text(items[1]) == "c");
  CHECK(out.at(items[2]).kind == Value::Kind::Tuple);
  CHECK(out.text(items[3]) == "e");
  CHECK(out.text(items[5]) == "f");
  CHECK(out.text(items[7]) == "g");
  CHECK_THROWS_C10(unpickle(kProto + "})" + std::string(300, '\x85') + "Ns."), c10::Error,
                   "a dict key nested deeper than 256");
}
