// Catch's main, with the golden harness's options:
//   --golden-case NAME  run only that golden case (ctest runs each case this way)
//   --golden-dir DIR    read the goldens from DIR instead of models/golden

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "golden/harness.h"

int main(int argc, char* argv[]) {
  Catch::Session session;
  using Catch::clara::Opt;
  session.cli(session.cli() |
              Opt(golden::selected_case(), "name")["--golden-case"]("run only this golden case") |
              Opt(golden::directory(), "dir")["--golden-dir"]("folder of the golden cases"));
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  return session.run();
}
