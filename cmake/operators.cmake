# libattention_ops: the library's operators (src/operators/) for a process that loads them at
# run time, Python's torch.ops.load_library above all (python/attention_ops). It holds one file
# whose initializer calls attention::register_operators(); the kernels are the library's. Not
# built under the sanitizers: an instrumented library cannot be loaded into Python's process.
set(ATTENTION_BUILD_OPERATORS_DEFAULT ON)
if(ATTENTION_SANITIZE OR ATTENTION_FUZZ)
  set(ATTENTION_BUILD_OPERATORS_DEFAULT OFF)
endif()
option(ATTENTION_BUILD_OPERATORS "Build libattention_ops, the operators for torch.ops.load_library"
  ${ATTENTION_BUILD_OPERATORS_DEFAULT})

if(ATTENTION_BUILD_OPERATORS)
  add_library(attention_ops SHARED src/operators/library_entry.cpp)
  add_library(attention::ops ALIAS attention_ops)
  set_target_properties(attention_ops PROPERTIES EXPORT_NAME ops CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(attention_ops PRIVATE attention)
  target_compile_options(attention_ops PRIVATE ${ATTENTION_WARNINGS})
  # Installed beside libattention: found there from its own directory.
  set_target_properties(attention_ops PROPERTIES INSTALL_RPATH "$ORIGIN")
endif()
