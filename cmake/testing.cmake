# attention::testing, the parity kit's C++ side (include/attention/testing.h): a library of its
# own, so that applications need not link it. Its Python side (python/attention_parity) and
# attention_add_parity_test (cmake/attentionParity.cmake) are installed with the package.
add_library(attention_testing src/testing/parity.cpp)
add_library(attention::testing ALIAS attention_testing)
set_target_properties(attention_testing PROPERTIES EXPORT_NAME testing
  POSITION_INDEPENDENT_CODE ON)
target_link_libraries(attention_testing PUBLIC attention)
target_link_libraries(attention_testing PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json>)
target_compile_options(attention_testing PRIVATE ${ATTENTION_WARNINGS})
attention_shared_library(attention_testing ATTENTION_TESTING_BUILDING)
attention_internal_archive(attention_testing)
