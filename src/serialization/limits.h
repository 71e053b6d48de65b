#pragma once

// The resource budget of reading a weight file from a source nobody vouches for
// (docs/SECURITY.md). Every reader in this folder keeps to these numbers, so that no file can make
// a load take more stack, memory or time than its size allows.

#include <cstddef>
#include <string>

namespace attention {
namespace serialization {

/// The longest tensor name read. Longer names are refused as the file is read, before any regular
/// expression (LoadOptions::rename) sees them: libstdc++'s std::regex recurses once per character
/// of its subject, about 320 bytes of stack each.
constexpr std::size_t kMaxNameLength = 1024;

/// The most dimensions of one tensor (PyTorch's own kernels stop at 64 as well).
constexpr std::size_t kMaxDimensions = 64;

/// The deepest a safetensors header nests: the header object, an entry, its shape or offsets.
constexpr std::size_t kMaxJsonDepth = 3;

/// The deepest a pickle nests: its MARKs, and tuples used as dict keys.
constexpr std::size_t kMaxPickleDepth = 256;

/// The memory the unpickled values of a torch.save file may take, beyond its storages' data (the
/// unpickler's arena, counted as it grows): this many bytes per byte of the file...
constexpr std::size_t kArenaBytesPerFileByte = 16;
/// ... plus this many.
constexpr std::size_t kArenaBytesConstant = std::size_t{16} << 20;

/// The load budget: the most memory a load of an untrusted file may take at its peak beyond the
/// tensors it returns (and beyond a staging copy of a module's tensors that a cast or a device
/// move needs): this many bytes per byte of the file...
constexpr std::size_t kLoadBytesPerFileByte = 32;
/// ... plus this many.
constexpr std::size_t kLoadBytesConstant = std::size_t{64} << 20;

/// Text of a file quoted in a message, cut after 64 characters: no message holds a megabyte of a
/// file.
inline std::string excerpt(const std::string& text) {
  constexpr std::size_t kShown = 64;
  if (text.size() <= kShown) return text;
  return text.substr(0, kShown) + "... (" + std::to_string(text.size()) + " characters)";
}

}  // namespace serialization
}  // namespace attention
