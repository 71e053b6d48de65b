// Catch's main, with the golden harness's options:
//   --golden-case NAME    run only that golden case
//   --golden-module NAME  run only the golden cases of that module (ctest runs them this way)
//   --golden-dir DIR    read the goldens from DIR instead of models/golden
// and, as its first argument, a helper program the tests start (helper_programs.h):
//   --roundtrip-writer DIR, --distributed-rank [OPTIONS]

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
using Catch::Clara::Opt;
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
using Catch::clara::Opt;
#endif

#include "golden/harness.h"
#include "helper_programs.h"

#include <cstring>

int main(int argc, char* argv[]) {
  if (argc > 1 && std::strcmp(argv[1], "--roundtrip-writer") == 0) {
    return roundtrip_writer_main(argc - 1, argv + 1);
  }
#ifdef ATTENTION_TESTS_DISTRIBUTED_RANK
  if (argc > 1 && std::strcmp(argv[1], "--distributed-rank") == 0) {
    return distributed_rank_main(argc - 1, argv + 1);
  }
#endif
  Catch::Session session;
  session.cli(session.cli() |
              Opt(golden::selected_case(), "name")["--golden-case"]("run only this golden case") |
              Opt(golden::selected_module(),
                  "module")["--golden-module"]("run only the golden cases of this module") |
              Opt(golden::directory(), "dir")["--golden-dir"]("folder of the golden cases"));
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  return session.run();
}
