// Strided element copies between dtypes for the CPU backend's scalar phases
// (weight packing, the halo and the final states: cpu.cpp), one loop per
// (source, destination) dtype pair, so that each is a typed loop the compiler
// vectorises instead of a dtype switch per element.  Every element is
// converted exactly as store_f64(load_f64(.)) converts it (core/dtype.hpp):
// through double, rounded once to the destination (copies stay exact).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.hpp"

namespace shortconv::cpu {

namespace copy_detail {

// get / put through M = float when neither side is f64 (every 16-bit and f32
// value is a float, and double -> float -> 16 bits rounds like float -> 16
// bits), else double: the results of store_f64(load_f64(.)), fewer conversions.
template <int DT> struct Elem;
template <> struct Elem<SC_F32> {
  using T = float;
  template <class M> static M get(T v) { return M(v); }
  template <class M> static T put(M v) { return float(v); }
};
template <> struct Elem<SC_F64> {
  using T = double;
  template <class M> static M get(T v) { return M(v); }
  template <class M> static T put(M v) { return double(v); }
};
template <> struct Elem<SC_BF16> {
  using T = uint16_t;
  template <class M> static M get(T v) { return M(bf16_to_f32(v)); }
  template <class M> static T put(M v) { return f32_to_bf16(float(v)); }
};
template <> struct Elem<SC_F16> {
  using T = uint16_t;
  template <class M> static M get(T v) { return M(f16_to_f32(v)); }
  template <class M> static T put(M v) { return f32_to_f16(float(v)); }
};

template <int SD, int DD>
void copy_typed(const void* src, int64_t ss, void* dst, int64_t ds, int64_t n) {
  using M = std::conditional_t<SD == SC_F64 || DD == SC_F64, double, float>;
  const auto* s = static_cast<const typename Elem<SD>::T*>(src);
  auto* d = static_cast<typename Elem<DD>::T*>(dst);
  if constexpr (SD == DD) {  // the same dtype: a copy of the bits
    if (ss == 1 && ds == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = s[i];
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
    }
  } else if (ss == 1 && ds == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = Elem<DD>::put(Elem<SD>::template get<M>(s[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * ds] = Elem<DD>::put(Elem<SD>::template get<M>(s[i * ss]));
  }
}

using CopyFn = void (*)(const void*, int64_t, void*, int64_t, int64_t);

constexpr int slot(int32_t dt) { return dt == SC_F32 ? 0 : dt == SC_F64 ? 1 : dt == SC_BF16 ? 2 : 3; }

template <int SD>
constexpr CopyFn row(int dd) {
  return dd == 0 ? &copy_typed<SD, SC_F32> : dd == 1 ? &copy_typed<SD, SC_F64>
       : dd == 2 ? &copy_typed<SD, SC_BF16> : &copy_typed<SD, SC_F16>;
}

}  // namespace copy_detail

// dst[i * ds] = src[i * ss] for i in [0, n), converted from dtype sdt to ddt
// (float dtypes; strides in elements).
inline void copy_elems(const void* src, int32_t sdt, int64_t ss, void* dst, int32_t ddt,
                       int64_t ds, int64_t n) {
  using namespace copy_detail;
  const int dd = slot(ddt);
  switch (slot(sdt)) {
    case 0: return row<SC_F32>(dd)(src, ss, dst, ds, n);
    case 1: return row<SC_F64>(dd)(src, ss, dst, ds, n);
    case 2: return row<SC_BF16>(dd)(src, ss, dst, ds, n);
    default: return row<SC_F16>(dd)(src, ss, dst, ds, n);
  }
}

// dst[k * L + i] = src[i * ss + k] for i in [0, n), k in [0, m): a block of n channels' m
// adjacent taps (weight [D, W], tap stride 1, source dtype sdt) transposed into [m][L] of A
// (float or double), converted as copy_elems converts.  One typed loop over the block
// instead of m strided copies, which made the per-call weight packing of a batch-1 decode
// step (cpu.cpp, pack_params) the largest part of its library time (bench/RESULTS.md,
// 2026-12-06).
// (MT > 0: m == MT, a compile-time count the compiler unrolls; 0: any m.)
template <int SD, int MT, class A>
void transpose_typed(const void* src, int64_t ss, A* dst, int64_t L, int64_t n, int m) {
  using M = std::conditional_t<SD == SC_F64 || std::is_same_v<A, double>, double, float>;
  const auto* s = static_cast<const typename copy_detail::Elem<SD>::T*>(src);
  const int mm = MT > 0 ? MT : m;
  for (int64_t i = 0; i < n; ++i, s += ss)
    for (int k = 0; k < mm; ++k) dst[k * L + i] = A(copy_detail::Elem<SD>::template get<M>(s[k]));
}
template <int SD, class A>
void transpose_w(const void* src, int64_t ss, A* dst, int64_t L, int64_t n, int m) {
  switch (m) {  // the common widths unrolled
    case 2: return transpose_typed<SD, 2>(src, ss, dst, L, n, m);
    case 3: return transpose_typed<SD, 3>(src, ss, dst, L, n, m);
    case 4: return transpose_typed<SD, 4>(src, ss, dst, L, n, m);
    default: return transpose_typed<SD, 0>(src, ss, dst, L, n, m);
  }
}
template <class A>
void transpose_elems(const void* src, int32_t sdt, int64_t ss, A* dst, int64_t L, int64_t n, int m) {
  switch (copy_detail::slot(sdt)) {
    case 0: return transpose_w<SC_F32>(src, ss, dst, L, n, m);
    case 1: return transpose_w<SC_F64>(src, ss, dst, L, n, m);
    case 2: return transpose_w<SC_BF16>(src, ss, dst, L, n, m);
    default: return transpose_w<SC_F16>(src, ss, dst, L, n, m);
  }
}

// The dtype code of the accumulation type A (float or double).
template <class A>
constexpr int32_t acc_dtype() { return sizeof(A) == 8 ? SC_F64 : SC_F32; }

// Element offset e of a tensor as a pointer (e elements of dtype dt past data).
inline const void* elem_ptr(const void* data, int32_t dt, int64_t e) {
  return static_cast<const char*>(data) + e * dtype_size(dt);
}
inline void* elem_ptr(void* data, int32_t dt, int64_t e) {
  return static_cast<char*>(data) + e * dtype_size(dt);
}

}  // namespace shortconv::cpu
