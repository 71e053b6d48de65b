#include "gemm/blas.h"

#include "gemm/small_gemm.h"
#include "gemm/vector_gemm.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define ATTENTION_HAS_DLSYM 1
#endif

namespace attention {
namespace kernels {
namespace cpu {
namespace {

// The Fortran interface: every argument by address, and the lengths of the two character
// arguments last (read by gfortran-built BLAS, ignored by C-built ones such as OpenBLAS).
// Integer arguments are passed as the address of an int64_t: on a little-endian machine a
// 32-bit-integer BLAS reads its low half and a 64-bit-integer one the whole, so the call is
// right for either build.
template <typename T>
using FortranGemm = void (*)(const char* trans_a, const char* trans_b, const int64_t* m,
                             const int64_t* n, const int64_t* k, const T* alpha, const T* a,
                             const int64_t* lda, const T* b, const int64_t* ldb, const T* beta,
                             T* c, const int64_t* ldc, std::size_t trans_a_len,
                             std::size_t trans_b_len);

template <typename T>
void call_fortran(FortranGemm<T> f, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                  int64_t ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap and the
  // row strides become leading dimensions.
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  f(&ta, &tb, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc, 1, 1);
}

// A product with known integer results, each transpose combination and unequal strides: a
// symbol that is not the BLAS interface assumed above (or is broken) shows here, once, instead
// of in a user's results.
template <typename T>
bool answers_correctly(FortranGemm<T> f) {
  const std::array<T, 6> a = {1, 2, 3, 4, 5, 6};  // 2 x 3, or 3 x 2 transposed
  const std::array<T, 8> b = {1, 0, 2, -1, 3, 1, 0, 2};
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      std::array<T, 6> expected{}, got{};
      got.fill(T(7));  // beta = 0 must not read it
      gemm_through_addmm<T>(trans_a, trans_b, 2, 2, 3, T(2), a.data(), trans_a ? 2 : 3, b.data(),
                            trans_b ? 4 : 2, T(0), expected.data(), 3);
      call_fortran<T>(f, trans_a, trans_b, 2, 2, 3, T(2), a.data(), trans_a ? 2 : 3, b.data(),
                      trans_b ? 4 : 2, T(0), got.data(), 3);
      for (int r = 0; r < 2; ++r) {
        for (int col = 0; col < 2; ++col) {
          if (got[r * 3 + col] != expected[r * 3 + col]) return false;
        }
      }
    }
  }
  return true;
}

template <typename T>
FortranGemm<T> resolve(const char* symbol) {
  const char* forced = std::getenv("ATTENTION_CPU_GEMM");
  if (forced != nullptr && std::strcmp(forced, "addmm") == 0) return nullptr;
#ifdef ATTENTION_HAS_DLSYM
  // The process's global scope: LibTorch's own dependencies, so the BLAS LibTorch calls.
  auto f = reinterpret_cast<FortranGemm<T>>(dlsym(RTLD_DEFAULT, symbol));
  if (f != nullptr && answers_correctly(f)) return f;
#else
  (void)symbol;
#endif
  return nullptr;
}

template <typename T>
FortranGemm<T> fortran_gemm();

// What BLAS itself would refuse (its error handler may end the process) or a 32-bit-integer
// build would misread: leading dimensions below the rows of the column-major matrices (a
// one-row view may have any row stride) and values past 2^31 - 1.
bool blas_takes(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                int64_t ldb, int64_t ldc) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  for (const int64_t value : {m, n, k, lda, ldb, ldc}) {
    if (value > kMax) return false;
  }
  return lda >= std::max<int64_t>(1, trans_a ? m : k) &&
         ldb >= std::max<int64_t>(1, trans_b ? k : n) && ldc >= std::max<int64_t>(1, n);
}

template <>
FortranGemm<float> fortran_gemm<float>() {
  static const FortranGemm<float> f = resolve<float>("sgemm_");
  return f;
}

template <>
FortranGemm<double> fortran_gemm<double>() {
  static const FortranGemm<double> f = resolve<double>("dgemm_");
  return f;
}

}  // namespace

const char* blas_core_name() {
#ifdef ATTENTION_HAS_DLSYM
  static const char* const name = []() -> const char* {
    using CoreName = char* (*)();
    const auto f = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    return f != nullptr ? f() : nullptr;  // OpenBLAS returns a string of its own, never freed
  }();
  return name;
#else
  return nullptr;
#endif
}

template <typename T>
void gemm_through_addmm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
                        const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                        int64_t ldc) {
  const auto options = torch::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  const auto view = [&](const T* data, int64_t rows, int64_t cols, int64_t ld, bool trans) {
    T* start = const_cast<T*>(data);
    return trans ? torch::from_blob(start, {cols, rows}, {ld, 1}, options).t()
                 : torch::from_blob(start, {rows, cols}, {ld, 1}, options);
  };
  auto out = torch::from_blob(c, {m, n}, {ldc, 1}, options);
  at::addmm_out(out, out, view(a, m, k, lda, trans_a), view(b, k, n, ldb, trans_b), beta, alpha);
}

template <typename T, typename In>
void transpose_scaled(const In* in, int64_t ld_in, int64_t rows, int64_t cols, T alpha, T* out,
                      int64_t ld_out) {
  // In square blocks: element by element, the writes of one input row would land a whole
  // output row apart and evict each other from the cache.
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {
        T* to = out + c * ld_out;
        for (int64_t r = r0; r < r1; ++r) to[r] = alpha * static_cast<T>(in[r * ld_in + c]);
      }
    }
  }
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T* scratch) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same<T, float>::value) {
    if (vector_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  }
  if (small_gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, scratch))
    return;
  const FortranGemm<T> f = fortran_gemm<T>();
  // k = 0 leaves beta * C, which addmm defines for beta = 0 too (BLAS would read C).
  if (f == nullptr || k == 0 || !blas_takes(trans_a, trans_b, m, n, k, lda, ldb, ldc)) {
    gemm_through_addmm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  call_fortran<T>(f, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* gemm_route() {
  if (vector_gemm_enabled()) return small_gemm_enabled() ? "vector+libxsmm" : "vector";
  if (small_gemm_enabled()) return "libxsmm";
  return fortran_gemm<float>() != nullptr && fortran_gemm<double>() != nullptr ? "blas" : "addmm";
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t, float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t, double*);
template void transpose_scaled<float>(const float*, int64_t, int64_t, int64_t, float, float*,
                                      int64_t);
template void transpose_scaled<double>(const double*, int64_t, int64_t, int64_t, double, double*,
                                       int64_t);
template void transpose_scaled<float, c10::BFloat16>(const c10::BFloat16*, int64_t, int64_t,
                                                     int64_t, float, float*, int64_t);
template void gemm_through_addmm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                        int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_through_addmm<double>(bool, bool, int64_t, int64_t, int64_t, double,
                                         const double*, int64_t, const double*, int64_t, double,
                                         double*, int64_t);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
