# The examples of the documentation (the Example blocks of the public headers' doc comments and
# the C++ blocks of the README and the guide in docs/) as one program that is compiled and linked
# (never run) whenever the docs are built: an example that no longer matches the API fails the
# docs check. scripts/extract_examples.py writes the program.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "No Python 3: the docs target does not compile the documentation's examples")
  return()
endif()
file(GLOB ATTENTION_DOCUMENTED_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/attention/*.h
  ${PROJECT_SOURCE_DIR}/docs/*.md)
list(APPEND ATTENTION_DOCUMENTED_FILES ${PROJECT_SOURCE_DIR}/README.md)
if(ATTENTION_HAS_DISTRIBUTED)
  file(GLOB ATTENTION_DISTRIBUTED_HEADERS CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/include/attention/distributed/*.h)
  list(APPEND ATTENTION_DOCUMENTED_FILES ${ATTENTION_DISTRIBUTED_HEADERS})
else()
  # Its examples need attention::distributed.
  list(REMOVE_ITEM ATTENTION_DOCUMENTED_FILES ${PROJECT_SOURCE_DIR}/docs/DISTRIBUTED.md)
endif()
set(ATTENTION_DOC_EXAMPLES ${PROJECT_BINARY_DIR}/doc_examples.cpp)
add_custom_command(OUTPUT ${ATTENTION_DOC_EXAMPLES}
  COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/extract_examples.py
    ${ATTENTION_DOC_EXAMPLES} ${ATTENTION_DOCUMENTED_FILES}
  DEPENDS ${PROJECT_SOURCE_DIR}/scripts/extract_examples.py ${ATTENTION_DOCUMENTED_FILES}
  COMMENT "Extracting the documentation's examples" VERBATIM)
add_executable(attention-doc-examples EXCLUDE_FROM_ALL ${ATTENTION_DOC_EXAMPLES})
target_link_libraries(attention-doc-examples PRIVATE attention::attention attention::testing)
if(ATTENTION_HAS_DISTRIBUTED)
  target_link_libraries(attention-doc-examples PRIVATE attention::distributed)
endif()
# Examples name results they do not use further.
target_compile_options(attention-doc-examples PRIVATE ${ATTENTION_WARNINGS} -Wno-unused-variable
  -Wno-unused-but-set-variable)
add_dependencies(docs attention-doc-examples)
