# libxsmm for the fused CPU kernels' tile products (src/kernels/cpu_small_gemm.cpp): kernels
# generated per product shape, faster than a general BLAS on the small products of a tile.
# Debian ships it as a static archive (libxsmm-dev) that calls BLAS for products it does not
# generate, so BLAS is linked with it. ATTENTION_LIBXSMM=AUTO (default) uses it when found, ON
# requires it, OFF keeps every product on BLAS.
set(ATTENTION_LIBXSMM AUTO CACHE STRING "Tile products through libxsmm: AUTO, ON or OFF")
set_property(CACHE ATTENTION_LIBXSMM PROPERTY STRINGS AUTO ON OFF)
set(ATTENTION_HAS_LIBXSMM OFF)
if(NOT ATTENTION_LIBXSMM STREQUAL "OFF")
  find_path(ATTENTION_LIBXSMM_INCLUDE_DIR libxsmm.h)
  find_library(ATTENTION_LIBXSMM_LIBRARY NAMES libxsmm.a xsmm)
  # The BLAS LibTorch itself loads (Debian's alternatives link), so no second BLAS comes in.
  find_library(ATTENTION_BLAS_LIBRARY NAMES blas libblas.so.3)
  if(ATTENTION_LIBXSMM_INCLUDE_DIR AND ATTENTION_LIBXSMM_LIBRARY AND ATTENTION_BLAS_LIBRARY)
    set(ATTENTION_HAS_LIBXSMM ON)
  elseif(ATTENTION_LIBXSMM STREQUAL "ON")
    message(FATAL_ERROR "ATTENTION_LIBXSMM=ON needs libxsmm.h, libxsmm and a BLAS library "
      "(Debian: libxsmm-dev)")
  endif()
endif()
message(STATUS "Tile products through libxsmm: ${ATTENTION_HAS_LIBXSMM}")

if(ATTENTION_HAS_LIBXSMM)
  set_property(SOURCE src/kernels/cpu_small_gemm.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS ATTENTION_HAVE_LIBXSMM)
  if(NOT ATTENTION_LIBXSMM_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    set_property(SOURCE src/kernels/cpu_small_gemm.cpp APPEND PROPERTY
      INCLUDE_DIRECTORIES ${ATTENTION_LIBXSMM_INCLUDE_DIR})
  endif()
  target_link_libraries(attention PRIVATE ${ATTENTION_LIBXSMM_LIBRARY} ${ATTENTION_BLAS_LIBRARY}
    pthread ${CMAKE_DL_LIBS} rt m)
  # The archive's symbols stay inside a shared build: the library exports its API alone.
  get_target_property(attention_type attention TYPE)
  if(attention_type STREQUAL "SHARED_LIBRARY")
    get_filename_component(attention_libxsmm_name ${ATTENTION_LIBXSMM_LIBRARY} NAME)
    target_link_options(attention PRIVATE "LINKER:--exclude-libs,${attention_libxsmm_name}")
  endif()
endif()
