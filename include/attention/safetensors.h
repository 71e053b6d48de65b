#pragma once

/// \file
/// safetensors: the weights-only format of the Hugging Face ecosystem, read and written with
/// strict validation. A file is an 8-byte little-endian header length N, N bytes of JSON
/// (`{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}`, plus an optional
/// `"__metadata__"` object of strings), then the raw little-endian tensor data.

#include <attention/export.h>
#include <torch/types.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace attention {

/// Tensors by name, in file order.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The largest JSON header accepted (100 MB, as the reference implementation).
constexpr std::size_t kMaxSafetensorsHeader = 100'000'000;

/// Parses a safetensors file held in memory. The tensors are copies (CPU), independent of `data`.
///
/// Rejects, with c10::ValueError naming the problem: a buffer shorter than 8 bytes, a header
/// length over kMaxSafetensorsHeader or past the end, a header that is not a JSON object, an
/// entry without dtype/shape/data_offsets or with an unknown dtype, negative or overflowing
/// shapes, offsets out of bounds or not matching dtype x shape, tensors that overlap or leave
/// gaps in the data section.
///
/// Example:
/// \code
/// attention::NamedTensors tensors = {{"W_query", torch::rand({3, 2})}};
/// std::string bytes = attention::serialize_safetensors(tensors);
/// attention::NamedTensors back = attention::parse_safetensors(bytes.data(), bytes.size());
/// \endcode
ATTENTION_API NamedTensors parse_safetensors(const char* data, std::size_t size);

/// Writes tensors as safetensors bytes (each made contiguous on the CPU). Throws c10::ValueError
/// for a dtype safetensors has no name for, or a duplicate or reserved name.
ATTENTION_API std::string serialize_safetensors(const NamedTensors& tensors);

/// True when `data` starts like a safetensors file (a plausible header length, then '{').
/// Thread safety: this function, parse_safetensors() and serialize_safetensors() keep no state;
/// any number of calls may run at once.
ATTENTION_API bool looks_like_safetensors(const char* data, std::size_t size);

}  // namespace attention
