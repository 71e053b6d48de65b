#include "gemm/small_gemm.h"

#include "gemm/code_cache.h"
#include "platform/compiler.h"
#include "platform/cpu_features.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef ATTENTION_HAVE_LIBXSMM
#include <libxsmm_cpuid.h>
#include <libxsmm_generator.h>
#endif

namespace attention {
namespace kernels {
namespace cpu {
namespace {

#ifdef ATTENTION_HAVE_LIBXSMM

// Most shapes the process's kernels may ask for: the kernels' block sizes and head dimensions in
// multiples of 16 give a few dozen in practice, each a few KiB of code.
constexpr size_t kMaxKernels = 1024;

// The generator writes a kernel into a buffer this large (libxsmm's own bound).
constexpr unsigned int kMaxCodeBytes = 131072;

using Kernel = void (*)(const void* a, const void* b, void* c);

// The kernels libxsmm's generator writes, kept by the library (not libxsmm's registry, which
// takes ~11 MiB of resident memory for 131072 entries at initialisation whatever is generated).
CodeCache& generated_kernels() {
  static CodeCache* const kernels = new CodeCache(kMaxKernels);  // kernels may run until exit
  return *kernels;
}

// The processor's instruction set, as libxsmm names it; AVX2 at most under
// ATTENTION_CPU_VECTOR=avx2, so that the route of processors without AVX-512 can be measured whole
// (the exponential passes and the generated products alike) on one that has it.
int target_architecture() {
  static const int architecture = [] {
    const int found = libxsmm_cpuid_x86(nullptr);
    return vector_route_asked("avx2") ? std::min(found, LIBXSMM_X86_AVX2) : found;
  }();
  return architecture;
}

template <typename T>
libxsmm_gemm_descriptor* describe(libxsmm_descriptor_blob* blob, libxsmm_blasint m,
                                  libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                                  libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
  if (std::is_same<T, float>::value)
    return libxsmm_sgemm_descriptor_init(blob, m, n, k, lda, ldb, ldc, 1.0f, 0.0f, flags,
                                         LIBXSMM_GEMM_PREFETCH_NONE);
  return libxsmm_dgemm_descriptor_init(blob, m, n, k, lda, ldb, ldc, 1.0, 0.0, flags,
                                       LIBXSMM_GEMM_PREFETCH_NONE);
}

std::vector<unsigned char> generate(const libxsmm_gemm_descriptor& descriptor) {
  std::vector<unsigned char> code(kMaxCodeBytes);
  libxsmm_generated_code generated;
  std::memset(&generated, 0, sizeof(generated));
  generated.generated_code = code.data();
  generated.buffer_size = kMaxCodeBytes;
  generated.code_type = 2;  // machine code to be copied into executable memory
  generated.arch = static_cast<unsigned int>(target_architecture());
  libxsmm_generator_gemm_kernel(&generated, &descriptor);
  if (generated.last_error != 0 || generated.code_size == 0) return {};
  code.resize(generated.code_size);
  return code;
}

// Column-major C (rows x cols, beta 0) = A (rows x inner) op(B), op(B) = B^T where
// LIBXSMM_GEMM_FLAG_TRANS_B is in `flags`; nullptr where there is no kernel.
template <typename T>
Kernel kernel_for(libxsmm_blasint rows, libxsmm_blasint cols, libxsmm_blasint inner,
                  libxsmm_blasint lda, libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
  const CodeCache::Key key = {
      static_cast<int64_t>(sizeof(T)), rows, cols, inner, lda, ldb, ldc, flags};
  const void* code = generated_kernels().get(key, [&] {
    libxsmm_descriptor_blob blob;
    const libxsmm_gemm_descriptor* descriptor =
        describe<T>(&blob, rows, cols, inner, lda, ldb, ldc, flags);
    return descriptor == nullptr ? std::vector<unsigned char>() : generate(*descriptor);
  });
  return reinterpret_cast<Kernel>(const_cast<void*>(code));
}

bool fits_blasint(int64_t value) {
  return value <= INT_MAX;
}

// C (m x n, row stride ldc) += product (m x n, contiguous).
template <typename T>
ATTENTION_ALWAYS_INLINE void add_product(T* c, int64_t ldc, const T* product, int64_t m,
                                         int64_t n) {
  for (int64_t r = 0; r < m; ++r) {
    T* row = c + r * ldc;
    const T* terms = product + r * n;
    for (int64_t j = 0; j < n; ++j) row[j] += terms[j];
  }
}

// Built per instruction set, as the kernels' element-wise steps are.
ATTENTION_MULTIVERSION void add_product_f32(float* c, int64_t ldc, const float* product, int64_t m,
                                            int64_t n) {
  add_product(c, ldc, product, m, n);
}

void dispatch_add_product(float* c, int64_t ldc, const float* product, int64_t m, int64_t n) {
  add_product_f32(c, ldc, product, m, n);
}

void dispatch_add_product(double* c, int64_t ldc, const double* product, int64_t m, int64_t n) {
  add_product(c, ldc, product, m, n);
}

template <typename T>
bool run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
         int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T* scratch) {
  const bool add = beta == T(1);
  if (trans_b || alpha != T(1) || (beta != T(0) && !add) || (add && scratch == nullptr))
    return false;
  if (m <= 0 || n <= 0 || k <= 0 || std::max({m, n, k}) > kMaxSmallGemmSide) return false;
  if (m % kSmallGemmGranule != 0 || n % kSmallGemmGranule != 0 || k % kSmallGemmGranule != 0)
    return false;
  // Row-major C (m x n) is column-major C^T (n x m) = B^T (n x k) op(A)^T (k x m): B's storage
  // read column-major is B^T, and A's is op(A)^T, or op(A) when A is transposed.
  if (ldb < n || lda < (trans_a ? m : k) || ldc < n) return false;
  if (!fits_blasint(ldb) || !fits_blasint(lda) || !fits_blasint(ldc)) return false;
  const int flags = (trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0) | LIBXSMM_GEMM_FLAG_BETA_0;
  const Kernel kernel = kernel_for<T>(n, m, k, ldb, lda, add ? n : ldc, flags);
  if (kernel == nullptr) return false;
  if (!add) {
    kernel(b, a, c);
    return true;
  }
  kernel(b, a, scratch);
  dispatch_add_product(c, ldc, scratch, m, n);
  return true;
}

// C = A B + beta C (A transposed when trans_a) for n x n row-major matrices, by the definition:
// the self-check's reference, exact on small integers.
template <typename T>
void reference_product(bool trans_a, int64_t n, const T* a, const T* b, T beta, T* c) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T sum = 0;
      for (int64_t l = 0; l < n; ++l) sum += (trans_a ? a[l * n + i] : a[i * n + l]) * b[l * n + j];
      c[i * n + j] = sum + (beta == T(0) ? T(0) : beta * c[i * n + j]);
    }
  }
}

// Products of small integers (exact in float), A plain and transposed, beta 0 (C full of a
// value that must not be read) and 1, against the definition: a libxsmm that generates wrong code
// for this processor shows here, once, and the kernels keep BLAS.
template <typename T>
bool answers_correctly() {
  constexpr int64_t n = kSmallGemmGranule;
  std::array<T, n * n> a, b;
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<T>((i * 7) % 5 - 2);
    b[i] = static_cast<T>((i * 3) % 7 - 3);
  }
  for (const bool trans_a : {false, true}) {
    for (const T beta : {T(0), T(1)}) {
      std::array<T, n * n> expected, got, scratch;
      expected.fill(beta == T(0) ? T(0) : T(3));
      got.fill(beta == T(0) ? T(7) : T(3));
      reference_product<T>(trans_a, n, a.data(), b.data(), beta, expected.data());
      if (!run<T>(trans_a, false, n, n, n, T(1), a.data(), n, b.data(), n, beta, got.data(), n,
                  scratch.data()) ||
          got != expected) {
        return false;
      }
    }
  }
  return true;
}

bool check_once() {
  const char* forced = std::getenv("ATTENTION_CPU_GEMM");
  if (forced != nullptr && (std::strcmp(forced, "blas") == 0 || std::strcmp(forced, "addmm") == 0))
    return false;
  return answers_correctly<float>() && answers_correctly<double>();
}

#else

bool check_once() {
  return false;
}

#endif

}  // namespace

bool small_gemm_enabled() {
  static const bool enabled = check_once();
  return enabled;
}

template <typename T>
bool small_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T* scratch) {
#ifdef ATTENTION_HAVE_LIBXSMM
  return small_gemm_enabled() &&
         run<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, scratch);
#else
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda;
  (void)b, (void)ldb, (void)beta, (void)c, (void)ldc, (void)scratch;
  return false;
#endif
}

template bool small_gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                const float*, int64_t, float, float*, int64_t, float*);
template bool small_gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                 int64_t, const double*, int64_t, double, double*, int64_t,
                                 double*);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
