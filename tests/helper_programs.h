#pragma once

// Programs the tests start as processes of their own, compiled into attention-tests (each would
// otherwise compile LibTorch's headers once more for ~40 lines of its own) and run as
// `attention-tests --NAME ARGS...` (main.cpp). Each takes its arguments as a main() does, argv[0]
// being --NAME.

// Writes seeded modules for scripts/check_roundtrip.py (roundtrip_writer.cpp).
int roundtrip_writer_main(int argc, char** argv);

// One rank of the multi-process tests of attention::distributed (distributed_rank.cpp); only in
// builds with attention::distributed.
int distributed_rank_main(int argc, char** argv);
