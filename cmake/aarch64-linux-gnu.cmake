# Cross-compiling for 64-bit ARM Linux (aarch64) with Debian's cross compiler, against a sysroot of
# Debian's arm64 packages (LibTorch and what it needs), as scripts/aarch64.sh makes it:
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#     -DATTENTION_AARCH64_SYSROOT=/var/cache/attention-cpp/aarch64/sysroot
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
if(NOT ATTENTION_AARCH64_SYSROOT)
  set(ATTENTION_AARCH64_SYSROOT $ENV{ATTENTION_AARCH64_SYSROOT})
endif()
set(CMAKE_SYSROOT ${ATTENTION_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH ${ATTENTION_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# LibTorch's libraries need BLAS and LAPACK, which the sysroot's alternatives point into
# openblas-pthread/; the linker resolves them there.
set(lib ${ATTENTION_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu)
foreach(kind EXE SHARED MODULE)
  set(CMAKE_${kind}_LINKER_FLAGS_INIT "-Wl,-rpath-link,${lib} -Wl,-rpath-link,${lib}/openblas-pthread")
endforeach()
# The programs run under the emulator (qemu-aarch64-static with QEMU_LD_PREFIX at the sysroot).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
