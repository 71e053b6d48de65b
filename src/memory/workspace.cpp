#include <attention/workspace.h>

#include "checks.h"
#include "memory/empty_large.h"

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace attention {

namespace {

constexpr int kSlots = 16;
constexpr const char* kName = "attention::Workspace::take";

}  // namespace

torch::Tensor Workspace::take(int slot, c10::IntArrayRef sizes,
                              const torch::TensorOptions& options) {
  TORCH_CHECK_VALUE(slot >= 0 && slot < kSlots, kName, ": expected a slot in [0, ", kSlots,
                    "), got ", slot);
  for (const int64_t size : sizes) {
    TORCH_CHECK_VALUE(size >= 0, kName, ": expected sizes >= 0, got ", detail::shape_str(sizes));
  }
  // A buffer is a flat, strided tensor viewed in the sizes asked for: any other layout or memory
  // format cannot be, and a buffer that records gradients cannot be written in place.
  TORCH_CHECK_VALUE(options.layout() == torch::kStrided, kName, ": expected a strided layout, got ",
                    options.layout());
  TORCH_CHECK_VALUE(
      !options.has_memory_format() || options.memory_format_opt() == c10::MemoryFormat::Contiguous,
      kName, ": expected the contiguous memory format, got ", *options.memory_format_opt());
  TORCH_CHECK_VALUE(!options.requires_grad(), kName,
                    ": expected options without requires_grad (a buffer is written in place)");
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  TORCH_CHECK_VALUE(detail::fits_in_bytes(sizes, static_cast<int64_t>(c10::elementSize(dtype))),
                    kName, ": expected sizes of at most 2^63 - 1 bytes, got ",
                    detail::shape_str(sizes), " of ", dtype);
  const int64_t numel = c10::multiply_integers(sizes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffers_.size() <= static_cast<size_t>(slot)) buffers_.resize(slot + 1);
  torch::Tensor& buffer = buffers_[slot];
  const bool same_kind =
      buffer.defined() && buffer.dtype() == options.dtype() && buffer.device() == options.device();
  // Free: no tensor but this one refers to the buffer's memory (views, autograd's saved
  // tensors and caches all hold a reference to it).
  const bool reusable = same_kind && buffer.use_count() == 1 && buffer.storage().use_count() == 1 &&
                        buffer.numel() >= numel;
  if (!reusable) {
    buffer = detail::empty_large({same_kind ? std::max(numel, buffer.numel()) : numel}, options);
  }
  return buffer.narrow(0, 0, numel).view(sizes);
}

void Workspace::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.clear();
}

int64_t Workspace::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& buffer : buffers_) {
    if (buffer.defined()) total += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  }
  return total;
}

}  // namespace attention
