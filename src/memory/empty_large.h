#pragma once

// Large temporaries from the large-buffer cache (memory/large_buffer_cache.h).

#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>
#include <torch/types.h>

namespace attention {
namespace detail {

/// An uninitialized tensor for a large temporary. CPU tensors of 8 MiB and more come from the
/// large-buffer cache: memory kept from an earlier tensor of the same size when there is one,
/// else memory advised for transparent huge pages, where first touch faults once per 2 MiB
/// instead of once per 4 KiB. Its storage cannot be resized. Anything else (and everything on
/// systems without posix_memalign) comes from torch::empty.
torch::Tensor empty_large(c10::IntArrayRef sizes, const torch::TensorOptions& options);

}  // namespace detail
}  // namespace attention
