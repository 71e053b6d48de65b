#pragma once

// The calling thread's last_path() (attention/functional.h), set by each functional entry point
// when it knows which kernel computed the call.

#include <attention/functional.h>

namespace attention {
namespace functional {
/// Makes `path` what last_path() returns on this thread.
void record_last_path(Path path);

}  // namespace functional
}  // namespace attention
