#include <attention/version.h>

#include <torch/version.h>

// The values below are fixed when the library is compiled, so a program can compare them with the
// macros of the headers it was compiled with.

#define ATTENTION_STRINGIFY_(x) #x
#define ATTENTION_STRINGIFY(x) ATTENTION_STRINGIFY_(x)
#define ATTENTION_DOTTED(major, minor, patch) \
  ATTENTION_STRINGIFY(major) "." ATTENTION_STRINGIFY(minor) "." ATTENTION_STRINGIFY(patch)

namespace attention {

int version() {
  return ATTENTION_VERSION;
}

const char* version_string() {
  return ATTENTION_DOTTED(ATTENTION_VERSION_MAJOR, ATTENTION_VERSION_MINOR,
                          ATTENTION_VERSION_PATCH);
}

int torch_version() {
  return TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH;
}

const char* torch_version_string() {
  return ATTENTION_DOTTED(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

}  // namespace attention
