#include <attention/safetensors.h>

#include "detail.h"
#include "serialization/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>

namespace attention {
namespace {

constexpr const char* kName = "attention::safetensors";

const std::map<std::string, torch::Dtype>& dtypes() {
  static const std::map<std::string, torch::Dtype> table = {
      {"F64", torch::kDouble},    {"F32", torch::kFloat}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},  {"I32", torch::kInt},
      {"I16", torch::kShort},     {"I8", torch::kChar},   {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  return table;
}

std::string dtype_name(torch::Dtype dtype) {
  for (const auto& [name, d] : dtypes()) {
    if (d == dtype) return name;
  }
  TORCH_CHECK_VALUE(false, kName, ": no safetensors dtype for ", dtype);
}

uint64_t read_u64_le(const char* p) {
  return serialization::little_endian(p, 8);
}

}  // namespace

bool looks_like_safetensors(const char* data, std::size_t size) {
  return size >= 9 && serialization::safetensors_prefix(std::string(data, 9), size);
}

NamedTensors parse_safetensors(const char* data, std::size_t size) {
  return serialization::read_safetensors(serialization::MemorySource(data, size, "<memory>"));
}

bool serialization::safetensors_prefix(const std::string& head, uint64_t size) {
  if (head.size() < 9 || size < 9) return false;
  const uint64_t n = read_u64_le(head.data());
  return n >= 2 && n <= kMaxSafetensorsHeader && n <= size - 8 && head[8] == '{';
}

NamedTensors serialization::read_safetensors(const ByteSource& source) {
  const uint64_t size = source.size();
  TORCH_CHECK_VALUE(size >= 8, kName, ": expected at least 8 bytes (the header length), got ",
                    size);
  const uint64_t n = read_u64_le(source.read_string(0, 8).data());
  TORCH_CHECK_VALUE(n <= kMaxSafetensorsHeader, kName, ": header length ", n, " exceeds the limit ",
                    kMaxSafetensorsHeader);
  TORCH_CHECK_VALUE(n <= size - 8, kName, ": header length ", n, " runs past the end of the ", size,
                    "-byte file");
  const std::string text = source.read_string(8, static_cast<std::size_t>(n));
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(text, nullptr,
                                                                /*allow_exceptions=*/false);
  TORCH_CHECK_VALUE(header.is_object(), kName, ": the header is not a JSON object");
  const uint64_t body_start = 8 + n;
  const uint64_t body_size = size - 8 - n;

  struct Entry {
    std::string name;
    torch::Dtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      TORCH_CHECK_VALUE(info.is_object(), kName, ": __metadata__ is not an object");
      for (const auto& item : info.items()) {
        TORCH_CHECK_VALUE(item.value().is_string(), kName, ": __metadata__ value of '", item.key(),
                          "' is not a string");
      }
      continue;
    }
    TORCH_CHECK_VALUE(info.is_object() && info.contains("dtype") && info.contains("shape") &&
                          info.contains("data_offsets"),
                      kName, ": entry '", name, "' lacks dtype, shape or data_offsets");
    const auto& dtype = info["dtype"];
    TORCH_CHECK_VALUE(dtype.is_string() && dtypes().count(dtype.get<std::string>()), kName,
                      ": entry '", name, "' has an unknown dtype ", dtype.dump());
    Entry e{name, dtypes().at(dtype.get<std::string>()), {}, 0, 0};
    const auto& shape = info["shape"];
    TORCH_CHECK_VALUE(shape.is_array(), kName, ": entry '", name,
                      "' has a shape that is not a list");
    uint64_t numel = 1;
    for (const auto& dim : shape) {
      TORCH_CHECK_VALUE(dim.is_number_unsigned() && dim.get<uint64_t>() <= (uint64_t{1} << 40),
                        kName, ": entry '", name, "' has an invalid dimension ", dim.dump());
      const uint64_t d = dim.get<uint64_t>();
      TORCH_CHECK_VALUE(d == 0 || numel <= std::numeric_limits<uint64_t>::max() / d / 8, kName,
                        ": entry '", name, "' is too large");
      numel *= d;
      e.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& offsets = info["data_offsets"];
    TORCH_CHECK_VALUE(offsets.is_array() && offsets.size() == 2 &&
                          offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
                      kName, ": entry '", name, "' has invalid data_offsets ", offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    TORCH_CHECK_VALUE(e.begin <= e.end && e.end <= body_size, kName, ": entry '", name,
                      "' has data_offsets [", e.begin, ", ", e.end, "] outside the ", body_size,
                      "-byte data section");
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    TORCH_CHECK_VALUE(e.end - e.begin == bytes, kName, ": entry '", name, "' holds ",
                      e.end - e.begin, " bytes, but ", dtype.get<std::string>(), " ",
                      detail::shape_str(e.shape), " needs ", bytes);
    entries.push_back(std::move(e));
  }
  // The tensors must tile the data section exactly: no overlap, no gap, nothing after.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const auto* e : by_offset) {
    TORCH_CHECK_VALUE(e->begin == cursor, kName, ": entry '", e->name, "' starts at byte ",
                      e->begin, " of the data section, expected ", cursor,
                      " (tensors overlap or leave a gap)");
    cursor = e->end;
  }
  TORCH_CHECK_VALUE(cursor == body_size, kName, ": the data section has ", body_size - cursor,
                    " bytes that belong to no tensor");

  NamedTensors out;
  for (const auto& e : entries) {
    // Large tensors in huge-page-advised memory: faulting in a fresh buffer costs more than
    // reading it.
    auto t = detail::empty_large(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) {
      source.read(body_start + e.begin, t.data_ptr(), static_cast<std::size_t>(e.end - e.begin));
    }
    out.emplace_back(e.name, t);
  }
  return out;
}

std::string serialize_safetensors(const NamedTensors& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(name != "__metadata__" && names.insert(name).second, kName,
                      ": duplicate or reserved tensor name '", name, "'");
    TORCH_CHECK_VALUE(tensor.defined(), kName, ": tensor '", name, "' is undefined");
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string json = header.dump();
  // Pad the header with spaces so that the data starts 8-byte aligned, as other writers do.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  for (const auto& t : data) {
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

}  // namespace attention
