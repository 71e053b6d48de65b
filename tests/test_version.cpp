#include <attention/version.h>

#include "helpers.h"

#include <torch/version.h>

#include <string>

TEST_CASE("version: the library reports the version of its headers", "[version]") {
  CHECK(attention::version() == ATTENTION_VERSION);
  CHECK(ATTENTION_VERSION ==
        ATTENTION_VERSION_MAJOR * 10000 + ATTENTION_VERSION_MINOR * 100 + ATTENTION_VERSION_PATCH);
  const std::string dotted = std::to_string(ATTENTION_VERSION_MAJOR) + "." +
                             std::to_string(ATTENTION_VERSION_MINOR) + "." +
                             std::to_string(ATTENTION_VERSION_PATCH);
  CHECK(std::string(attention::version_string()) == dotted);
  // CMake's project version is read from the header: the two must agree.
  CHECK(std::string(ATTENTION_PROJECT_VERSION) == dotted);
}

TEST_CASE("version: the library names the LibTorch it was compiled against", "[version]") {
  CHECK(attention::torch_version() ==
        TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH);
  const std::string dotted = std::to_string(TORCH_VERSION_MAJOR) + "." +
                             std::to_string(TORCH_VERSION_MINOR) + "." +
                             std::to_string(TORCH_VERSION_PATCH);
  CHECK(std::string(attention::torch_version_string()) == dotted);
}
