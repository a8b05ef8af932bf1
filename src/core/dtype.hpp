// Host-side scalar conversions between the storage dtypes and float/double.
// bf16 and fp16 are converted bit-exactly with round-to-nearest-even, the same
// rounding the CUDA intrinsics use, so every backend rounds outputs alike.
#pragma once

#include <cstdint>
#include <cstring>

#include "shortconv/shortconv.h"

namespace shortconv {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow to inf (incl. rounding)
  if (absu < 0x38800000u) {                                  // subnormal or zero in fp16
    if (absu < 0x33000000u) return uint16_t(sign);            // below half the smallest subnormal
    uint32_t man = (absu & 0x7fffffu) | 0x800000u;
    int shift = 113 - int(absu >> 23) + 13;  // 126 - exp + 14 - 1 ... bits to drop
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

inline bool is_float_dtype(int32_t dt) { return dt == SC_F32 || dt == SC_F16 || dt == SC_BF16 || dt == SC_F64; }
inline bool is_index_dtype(int32_t dt) { return dt == SC_I32 || dt == SC_I64; }

inline bool is_flag_dtype(int32_t dt) { return dt == SC_BOOL || is_index_dtype(dt); }

inline int dtype_size(int32_t dt) {
  switch (dt) {
    case SC_F32: case SC_I32: return 4;
    case SC_F16: case SC_BF16: return 2;
    case SC_F64: case SC_I64: return 8;
    case SC_BOOL: return 1;
    default: return 0;
  }
}

inline const char* dtype_name(int32_t dt) {
  switch (dt) {
    case SC_F32: return "float32";
    case SC_F16: return "float16";
    case SC_BF16: return "bfloat16";
    case SC_F64: return "float64";
    case SC_I32: return "int32";
    case SC_I64: return "int64";
    case SC_BOOL: return "bool";
    default: return "unknown";
  }
}

// Element `off` of a float tensor of dtype dt, as double.
inline double load_f64(const void* p, int32_t dt, int64_t off) {
  switch (dt) {
    case SC_F32: return static_cast<const float*>(p)[off];
    case SC_F64: return static_cast<const double*>(p)[off];
    case SC_BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
    case SC_F16: return f16_to_f32(static_cast<const uint16_t*>(p)[off]);
    default: return 0.0;
  }
}

// Stores v (rounded once to the storage dtype; fp16/bf16 via float, which is
// exact for any double that float represents and otherwise rounds twice only
// in the last bit of a bf16/fp16 tie, far below every tolerance).
inline void store_f64(void* p, int32_t dt, int64_t off, double v) {
  switch (dt) {
    case SC_F32: static_cast<float*>(p)[off] = float(v); break;
    case SC_F64: static_cast<double*>(p)[off] = v; break;
    case SC_BF16: static_cast<uint16_t*>(p)[off] = f32_to_bf16(float(v)); break;
    case SC_F16: static_cast<uint16_t*>(p)[off] = f32_to_f16(float(v)); break;
    default: break;
  }
}

}  // namespace shortconv
