// Activations: one policy type each, the only place their math lives.
//
// The oracle, the CPU kernels and the CUDA kernels evaluate y = act(pre) and
// dpre = dy * act'(pre) through these policies, written once over a math type
// M that each backend supplies for its precision:
//
//   M::V               the value type: double, float, a SIMD vector of floats
//   M::one()           1 as a V
//   M::exp(x)          e^x, with the backend's accuracy (+inf past its range)
//   M::div(a, b)       a / b (CUDA fp32: a * rcp(b))
//   M::fma(a, b, c)    a * b + c
//   M::kTanhForm       true where tanh is the cheap primitive: activations
//                      with a tanh form are then evaluated on h = pre / 2
//                      (one tanh instead of exp + division; only for a tanh
//                      accurate near +-1, where 1 + tanh h cancels: every
//                      backend's math today has it false, and the form is
//                      tested on the host: activation_test.cpp)
//   M::tanh(h)         tanh, only used when kTanhForm
//
// A policy provides
//
//   kId, kName         its sc_activation value and name
//   scale<M>()         the factor the kernels multiply weights and bias by on
//                      load (1, or 0.5 for a tanh form: exact, a power of two),
//                      so that the fma chain sums p = scale * pre
//   value<M>(p)        act(pre)
//   dgrad<M>(dy, p)    dy * act'(pre) / scale: the kernels sum dx with the
//                      scaled weights (w * scale * dgrad = w * dpre) and
//                      multiply weight / bias partial sums by scale once
//
// Adding an activation: its value in the ABI enum (shortconv.h), a policy
// here, its name in the Activations list below, and the tests
// (tests/cpp/activation_test.cpp sweeps every listed activation over every
// dtype's range).  Nothing else names an activation: validation, the kernel
// tables, the CUDA runtime selection and the Python package's names all come
// from this list.
#pragma once

#include "shortconv/shortconv.h"

// Host code inlines the policies always: the CPU kernels call them with SIMD
// vector types from functions compiled for a wider instruction set
// (cpu_isa_*.cpp), and an out-of-line call would cross ABIs.
#if defined(__CUDACC__)
#define SC_HD __host__ __device__ __forceinline__
#define SC_HD_CONSTEXPR __host__ __device__ constexpr
#else
#define SC_HD inline __attribute__((always_inline))
#define SC_HD_CONSTEXPR constexpr
#endif

namespace shortconv {

// y = pre.
struct Identity {
  static constexpr sc_activation kId = SC_ACT_NONE;
  static constexpr const char* kName = "identity";
  template <class M>
  SC_HD_CONSTEXPR static float scale() { return 1.f; }
  template <class M, class V>
  SC_HD static V value(V p) { return p; }
  template <class M, class V>
  SC_HD static V dgrad(V dy, V) { return dy; }
};

// y = pre * sigmoid(pre) = pre / (1 + e^-pre);
// y' = s (1 + pre (1 - s)), s = sigmoid(pre).
// Tanh form (h = pre / 2, t = tanh h): y = h + h t, 2 y' = 1 + t + h (1 - t^2).
struct Silu {
  static constexpr sc_activation kId = SC_ACT_SILU;
  static constexpr const char* kName = "silu";
  template <class M>
  SC_HD_CONSTEXPR static float scale() { return M::kTanhForm ? 0.5f : 1.f; }
  template <class M, class V>
  SC_HD static V value(V p) {
    if constexpr (M::kTanhForm) {
      return M::fma(p, M::tanh(p), p);
    } else {
      return M::div(p, M::one() + M::exp(-p));
    }
  }
  template <class M, class V>
  SC_HD static V dgrad(V dy, V p) {
    if constexpr (M::kTanhForm) {  // dy (1 + v) = 2 dpre, v = t + h (1 - t^2)
      const V t = M::tanh(p);
      return M::fma(dy, M::fma(p, M::fma(-t, t, M::one()), t), dy);
    } else {
      const V s = M::div(M::one(), M::one() + M::exp(-p));
      return dy * (s * M::fma(p, M::one() - s, M::one()));
    }
  }
};

// ---- the list -------------------------------------------------------------------

template <class... P>
struct ActList {
  static constexpr int kCount = int(sizeof...(P));
  // ids are the positions in the list (kernel tables are indexed by id)
  static constexpr bool ids_are_positions() {
    int i = 0;
    return ((int(P::kId) == i++) && ...);
  }
};
using Activations = ActList<Identity, Silu>;
static_assert(Activations::ids_are_positions(), "list activations in sc_activation order");

// The policy of a run-time id: calls f(Policy{}) and returns true, or false
// when no listed activation has that id.
template <class F, class... P>
constexpr bool with_activation_in(ActList<P...>, int id, F&& f) {
  return ((id == int(P::kId) ? (f(P{}), true) : false) || ...);
}
template <class F>
constexpr bool with_activation(int id, F&& f) {
  return with_activation_in(Activations{}, id, static_cast<F&&>(f));
}

// The listed name of an id, or nullptr.
inline const char* activation_name(int id) {
  const char* name = nullptr;
  with_activation(id, [&](auto a) { name = decltype(a)::kName; });
  return name;
}

// An activation chosen at run time inside a kernel (the generic CUDA
// instances, the oracle): every listed activation is evaluated and the one
// with the id selected, branch-free (a per-element branch kept the compiler
// from interleaving neighbouring elements' MUFU chains).
template <class M>
struct RuntimeAct {
  int id;
  template <class V>
  SC_HD V value(V p) const { return pick(Activations{}, p, [&](auto a, V q) { return decltype(a)::template value<M>(q); }); }
  template <class V>
  SC_HD V dgrad(V dy, V p) const {
    return pick(Activations{}, p, [&](auto a, V q) { return decltype(a)::template dgrad<M>(dy, q); });
  }
  SC_HD float scale() const {
    float s = 1.f;
    select_scale(Activations{}, &s);
    return s;
  }

 private:
  template <class V, class F, class... P>
  SC_HD V pick(ActList<P...>, V p, F&& f) const {
    V r = p;
    ((r = id == int(P::kId) ? f(P{}, p) : r), ...);
    return r;
  }
  template <class... P>
  SC_HD void select_scale(ActList<P...>, float* s) const {
    ((*s = id == int(P::kId) ? P::template scale<M>() : *s), ...);
  }
};

// A compile-time activation with RuntimeAct's interface (the specialised
// kernel instances).
template <class M, class P>
struct FixedAct {
  template <class V>
  SC_HD V value(V p) const { return P::template value<M>(p); }
  template <class V>
  SC_HD V dgrad(V dy, V p) const { return P::template dgrad<M>(dy, p); }
  SC_HD_CONSTEXPR static float scale() { return P::template scale<M>(); }
};

}  // namespace shortconv
