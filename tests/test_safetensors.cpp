#include <attention/safetensors.h>

#include "helpers.h"

#include <torch/torch.h>

#include <cstring>

namespace {

// A safetensors file from a header text and a data section.
std::string file_of(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

attention::NamedTensors parse(const std::string& bytes) {
  return attention::parse_safetensors(bytes.data(), bytes.size());
}

}  // namespace

TEST_CASE("safetensors: every dtype, empty and scalar tensors round-trip bit for bit",
          "[safetensors]") {
  attention::NamedTensors tensors = {{"f32", torch::randn({2, 3})},
                                     {"f64", torch::randn({4}, torch::kDouble)},
                                     {"bf16", torch::randn({3, 2}).to(torch::kBFloat16)},
                                     {"f16", torch::randn({5}).to(torch::kHalf)},
                                     {"i64", torch::arange(6).view({2, 3})},
                                     {"i32", torch::arange(3, torch::kInt)},
                                     {"u8", torch::arange(4, torch::kByte)},
                                     {"bool", torch::tensor({true, false, true})},
                                     {"empty", torch::zeros({0, 3})},
                                     {"scalar", torch::tensor(2.5f)},
                                     {"strided", torch::randn({4, 4}).t()}};
  const auto bytes = attention::serialize_safetensors(tensors);
  CHECK(attention::looks_like_safetensors(bytes.data(), bytes.size()));
  const auto back = parse(bytes);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < back.size(); ++i) {
    INFO(tensors[i].first);
    CHECK(back[i].first == tensors[i].first);
    CHECK(back[i].second.scalar_type() == tensors[i].second.scalar_type());
    CHECK(torch::equal(back[i].second, tensors[i].second));
  }
  CHECK_THROWS_C10(
      attention::serialize_safetensors({{"a", torch::zeros(1)}, {"a", torch::zeros(1)}}),
      c10::ValueError, "duplicate or reserved tensor name 'a'");
}

TEST_CASE("safetensors: malformed files are rejected with the reason", "[safetensors][errors]") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, 'x');
  CHECK(parse(file_of(ok, eight)).size() == 1);
  CHECK(parse(file_of(R"({"__metadata__":{"format":"pt"}})")).empty());
  struct Bad {
    std::string bytes, fragment;
  };
  std::string huge(8, '\0');
  huge[6] = 1;  // 2^48 bytes of header
  const std::vector<Bad> bad = {
      {"abc", "expected at least 8 bytes"},
      {huge, "exceeds the limit"},
      {file_of(ok, eight).substr(0, 30), "runs past the end"},
      {file_of("{not json"), "the header is not a JSON object"},
      {file_of("[1, 2]"), "the header is not a JSON object"},
      {file_of(R"({"w":{"dtype":"F32","shape":[2]}})"), "lacks dtype, shape or data_offsets"},
      {file_of(R"({"w":{"dtype":"F8","shape":[2],"data_offsets":[0,8]}})", eight), "unknown dtype"},
      {file_of(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       "invalid dimension -2"},
      {file_of(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", eight),
       "shape that is not a list"},
      {file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight),
       "outside the 8-byte data section"},
      {file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
       "outside the 8-byte data section"},
      {file_of(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "holds 8 bytes, but F32 (3,) needs 12"},
      {file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               eight),
       "overlap or leave a gap"},
      {file_of(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
       "overlap or leave a gap"},
      {file_of(ok, eight + "xx"), "2 bytes that belong to no tensor"},
      {file_of(R"({"__metadata__":{"n":1}})"), "__metadata__ value of 'n' is not a string"},
      {file_of(
           R"({"w":{"dtype":"F32","shape":[1099511627776, 1099511627776],"data_offsets":[0,8]}})",
           eight),
       "too large"},
      {file_of(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
       "invalid data_offsets"},
  };
  for (const auto& b : bad) {
    INFO(b.fragment);
    CHECK_THROWS_C10(parse(b.bytes), c10::ValueError, b.fragment);
  }
}

TEST_CASE("safetensors: the header is read to its grammar, within three levels of nesting",
          "[safetensors][errors]") {
  const std::string eight(8, 'x');
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  // A million levels anywhere: refused at the fourth, with no stack and no tree.
  for (const std::string& header :
       {R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,8]}})",
        R"({"w":{"dtype":)" + deep + "}}", R"({"w":{"data_offsets":[)" + deep + "]}}",
        R"({"w":{"dtype":"F32","x":)" + deep + "}}", R"({"__metadata__":)" + deep + "}",
        R"({"w":)" + deep + "}", "[" + deep + "]"}) {
    INFO(header.substr(0, 40));
    CHECK_THROWS_AS(parse(file_of(header, eight)), c10::ValueError);
  }
  CHECK_THROWS_C10(parse(file_of(R"({"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})")),
                   c10::ValueError, "the header nests deeper than 3 levels");
  // Fields other readers write are read past, however long, within the levels.
  const std::string entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const auto extra = parse(
      file_of(R"({"w":{)" + entry + R"(,"x":[1,"a",null],"y":)" + R"({"z":1},"t":true}})", eight));
  REQUIRE(extra.size() == 1);
  CHECK(extra[0].second.sizes() == c10::IntArrayRef{2});
  CHECK_THROWS_C10(parse(file_of(R"({"w":{)" + entry + R"(,"x":[{"b":null}]}})", eight)),
                   c10::ValueError, "the header nests deeper than 3 levels");
  // Escapes in names are decoded.
  const auto escaped = parse(file_of(R"({"w\u00e9\n":{)" + entry + "}}", eight));
  CHECK(escaped[0].first == "w\xc3\xa9\n");
}

TEST_CASE("safetensors: names, dimensions and fields are bounded and given once",
          "[safetensors][errors]") {
  const std::string eight(8, 'x');
  const std::string entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK(parse(file_of("{\"" + std::string(1024, 'n') + "\":" + entry + "}", eight)).size() == 1);
  CHECK_THROWS_C10(parse(file_of("{\"" + std::string(1025, 'n') + "\":" + entry + "}", eight)),
                   c10::ValueError, "a tensor name of 1025 characters (at most 1024 are read)");
  CHECK_THROWS_C10(parse(file_of(R"({"w":)" + entry + R"(,"w":)" + entry + "}", eight)),
                   c10::ValueError, "entry 'w' is given twice");
  CHECK_THROWS_C10(
      parse(file_of(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                    eight)),
      c10::ValueError, "entry 'w' gives dtype twice");
  std::string ones = "1";
  for (int i = 1; i < 63; ++i) ones += ",1";
  const auto dims = [&](const std::string& shape) {
    return file_of(R"({"w":{"dtype":"F32","shape":[)" + shape + R"(],"data_offsets":[0,8]}})",
                   eight);
  };
  CHECK(parse(dims(ones + ",2"))[0].second.dim() == 64);
  CHECK_THROWS_C10(parse(dims(ones + ",1,2")), c10::ValueError,
                   "entry 'w' has more than 64 dimensions");
}
