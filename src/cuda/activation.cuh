// The CUDA backend's math types for the activation policies
// (core/activation.hpp), one per accumulation precision, and the choice of
// one per activation dtype T.
//
// - MathF32 (fp32, fp16 and bf16 activations): MUFU ex2 + rcp with
//   flush-to-zero, a few ulp, far below every tolerance (the IEEE division was
//   a ~15-instruction subroutine per element, the denormal handling of __expf
//   three more).  z -> +inf: 2^-inf flushes to 0, sigmoid 1; z -> -inf:
//   rcp(inf) = 0.  Accurate over the whole range, the negative tail included.
//   (The 16-bit kernels used to evaluate SiLU's tanh form with one MUFU.TANH
//   instead; tanh.approx's relative error of 2^-11 near -1 made
//   silu(z) = h (1 + tanh h), h = z/2, wrong by up to 10% at z = -6 and by
//   orders of magnitude further out, so they pay the second MUFU.)
// - MathF64 (fp64 activations): exp and IEEE division.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/activation.hpp"

namespace shortconv::cuda {

struct MathF32 {
  using V = float;
  static constexpr bool kTanhForm = false;
  __device__ __forceinline__ static float one() { return 1.f; }
  __device__ __forceinline__ static float fma(float a, float b, float c) { return fmaf(a, b, c); }
  __device__ __forceinline__ static float exp(float x) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 1.4426950408889634f));
    return e;
  }
  __device__ __forceinline__ static float div(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    return a * r;
  }
  __device__ __forceinline__ static float tanh(float h) { return h; }  // (kTanhForm is false)
};

struct MathF64 {
  using V = double;
  static constexpr bool kTanhForm = false;
  __device__ __forceinline__ static double one() { return 1.0; }
  __device__ __forceinline__ static double fma(double a, double b, double c) { return ::fma(a, b, c); }
  __device__ __forceinline__ static double exp(double x) { return ::exp(x); }
  __device__ __forceinline__ static double div(double a, double b) { return a / b; }
  __device__ __forceinline__ static double tanh(double h) { return h; }
};

// The math of activation dtype T (the kernels' template parameter): fp32 math
// for every 32-bit accumulation, fp16 / bf16 included.
template <class T>
using MathOf = std::conditional_t<std::is_same_v<T, double>, MathF64, MathF32>;

// A kernel's activation: compile-time SiLU in the full-window instances
// (FULL), else the one a.act names, selected per element (RuntimeAct).
template <class T, bool FULL>
using ActOf = std::conditional_t<FULL, FixedAct<MathOf<T>, Silu>, RuntimeAct<MathOf<T>>>;
template <class T, bool FULL>
__device__ __forceinline__ ActOf<T, FULL> act_of(int id) {
  ActOf<T, FULL> act{};
  if constexpr (!FULL) act.id = id;
  return act;
}

}  // namespace shortconv::cuda
