# Shared builds (-DBUILD_SHARED_LIBS=ON). The library exports its API alone: every symbol is
# hidden unless include/attention/export.h marks it. The SOVERSION is major.minor while the major
# version is 0 (a 0.x minor release may change the ABI), the major version afterwards; the package's
# version compatibility follows the same rule.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(ATTENTION_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  set(ATTENTION_COMPATIBILITY SameMinorVersion)
else()
  set(ATTENTION_SOVERSION ${PROJECT_VERSION_MAJOR})
  set(ATTENTION_COMPATIBILITY SameMajorVersion)
endif()

# attention_shared_library(<target> <building-macro>): hidden symbols, the export macro's
# definitions and the version of a shared <target>; nothing for a static one.
function(attention_shared_library target building_macro)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    set_target_properties(${target} PROPERTIES CXX_VISIBILITY_PRESET hidden
      VISIBILITY_INLINES_HIDDEN ON VERSION ${PROJECT_VERSION} SOVERSION ${ATTENTION_SOVERSION})
    target_compile_definitions(${target} PUBLIC ATTENTION_SHARED PRIVATE ${building_macro})
  endif()
endfunction()

# attention_internal_archive(<target>): <target>_internal, what the test suite and the fuzz
# targets link, since they call internal functions too. For a static <target> it is <target>
# itself; for a shared one, a static archive of the same object files (compiled once), whose
# hidden symbols the linker still resolves. Call it after <target>'s last target_link_libraries.
function(attention_internal_archive target)
  get_target_property(type ${target} TYPE)
  if(NOT type STREQUAL "SHARED_LIBRARY")
    add_library(${target}_internal ALIAS ${target})
    return()
  endif()
  add_library(${target}_internal STATIC $<TARGET_OBJECTS:${target}>)
  get_target_property(links ${target} LINK_LIBRARIES)
  # Within the archives, attention::distributed's internal copy uses the library's internal copy:
  # one copy of each object file per program.
  list(TRANSFORM links REPLACE "^attention$" attention_internal)
  get_target_property(includes ${target} INCLUDE_DIRECTORIES)
  get_target_property(definitions ${target} INTERFACE_COMPILE_DEFINITIONS)
  list(REMOVE_ITEM definitions ATTENTION_SHARED)
  target_link_libraries(${target}_internal PUBLIC ${links})
  if(includes)
    target_include_directories(${target}_internal PUBLIC ${includes})
  endif()
  if(definitions)
    target_compile_definitions(${target}_internal PUBLIC ${definitions})
  endif()
  target_compile_features(${target}_internal PUBLIC cxx_std_17)
endfunction()
