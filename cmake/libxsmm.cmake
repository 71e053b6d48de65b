# libxsmm's kernel generator for the fused CPU kernels' tile products
# (src/gemm/small_gemm.cpp): machine code written per product shape, faster than a general
# BLAS on the small products of a tile. Only the generator is linked (Debian's libxsmm-dev ships
# it as the static libxsmmgen.a); the library keeps the code itself (src/gemm/code_cache.h)
# rather than in libxsmm's registry. ATTENTION_LIBXSMM=AUTO (default) uses it when found, ON
# requires it, OFF keeps every product on BLAS.
set(ATTENTION_LIBXSMM AUTO CACHE STRING "Tile products through libxsmm: AUTO, ON or OFF")
set_property(CACHE ATTENTION_LIBXSMM PROPERTY STRINGS AUTO ON OFF)
set(ATTENTION_HAS_LIBXSMM OFF)
if(NOT ATTENTION_LIBXSMM STREQUAL "OFF")
  find_path(ATTENTION_LIBXSMM_INCLUDE_DIR libxsmm_generator.h)
  find_library(ATTENTION_LIBXSMM_GENERATOR NAMES libxsmmgen.a xsmmgen)
  if(ATTENTION_LIBXSMM_INCLUDE_DIR AND ATTENTION_LIBXSMM_GENERATOR)
    set(ATTENTION_HAS_LIBXSMM ON)
  elseif(ATTENTION_LIBXSMM STREQUAL "ON")
    message(FATAL_ERROR "ATTENTION_LIBXSMM=ON needs libxsmm_generator.h and libxsmmgen "
      "(Debian: libxsmm-dev)")
  endif()
endif()
message(STATUS "Tile products through libxsmm: ${ATTENTION_HAS_LIBXSMM}")

if(ATTENTION_HAS_LIBXSMM)
  set_property(SOURCE src/gemm/small_gemm.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS ATTENTION_HAVE_LIBXSMM)
  if(NOT ATTENTION_LIBXSMM_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    set_property(SOURCE src/gemm/small_gemm.cpp APPEND PROPERTY
      INCLUDE_DIRECTORIES ${ATTENTION_LIBXSMM_INCLUDE_DIR})
  endif()
  target_link_libraries(attention PRIVATE ${ATTENTION_LIBXSMM_GENERATOR} ${CMAKE_DL_LIBS})
  # The archive's symbols stay inside a shared build: the library exports its API alone.
  get_target_property(attention_type attention TYPE)
  if(attention_type STREQUAL "SHARED_LIBRARY")
    get_filename_component(attention_libxsmm_name ${ATTENTION_LIBXSMM_GENERATOR} NAME)
    target_link_options(attention PRIVATE "LINKER:--exclude-libs,${attention_libxsmm_name}")
  endif()
endif()
