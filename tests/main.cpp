// Catch's main, with the golden harness's options:
//   --golden-case NAME    run only that golden case
//   --golden-module NAME  run only the golden cases of that module (ctest runs them this way)
//   --golden-dir DIR    read the goldens from DIR instead of models/golden

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
using Catch::Clara::Opt;
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
using Catch::clara::Opt;
#endif

#include "golden/harness.h"

int main(int argc, char* argv[]) {
  Catch::Session session;
  session.cli(session.cli() |
              Opt(golden::selected_case(), "name")["--golden-case"]("run only this golden case") |
              Opt(golden::selected_module(),
                  "module")["--golden-module"]("run only the golden cases of this module") |
              Opt(golden::directory(), "dir")["--golden-dir"]("folder of the golden cases"));
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  return session.run();
}
