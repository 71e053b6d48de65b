# attention::distributed, the optional part on PyTorch's c10d: built when LibTorch has c10d's
# Gloo headers and Gloo itself is installed (Debian: libgloo-dev). ATTENTION_DISTRIBUTED=AUTO
# (default) builds it when both are found, ON requires them, OFF skips it.
set(ATTENTION_DISTRIBUTED AUTO CACHE STRING "Build attention::distributed: AUTO, ON or OFF")
set_property(CACHE ATTENTION_DISTRIBUTED PROPERTY STRINGS AUTO ON OFF)
set(ATTENTION_HAS_DISTRIBUTED OFF)
if(NOT ATTENTION_DISTRIBUTED STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  find_file(ATTENTION_C10D_GLOO_HEADER torch/csrc/distributed/c10d/ProcessGroupGloo.hpp
    PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(Gloo_FOUND AND TARGET gloo AND ATTENTION_C10D_GLOO_HEADER)
    set(ATTENTION_HAS_DISTRIBUTED ON)
  elseif(ATTENTION_DISTRIBUTED STREQUAL "ON")
    message(FATAL_ERROR "ATTENTION_DISTRIBUTED=ON needs c10d's ProcessGroupGloo.hpp in LibTorch "
      "and Gloo's CMake package (Debian: libgloo-dev)")
  endif()
endif()
message(STATUS "attention::distributed (c10d with Gloo): ${ATTENTION_HAS_DISTRIBUTED}")

if(ATTENTION_HAS_DISTRIBUTED)
  add_library(attention_distributed
    src/distributed/group.cpp
    src/distributed/transfers.cpp
    src/distributed/collectives.cpp
    src/distributed/ring_attention.cpp
    src/distributed/sequence_split.cpp
    src/distributed/head_parallel.cpp
  )
  add_library(attention::distributed ALIAS attention_distributed)
  set_target_properties(attention_distributed PROPERTIES EXPORT_NAME distributed
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(attention_distributed PRIVATE ${PROJECT_SOURCE_DIR}/src)
  # Without USE_C10D_GLOO LibTorch's ProcessGroupGloo.hpp declares nothing.
  target_compile_definitions(attention_distributed PUBLIC USE_C10D_GLOO)
  target_link_libraries(attention_distributed PUBLIC attention gloo)
  target_compile_options(attention_distributed PRIVATE ${ATTENTION_WARNINGS})
  target_compile_options(attention_distributed PRIVATE ${ATTENTION_AUTOGRAD_FUNCTION_OPTIONS})
  # The files each spend ~30 s on the same LibTorch and c10d code: one batch.
  if(ATTENTION_UNITY_LIBRARY)
    attention_unity_batches(attention_distributed BASE ${PROJECT_SOURCE_DIR}/src BATCH_SIZE 8)
  endif()
  attention_shared_library(attention_distributed ATTENTION_DISTRIBUTED_BUILDING)
  attention_internal_archive(attention_distributed)
endif()

# The ring benchmark runs on the optimized build only (scripts/bench_ring.sh): nothing runs it
# sanitized.
if(ATTENTION_HAS_DISTRIBUTED AND ATTENTION_BUILD_TOOLS AND ATTENTION_BUILD_BENCH_EXTRAS
   AND NOT ATTENTION_SANITIZE AND NOT ATTENTION_FUZZ)
  add_executable(attention-ring-bench tools/ring_bench/main.cpp)
  target_link_libraries(attention-ring-bench PRIVATE attention::distributed)
  target_compile_options(attention-ring-bench PRIVATE ${ATTENTION_WARNINGS})
endif()
