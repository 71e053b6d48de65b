# attention_add_parity_test(<target> CASES <folder>... [PREFIX <prefix>])
#
# One CTest test per recorded parity case: `<target> <folder>`, named <prefix><folder's name>
# (default prefix: "parity."). <target> is a program of yours whose main() calls
# attention::testing::parity_main(). Cases are the folders that attention_parity.record() wrote
# (Python side: ${attention_PYTHON_DIR}/attention_parity).
function(attention_add_parity_test target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "PREFIX" "CASES")
  if(NOT ARG_CASES)
    message(FATAL_ERROR "attention_add_parity_test(${target}): no CASES given")
  endif()
  if(NOT DEFINED ARG_PREFIX)
    set(ARG_PREFIX "parity.")
  endif()
  foreach(folder IN LISTS ARG_CASES)
    get_filename_component(folder "${folder}" ABSOLUTE)
    get_filename_component(case "${folder}" NAME)
    add_test(NAME "${ARG_PREFIX}${case}" COMMAND ${target} "${folder}")
  endforeach()
endfunction()
