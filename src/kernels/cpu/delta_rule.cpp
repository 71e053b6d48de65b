// The gated delta rule's CPU kernels (kernels/cpu/delta_rule.h). Every loop over a state row runs
// along its d_v contiguous values, so the forward has no horizontal sums at all: Sᵀ k and Sᵀ q
// gather row after row into d_v-long accumulators.

#include "kernels/cpu/delta_rule.h"

#include "platform/compiler.h"

#include <ATen/Parallel.h>
#include <c10/util/irange.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {
namespace {

// Bytes of replayed states one thread keeps in the backward (an interval of them).
constexpr int64_t kReplayBytes = int64_t{2} << 20;
constexpr int64_t kMaxInterval = 64;

// The sizes of one call.
struct Sizes {
  int64_t rows, t, dk, dv;
};

Sizes sizes_of(const torch::Tensor& q, const torch::Tensor& v) {
  return {q.size(0), q.size(1), q.size(2), v.size(2)};
}

int64_t interval_for(const Sizes& s, int64_t element_size) {
  const int64_t state_bytes = std::max<int64_t>(1, s.dk * s.dv * element_size);
  return std::clamp<int64_t>(kReplayBytes / state_bytes, 1, kMaxInterval);
}

// One token: S <- g S, m = Sᵀ k, u = beta * (v - m), S <- S + k uᵀ, and, when y is given,
// y = Sᵀ q. m and u are d_v long and kept for the backward.
template <typename T>
ATTENTION_ALWAYS_INLINE void step(T* state, int64_t dk, int64_t dv, T g, const T* q, const T* k,
                                  const T* v, const T* beta, T* m, T* u, T* y) {
  std::fill(m, m + dv, T(0));
  for (int64_t i = 0; i < dk; ++i) {
    T* row = state + i * dv;
    const T ki = k[i];
#pragma omp simd
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= g;
      m[j] += ki * row[j];
    }
  }
#pragma omp simd
  for (int64_t j = 0; j < dv; ++j) u[j] = beta[j] * (v[j] - m[j]);
  if (y != nullptr) std::fill(y, y + dv, T(0));
  for (int64_t i = 0; i < dk; ++i) {
    T* row = state + i * dv;
    const T ki = k[i];
    if (y != nullptr) {
      const T qi = q[i];
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) {
        row[j] += ki * u[j];
        y[j] += qi * row[j];
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dv; ++j) row[j] += ki * u[j];
    }
  }
}

// The pointers of one call, all contiguous: see kernels/cpu/delta_rule.h for the shapes.
template <typename T>
struct Operands {
  const T *q, *k, *v, *a, *beta;
};

// Row r's tokens in order, its state in `state` (in: the initial state; out: the final one).
template <typename T>
ATTENTION_ALWAYS_INLINE void forward_row(const Sizes& s, int64_t r, const Operands<T>& in, T* y,
                                         T* state, T* checkpoints, int64_t interval, T* m, T* u) {
  const int64_t n_checkpoints = (s.t + interval - 1) / interval;
  T* S = state + r * s.dk * s.dv;
  for (int64_t t = 0; t < s.t; ++t) {
    if (checkpoints != nullptr && t % interval == 0) {
      std::copy(S, S + s.dk * s.dv, checkpoints + (r * n_checkpoints + t / interval) * s.dk * s.dv);
    }
    const int64_t row_token = r * s.t + t;
    step(S, s.dk, s.dv, static_cast<T>(std::exp(in.a[row_token])), in.q + row_token * s.dk,
         in.k + row_token * s.dk, in.v + row_token * s.dv, in.beta + row_token * s.dv, m, u,
         y + row_token * s.dv);
  }
}

// One copy of the row loops per instruction set (the state's rows are d_v-long vectors).
ATTENTION_MULTIVERSION void forward_row_f32(const Sizes& s, int64_t r, const Operands<float>& in,
                                            float* y, float* state, float* checkpoints,
                                            int64_t interval, float* m, float* u) {
  forward_row(s, r, in, y, state, checkpoints, interval, m, u);
}
ATTENTION_MULTIVERSION void forward_row_f64(const Sizes& s, int64_t r, const Operands<double>& in,
                                            double* y, double* state, double* checkpoints,
                                            int64_t interval, double* m, double* u) {
  forward_row(s, r, in, y, state, checkpoints, interval, m, u);
}
void forward_row_any(const Sizes& s, int64_t r, const Operands<float>& in, float* y, float* state,
                     float* checkpoints, int64_t interval, float* m, float* u) {
  forward_row_f32(s, r, in, y, state, checkpoints, interval, m, u);
}
void forward_row_any(const Sizes& s, int64_t r, const Operands<double>& in, double* y,
                     double* state, double* checkpoints, int64_t interval, double* m, double* u) {
  forward_row_f64(s, r, in, y, state, checkpoints, interval, m, u);
}

template <typename T>
void forward_rows(const Sizes& s, const Operands<T>& in, T* y, T* state, T* checkpoints,
                  int64_t interval) {
  at::parallel_for(0, s.rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> m(s.dv), u(s.dv);
    for (int64_t r = begin; r < end; ++r) {
      forward_row_any(s, r, in, y, state, checkpoints, interval, m.data(), u.data());
    }
  });
}

// The reverse of one token, given the state before it (`prev`), its g, u and m, the gradient of
// its output `gy` and the gradient of the state after it (`gs`, turned into the gradient of the
// state before it). Writes the gradients of q, k, v, beta and returns the one of log g.
template <typename T>
ATTENTION_ALWAYS_INLINE T reverse_step(const T* prev, int64_t dk, int64_t dv, T g, const T* q,
                                       const T* k, const T* v, const T* beta, const T* m,
                                       const T* u, const T* gy, T* gs, T* gd, T* gq, T* gk, T* gv,
                                       T* gbeta) {
  // y = Sᵀ q and S = g prev + k uᵀ: the gradients of q, of S, then of u (gd) and of k.
  std::fill(gd, gd + dv, T(0));
  for (int64_t i = 0; i < dk; ++i) {
    const T* p = prev + i * dv;
    T* G = gs + i * dv;
    const T ki = k[i], qi = q[i];
    T dq = 0, dk_i = 0;
#pragma omp simd reduction(+ : dq, dk_i)
    for (int64_t j = 0; j < dv; ++j) {
      dq += (g * p[j] + ki * u[j]) * gy[j];
      G[j] += qi * gy[j];
      gd[j] += ki * G[j];
      dk_i += G[j] * u[j];
    }
    gq[i] = dq;
    gk[i] = dk_i;
  }
  // u = beta (v - m): the gradients of v, beta and m (gd becomes m's).
#pragma omp simd
  for (int64_t j = 0; j < dv; ++j) {
    gv[j] = beta[j] * gd[j];
    gbeta[j] = (v[j] - m[j]) * gd[j];
    gd[j] = -beta[j] * gd[j];
  }
  // m = (g prev)ᵀ k: the gradient of the decayed state, of k, then of prev and of log g.
  T dot = 0;
  for (int64_t i = 0; i < dk; ++i) {
    const T* p = prev + i * dv;
    T* G = gs + i * dv;
    const T ki = k[i];
    T dk_i = 0;
#pragma omp simd reduction(+ : dk_i, dot)
    for (int64_t j = 0; j < dv; ++j) {
      const T decayed = G[j] + ki * gd[j];
      dk_i += g * p[j] * gd[j];
      dot += decayed * p[j];
      G[j] = g * decayed;
    }
    gk[i] += dk_i;
  }
  return g * dot;
}

// The gradients the backward writes, and the gradient of the state (in: the final state's; out:
// the initial state's).
template <typename T>
struct Gradients {
  T *q, *k, *v, *a, *beta, *state;
};

// A thread's workspace for the backward: an interval of states, of m and of u.
template <typename T>
struct Replay {
  T *prev, *m, *u, *gd, *scratch;
};

// Row r's tokens newest first, one interval at a time.
template <typename T>
ATTENTION_ALWAYS_INLINE void backward_row(const Sizes& s, int64_t r, const T* gy,
                                          const Operands<T>& in, const T* checkpoints,
                                          int64_t interval, const Gradients<T>& out,
                                          const Replay<T>& w) {
  const int64_t n_checkpoints = (s.t + interval - 1) / interval;
  const int64_t state_size = s.dk * s.dv;
  T* G = out.state + r * state_size;
  for (int64_t c = n_checkpoints - 1; c >= 0; --c) {
    const int64_t t0 = c * interval, t1 = std::min(s.t, t0 + interval);
    // Replay the interval from its checkpoint: slot i keeps the state before token t0 + i, and
    // each token's m and u are kept. The last token's update goes to a scratch copy.
    const T* start = checkpoints + (r * n_checkpoints + c) * state_size;
    std::copy(start, start + state_size, w.prev);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t - t0, x = r * s.t + t;
      const T* before = w.prev + i * state_size;
      T* after = t + 1 < t1 ? w.prev + (i + 1) * state_size : w.scratch;
      std::copy(before, before + state_size, after);
      step(after, s.dk, s.dv, static_cast<T>(std::exp(in.a[x])), in.q + x * s.dk, in.k + x * s.dk,
           in.v + x * s.dv, in.beta + x * s.dv, w.m + i * s.dv, w.u + i * s.dv,
           static_cast<T*>(nullptr));
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const int64_t i = t - t0, x = r * s.t + t;
      out.a[x] =
          reverse_step(w.prev + i * state_size, s.dk, s.dv, static_cast<T>(std::exp(in.a[x])),
                       in.q + x * s.dk, in.k + x * s.dk, in.v + x * s.dv, in.beta + x * s.dv,
                       w.m + i * s.dv, w.u + i * s.dv, gy + x * s.dv, G, w.gd, out.q + x * s.dk,
                       out.k + x * s.dk, out.v + x * s.dv, out.beta + x * s.dv);
    }
  }
}

ATTENTION_MULTIVERSION void backward_row_f32(const Sizes& s, int64_t r, const float* gy,
                                             const Operands<float>& in, const float* checkpoints,
                                             int64_t interval, const Gradients<float>& out,
                                             const Replay<float>& w) {
  backward_row(s, r, gy, in, checkpoints, interval, out, w);
}
ATTENTION_MULTIVERSION void backward_row_f64(const Sizes& s, int64_t r, const double* gy,
                                             const Operands<double>& in, const double* checkpoints,
                                             int64_t interval, const Gradients<double>& out,
                                             const Replay<double>& w) {
  backward_row(s, r, gy, in, checkpoints, interval, out, w);
}
void backward_row_any(const Sizes& s, int64_t r, const float* gy, const Operands<float>& in,
                      const float* checkpoints, int64_t interval, const Gradients<float>& out,
                      const Replay<float>& w) {
  backward_row_f32(s, r, gy, in, checkpoints, interval, out, w);
}
void backward_row_any(const Sizes& s, int64_t r, const double* gy, const Operands<double>& in,
                      const double* checkpoints, int64_t interval, const Gradients<double>& out,
                      const Replay<double>& w) {
  backward_row_f64(s, r, gy, in, checkpoints, interval, out, w);
}

template <typename T>
void backward_rows(const Sizes& s, const T* gy, const Operands<T>& in, const T* checkpoints,
                   int64_t interval, const Gradients<T>& out) {
  const int64_t state_size = s.dk * s.dv;
  at::parallel_for(0, s.rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> prev(interval * state_size), m(interval * s.dv), u(interval * s.dv);
    std::vector<T> gd(s.dv), scratch(state_size);
    const Replay<T> w{prev.data(), m.data(), u.data(), gd.data(), scratch.data()};
    for (int64_t r = begin; r < end; ++r) {
      backward_row_any(s, r, gy, in, checkpoints, interval, out, w);
    }
  });
}

}  // namespace

DeltaRuleForward delta_rule_forward(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& log_decay,
                                    const torch::Tensor& beta, const torch::Tensor& initial_state,
                                    bool checkpoints) {
  const Sizes s = sizes_of(q, v);
  DeltaRuleForward out;
  out.interval = interval_for(s, q.element_size());
  out.output = torch::empty({s.rows, s.t, s.dv}, v.options());
  out.state = initial_state.clone(at::MemoryFormat::Contiguous);
  if (checkpoints) {
    out.checkpoints =
        torch::empty({s.rows, (s.t + out.interval - 1) / out.interval, s.dk, s.dv}, v.options());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_rule_forward", [&] {
    const Operands<scalar_t> in{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                v.data_ptr<scalar_t>(), log_decay.data_ptr<scalar_t>(),
                                beta.data_ptr<scalar_t>()};
    forward_rows<scalar_t>(s, in, out.output.data_ptr<scalar_t>(), out.state.data_ptr<scalar_t>(),
                           checkpoints ? out.checkpoints.data_ptr<scalar_t>() : nullptr,
                           out.interval);
  });
  return out;
}

DeltaRuleGradients delta_rule_backward(const torch::Tensor& grad_output,
                                       const torch::Tensor& grad_state, const torch::Tensor& q,
                                       const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& log_decay, const torch::Tensor& beta,
                                       const DeltaRuleForward& forward) {
  const Sizes s = sizes_of(q, v);
  DeltaRuleGradients g;
  g.q = torch::empty_like(q);
  g.k = torch::empty_like(k);
  g.v = torch::empty_like(v);
  g.log_decay = torch::empty_like(log_decay);
  g.beta = torch::empty_like(beta);
  g.initial_state = grad_state.defined() ? grad_state.clone(at::MemoryFormat::Contiguous)
                                         : torch::zeros({s.rows, s.dk, s.dv}, v.options());
  const auto gy = grad_output.contiguous();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_rule_backward", [&] {
    const Operands<scalar_t> in{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                v.data_ptr<scalar_t>(), log_decay.data_ptr<scalar_t>(),
                                beta.data_ptr<scalar_t>()};
    const Gradients<scalar_t> out{
        g.q.data_ptr<scalar_t>(),    g.k.data_ptr<scalar_t>(),
        g.v.data_ptr<scalar_t>(),    g.log_decay.data_ptr<scalar_t>(),
        g.beta.data_ptr<scalar_t>(), g.initial_state.data_ptr<scalar_t>()};
    backward_rows<scalar_t>(s, gy.data_ptr<scalar_t>(), in,
                            forward.checkpoints.data_ptr<scalar_t>(), forward.interval, out);
  });
  return g;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
