// The CUDA backend's math types for the activation policies
// (core/activation.hpp), one per accumulation precision, and the choice of
// one per activation dtype T.
//
// - MathF32 (fp32 activations): MUFU ex2 + rcp with flush-to-zero, a few ulp,
//   far below the 1e-5 fp32 tolerance (the IEEE division was a ~15-instruction
//   subroutine per element, the denormal handling of __expf three more).
//   z -> +inf: 2^-inf flushes to 0, sigmoid 1; z -> -inf: rcp(inf) = 0.
// - MathTanh (fp16 / bf16 activations): kTanhForm; one MUFU.TANH per element
//   (relative error ~5e-4: below bf16's rounding unit 2^-8, about fp16's
//   2^-11); the activations with a tanh form run on h = pre / 2, halving the
//   MUFU work that bounded the 16-bit kernels.  Every path that writes a
//   16-bit y uses it, so y is bitwise identical across paths and tilings.
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

struct MathTanh : MathF32 {
  static constexpr bool kTanhForm = true;
  __device__ __forceinline__ static float tanh(float h) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
    return t;
  }
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

// The math of activation dtype T (the kernels' template parameter).
template <class T>
using MathOf = std::conditional_t<std::is_same_v<T, double>, MathF64,
                                  std::conditional_t<sizeof(T) == 2, MathTanh, MathF32>>;

}  // namespace shortconv::cuda
