#include <attention/safetensors.h>

#include "checks.h"
#include "memory/empty_large.h"
#include "serialization/safetensors.h"
#include "serialization/safetensors_header.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <set>

namespace attention {
namespace {

constexpr const char* kName = "attention::safetensors";

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
  const std::vector<HeaderEntry> entries =
      parse_safetensors_header(source.read_string(8, static_cast<std::size_t>(n)));
  const uint64_t body_start = 8 + n;
  const uint64_t body_size = size - 8 - n;
  for (const auto& e : entries) {
    TORCH_CHECK_VALUE(e.begin <= e.end && e.end <= body_size, kName, ": entry '", e.name,
                      "' has data_offsets [", e.begin, ", ", e.end, "] outside the ", body_size,
                      "-byte data section");
    const uint64_t bytes = e.numel * c10::elementSize(e.dtype);
    TORCH_CHECK_VALUE(e.end - e.begin == bytes, kName, ": entry '", e.name, "' holds ",
                      e.end - e.begin, " bytes, but ", e.dtype_name, " ",
                      detail::shape_str(e.shape), " needs ", bytes);
  }
  // The tensors must tile the data section exactly: no overlap, no gap, nothing after. So the
  // tensors made below hold at most the file's size.
  std::vector<const HeaderEntry*> by_offset;
  by_offset.reserve(entries.size());
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
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
  out.reserve(entries.size());
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
  // The header is written as text, entry by entry, in the tensors' order (a JSON library's ordered
  // object would look every name up in a list: quadratic in the number of tensors).
  std::string json = "{";
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(name != "__metadata__" && names.insert(name).second, kName,
                      ": duplicate or reserved tensor name '", name, "'");
    TORCH_CHECK_VALUE(tensor.defined(), kName, ": tensor '", name, "' is undefined");
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    std::string shape;
    for (const int64_t d : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    if (data.size() > 0) json += ',';
    json += nlohmann::json(name).dump() + ":{\"dtype\":\"" +
            serialization::safetensors_dtype_name(t.scalar_type()) + "\",\"shape\":[" + shape +
            "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) +
            "]}";
    offset += bytes;
    data.push_back(t);
  }
  json += '}';
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
