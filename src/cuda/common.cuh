// Shared device-side pieces of the CUDA backend: the kernel argument block,
// dtype conversions, raw-word vectors, clamped sequence / state-row lookups,
// the extended sequence u_n = h0_n ++ x_n as a scalar loader and the tile
// walker.  (Activations: activation.cuh; kernel shapes: traits.hpp.)
//
// Every index is 64-bit.  cu_seqlens, state indices and seq_idx live in device
// memory and are never validated on the host, so every lookup here clamps:
// offsets into [0, total], out-of-range pool rows (and ids) become -1 (no state).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "shortconv/shortconv.h"

namespace shortconv::cuda {

// A strided tensor as the kernels see it (element strides, like core View).
struct DTensor {
  void* p = nullptr;   // nullptr: absent
  int32_t dt = 0;      // sc_dtype
  int64_t n0 = 1;      // shape[0] (pool rows for states, entries for indices)
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

// Everything a kernel needs, passed by value (1400 bytes), as kernel
// parameters: the first read of each of the block's lines in a launch misses
// the constant cache, and a warp waits for that miss before its next
// instruction.  The fields a decode step reads before its row index's load
// (sizes, pad index, index and state tensors, flags) come first, in as few
// lines as they fit.
struct Args {
  int W, S, act;            // width, state length, activation
  int state_io;             // decode: how state rows are accessed (plan.hpp StateIo)
  int64_t B, T, D, N;       // x viewed [B, T, D]; packed: B == 1, T = total
  bool packed;
  int64_t pad_index;        // a state index meaning "no row", besides -1
  DTensor h0_idx, ht_idx, h0, ht;  // state rows: [N] pool indices (absent: row n), pools
  DTensor has_h0, ring;     // state addressing: [N] flags, [N] ring offsets
  DTensor table;            // block tables: [N, M] pool rows (s0, s1 strides)
  DTensor accepted;         // serving: [N] num_accepted (speculative decoding)
  DTensor x, weight, bias, residual, cu, y;                          // forward
  DTensor dy, dht, dx, dweight, dbias, dh0;                          // backward
  DTensor parents;          // serving: [N, M] parent_tokens (tree drafts); s0, s1 strides
  int64_t parent_cols;      // M
  DTensor init_blk, final_blk, first_blk, computed;  // [N] each (prefix caching: the last two)
  int64_t table_cols;       // M
  int64_t block_size;       // > 0: prefix caching (snapshots at block boundaries)
  DTensor sid;              // seq_idx [B, T] (n0 = B; s0, s1), absent: nullptr
  // tiling of the (batch, time) axis: a tile is tile_t consecutive tokens of
  // one batch row (dense), of the packed token axis, or of the B*T tokens
  // row after row (seq_idx); `axis` tokens per tiled row (T, or B*T).
  int64_t tile_t, tiles_per_row, ntiles, axis;
  // seq_idx: tokens past a tile whose run boundary the walker finds exactly
  // (the backward's look-ahead, and S more with dfinal_state: its terms).
  int64_t ahead;
  void* part;               // workspace: per-part dweight/dbias partials [parts, D, W+1]
  void* dpre;               // workspace: dpre [B*T, D] (general path only)
  int zero_pads;            // padded sequences' y = 0 (fwd_decode_plain, zero_padded_y)
};

// ---- dtype conversions ------------------------------------------------------

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <class T> using acc_t = typename AccOf<T>::type;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ double to_f(double v) { return v; }

// The sc_dtype code of a storage type.
template <class T> struct DtypeCode;
template <> struct DtypeCode<float> { static constexpr int32_t value = SC_F32; };
template <> struct DtypeCode<__half> { static constexpr int32_t value = SC_F16; };
template <> struct DtypeCode<__nv_bfloat16> { static constexpr int32_t value = SC_BF16; };
template <> struct DtypeCode<double> { static constexpr int32_t value = SC_F64; };

// Rounds an accumulator to the storage type T (round to nearest even).
template <class T, class A>
__device__ __forceinline__ T to_t(A v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(float(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(float(v));
  else return T(v);
}

// Runtime-dtype scalar load / store (parameters, states, and the slow paths).
template <class A>
__device__ __forceinline__ A ld(const void* p, int32_t dt, int64_t off) {
  switch (dt) {
    case SC_F32: return A(static_cast<const float*>(p)[off]);
    case SC_F16: return A(__half2float(static_cast<const __half*>(p)[off]));
    case SC_BF16: return A(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]));
    default: return A(static_cast<const double*>(p)[off]);
  }
}

template <class A>
__device__ __forceinline__ void st(void* p, int32_t dt, int64_t off, A v) {
  switch (dt) {
    case SC_F32: static_cast<float*>(p)[off] = float(v); break;
    case SC_F16: static_cast<__half*>(p)[off] = __float2half_rn(float(v)); break;
    case SC_BF16: static_cast<__nv_bfloat16*>(p)[off] = __float2bfloat16_rn(float(v)); break;
    default: static_cast<double*>(p)[off] = double(v); break;
  }
}

// out[i] = ok(i) ? t[off(i)] : 0 for i < N, with t's runtime dtype resolved
// once: the N loads are issued back to back, and converted after the last.
// (ld<A> per element put a dtype branch, and the conversion's wait for its
// load, between consecutive loads: the parameter loads at a kernel's start
// became N dependent L2 round trips, ~0.25 us each, before the first token.)
template <class S, class A, int N, class Off, class Ok>
__device__ __forceinline__ void ld_many_as(const void* p, Off off, Ok ok, A (&out)[N]) {
  const S* s = static_cast<const S*>(p);
  S raw[N];
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (ok(i)) raw[i] = s[off(i)];
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = ok(i) ? A(to_f(raw[i])) : A(0);
}
template <class A, int N, class Off, class Ok>
__device__ __forceinline__ void ld_many(const DTensor& t, Off off, Ok ok, A (&out)[N]) {
  switch (t.dt) {
    case SC_F32: ld_many_as<float>(t.p, off, ok, out); break;
    case SC_F16: ld_many_as<__half>(t.p, off, ok, out); break;
    case SC_BF16: ld_many_as<__nv_bfloat16>(t.p, off, ok, out); break;
    default:  // fp64 parameters: rare; converted as loaded (deferred, they spilled fp32 kernels)
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = ok(i) ? A(static_cast<const double*>(t.p)[off(i)]) : A(0);
      break;
  }
}

// The taps and bias of CH consecutive channels d0.. (channels >= live_d read
// as 0), scaled: wp[k][c] = scale * weight[d0 + c, k - kpad] for k >= kpad
// (0 below: pad taps), bs[c] = scale * bias[d0 + c] (0 without a bias).
template <class A, int WMAX, int CH>
__device__ __forceinline__ void load_taps(const DTensor& w, const DTensor& bias, int64_t d0,
                                          int64_t live_d, int kpad, A scale, A (&wp)[WMAX][CH],
                                          A (&bs)[CH]) {
  A wf[WMAX * CH], bf[CH];
  ld_many(
      w, [&](int i) { return (d0 + i % CH) * w.s0 + (i / CH - kpad) * w.s1; },
      [&](int i) { return i / CH >= kpad && d0 + i % CH < live_d; }, wf);
  if (bias.p)
    ld_many(
        bias, [&](int c) { return (d0 + c) * bias.s0; }, [&](int c) { return d0 + c < live_d; }, bf);
#pragma unroll
  for (int c = 0; c < CH; ++c) {
#pragma unroll
    for (int j = 0; j < WMAX; ++j) wp[j][c] = scale * wf[j * CH + c];
    bs[c] = bias.p ? scale * bf[c] : A(0);
  }
}

// One channel's taps newest first (the channel-major kernels' order):
// wr[j] = scale * weight[d, W-1-j] for j < W (0 above), *bs = scale * bias[d].
template <class A, int WMAX>
__device__ __forceinline__ void load_taps_newest_first(const DTensor& w, const DTensor& bias,
                                                       int64_t d, int W, A scale, A (&wr)[WMAX],
                                                       A* bs) {
  A wf[WMAX];
  ld_many(
      w, [&](int j) { return d * w.s0 + (W - 1 - j) * w.s1; }, [&](int j) { return j < W; }, wf);
#pragma unroll
  for (int j = 0; j < WMAX; ++j) wr[j] = scale * wf[j];
  *bs = bias.p ? scale * ld<A>(bias.p, bias.dt, d * bias.s0) : A(0);
}

// sc_exec.overlap (programmatic dependent launch, sm_90 and newer).  A kernel
// launched with the attribute (Launch::overlap) may start while the kernel
// before it in the stream still runs.  overlap_wait() returns once that kernel
// has completed and its writes are visible, then lets the kernel after this
// one start early.  Released only after the wait: a kernel that starts early
// then finds every kernel before its immediate predecessor complete, so reads
// it issues before its own wait race with that predecessor alone
// (SC_OVERLAP_READS' contract).  Compiled out below sm_90, where the launcher
// never attaches the attribute (it checks the kernel's PTX version, not only
// the device's).  Kernels take it through a template parameter (kOverlap*):
// the instances of plain launches hold none of it, main's code instruction
// for instruction.  (With it compiled into every launch, executed or behind a
// branch on an argument, plain launches timed 5-7% slower than main's; with
// main's code they still timed 3-9% slower in a bench that had made
// overlapped launches first, so what the instructions cost is not settled:
// bench/RESULTS.md, 2026-12-06.)
constexpr int kOverlapNone = SC_OVERLAP_NONE;      // a plain launch
constexpr int kOverlapLaunch = SC_OVERLAP_LAUNCH;  // waits before its first access to memory
constexpr int kOverlapReads = SC_OVERLAP_READS;    // reads its rows, indices and taps first
static_assert(kOverlapNone == 0 && kOverlapLaunch == 1 && kOverlapReads == 2,
              "a launcher's names are indexed by the overlap mode (with_overlap)");
// The plan's overlap mode as a template argument: f(std::integral_constant<int, OV>{}),
// OV = overlap, kOverlapNone for any other value.  A launcher keeps its kernel names in
// an array indexed by OV: {plain, "overlapped, ", "reads ahead, "}.
template <class F>
cudaError_t with_overlap(int overlap, F&& f) {
  switch (overlap) {
    case kOverlapReads: return f(std::integral_constant<int, kOverlapReads>{});
    case kOverlapLaunch: return f(std::integral_constant<int, kOverlapLaunch>{});
    default: return f(std::integral_constant<int, kOverlapNone>{});
  }
}
__device__ __forceinline__ void overlap_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ int64_t ld_index(const DTensor& t, int64_t i) {
  return t.dt == SC_I32 ? int64_t(static_cast<const int32_t*>(t.p)[i * t.s0])
                        : static_cast<const int64_t*>(t.p)[i * t.s0];
}

// ---- vectors of CH consecutive elements ---------------------------------------------
//
// A Pack holds the raw bits of CH elements in 32-bit words and converts
// element by element to the accumulator type.  (A struct of __nv_bfloat16
// members was copied and stored 16 bits at a time by the compiler: PRMT
// shuffles per element and split stores, seen in SASS.)

template <class T, int CH>
struct Pack {
  using A = acc_t<T>;
  static constexpr int kBytes = int(sizeof(T)) * CH;
  static constexpr int kWords = kBytes < 4 ? 1 : kBytes / 4;
  unsigned w[kWords];

  __device__ __forceinline__ static Pack zero() {
    Pack p;
#pragma unroll
    for (int i = 0; i < kWords; ++i) p.w[i] = 0u;  // +0.0 in every dtype
    return p;
  }
  // Element i (a compile-time index after unrolling) as the accumulator type.
  __device__ __forceinline__ A get(int i) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const unsigned x = w[i / 2];
      return __uint_as_float((i % 2) ? (x & 0xffff0000u) : (x << 16));
    } else if constexpr (std::is_same_v<T, __half>) {
      const unsigned x = w[i / 2];
      return __half2float(__ushort_as_half((unsigned short)((i % 2) ? (x >> 16) : (x & 0xffffu))));
    } else if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(w[i]);
    } else {
      return __hiloint2double(int(w[2 * i + 1]), int(w[2 * i]));
    }
  }
  // Rounds CH accumulators once to T (round to nearest even).
  __device__ __forceinline__ static Pack make(const A (&v)[CH]) {
    Pack p;
    if constexpr (sizeof(T) == 2) {
      if constexpr (CH == 1) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>)
          p.w[0] = __bfloat16_as_ushort(__float2bfloat16_rn(v[0]));
        else
          p.w[0] = __half_as_ushort(__float2half_rn(v[0]));
      } else {
#pragma unroll
        for (int j = 0; j < CH / 2; ++j) {
          if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
            memcpy(&p.w[j], &h, 4);
          } else {
            const __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
            memcpy(&p.w[j], &h, 4);
          }
        }
      }
    } else if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < CH; ++i) p.w[i] = __float_as_uint(v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const long long b = __double_as_longlong(v[i]);
        p.w[2 * i] = unsigned(b);
        p.w[2 * i + 1] = unsigned(b >> 32);
      }
    }
    return p;
  }
};

// One pack at p (aligned to its size), one vector access.
template <class T, int CH>
__device__ __forceinline__ Pack<T, CH> ldp(const T* p) {
  Pack<T, CH> v;
  constexpr int kBytes = Pack<T, CH>::kBytes;
  if constexpr (kBytes == 2) {
    v.w[0] = *reinterpret_cast<const unsigned short*>(p);
  } else if constexpr (kBytes == 4) {
    v.w[0] = *reinterpret_cast<const unsigned*>(p);
  } else if constexpr (kBytes == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    v.w[0] = r.x;
    v.w[1] = r.y;
  } else {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    v.w[0] = r.x;
    v.w[1] = r.y;
    v.w[2] = r.z;
    v.w[3] = r.w;
  }
  return v;
}
template <class T, int CH>
__device__ __forceinline__ void stp(T* p, const Pack<T, CH>& v) {
  constexpr int kBytes = Pack<T, CH>::kBytes;
  // Inline PTX: plain uint2/uint4 stores of these words came out as 32-bit
  // pieces (ptx st.global.u32); one vector store per pack is the point.
  if constexpr (kBytes == 2)
    *reinterpret_cast<unsigned short*>(p) = (unsigned short)v.w[0];
  else if constexpr (kBytes == 4)
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v.w[0]) : "memory");
  else if constexpr (kBytes == 8)
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  else
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]),
                 "r"(v.w[2]), "r"(v.w[3]) : "memory");
}

// Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), in commit
// groups: a kernel keeps several loads in flight per thread without holding
// their registers.  `valid` false zero-fills dst and reads nothing (src must
// still be a pointer into the tensor).  Before sm_80: a synchronous copy.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
// One pack (4, 8 or 16 bytes, aligned to its size) copied global -> shared
// by cp.async into the caller's commit group (.cg, L2 only, takes 16 bytes
// alone; the narrower copies go .ca).  Before sm_80: a synchronous copy.
template <class T, int CH>
__device__ __forceinline__ void cp_async_pack(Pack<T, CH>* dst, const T* src) {
  constexpr int kBytes = Pack<T, CH>::kBytes;
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async moves 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(src), "n"(kBytes) : "memory");
#else
  *dst = ldp<T, CH>(src);
#endif
}
// A pack read back from shared memory (one vector access: ldp's, on the
// shared-memory address the pointer is known to hold).
template <class T, int CH>
__device__ __forceinline__ Pack<T, CH> lds_pack(const Pack<T, CH>* p) {
  return ldp<T, CH>(reinterpret_cast<const T*>(p));
}
// A 16-byte pack from its staged words (the thread's own, after cp_async_wait).
template <class T, int CH>
__device__ __forceinline__ Pack<T, CH> pack_of(const uint4& r) {
  static_assert(Pack<T, CH>::kBytes == 16, "a staged pack is one 16-byte vector");
  Pack<T, CH> v;
  v.w[0] = r.x;
  v.w[1] = r.y;
  v.w[2] = r.z;
  v.w[3] = r.w;
  return v;
}

// Element (batch row b, token 0, channel d) of an activation tensor as a typed
// pointer (x, residual, y, dy, dx: [B, T, D] element strides s0, s1, s2);
// nullptr when the tensor is absent.
template <class T>
__device__ __forceinline__ T* row_ptr(const DTensor& t, int64_t b, int64_t d) {
  using E = std::remove_const_t<T>;
  return t.p ? static_cast<E*>(t.p) + b * t.s0 + d * t.s2 : nullptr;
}

// ---- sequences and state rows (clamped) -------------------------------------------

// cu_seqlens[i] clamped into [0, total]; cu[0] is 0 and cu[N] is total by definition.
__device__ __forceinline__ int64_t cu_at(const Args& a, int64_t i) {
  if (i <= 0) return 0;
  if (i >= a.N) return a.T;
  const int64_t v = ld_index(a.cu, i);
  return v < 0 ? 0 : (v > a.T ? a.T : v);
}

// The sequence holding packed token t: the largest n < N with cu[n] <= t
// (zero-length sequences are skipped because a later n has the same start).
__device__ __forceinline__ int64_t find_seq(const Args& a, int64_t t) {
  int64_t lo = 0, hi = a.N - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (cu_at(a, mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// seq_idx[b, t] (device memory; any contents describe runs).
__device__ __forceinline__ int64_t sid_at(const Args& a, int64_t b, int64_t t) {
  const int64_t o = b * a.sid.s0 + t * a.sid.s1;
  return a.sid.dt == SC_I32 ? int64_t(static_cast<const int32_t*>(a.sid.p)[o])
                            : static_cast<const int64_t*>(a.sid.p)[o];
}

// Pool row of sequence n in a state tensor with optional indices; -1 = none
// (-1, the pad index, or out of range: the kernels clamp what the host did
// not check).
__device__ __forceinline__ int64_t state_row(const Args& a, const DTensor& st_, const DTensor& idx,
                                             int64_t n) {
  if (!st_.p) return -1;
  if (!idx.p) return n < st_.n0 ? n : -1;  // (the pad index applies to index tensors only)
  const int64_t r = ld_index(idx, n);
  return (r < 0 || r >= st_.n0 || r == a.pad_index) ? -1 : r;
}
// Pool row block_table[n, blk[n] + add] of `pool` (-1: none, the pad index,
// or a block index or table entry out of range: the kernels clamp, section 7).
__device__ __forceinline__ int64_t table_row(const Args& a, const DTensor& pool,
                                             const DTensor& blk, int64_t n, int64_t add) {
  if (!pool.p) return -1;
  const int64_t b = ld_index(blk, n) + add;
  if (b < 0 || b >= a.table_cols) return -1;
  const int64_t o = n * a.table.s0 + b * a.table.s1;
  const int64_t r = a.table.dt == SC_I32 ? int64_t(static_cast<const int32_t*>(a.table.p)[o])
                                         : static_cast<const int64_t*>(a.table.p)[o];
  return (r < 0 || r >= pool.n0 || r == a.pad_index) ? -1 : r;
}
// The initial-state row sequence n reads (-1: a zero state, also when its
// has_initial_state flag is false) and the final-state row it writes.
__device__ __forceinline__ int64_t h0_row_of(const Args& a, int64_t n) {
  if (a.has_h0.p) {
    const bool flag = a.has_h0.dt == SC_BOOL
                          ? static_cast<const unsigned char*>(a.has_h0.p)[n * a.has_h0.s0] != 0
                          : ld_index(a.has_h0, n) != 0;
    if (!flag) return -1;
  }
  if (a.table.p) return table_row(a, a.h0, a.init_blk, n, 0);
  return state_row(a, a.h0, a.h0_idx, n);
}
__device__ __forceinline__ int64_t ht_row_of(const Args& a, int64_t n) {
  if (a.table.p) return table_row(a, a.ht, a.final_blk, n, 0);
  return state_row(a, a.ht, a.ht_idx, n);
}
// Speculative decoding (semantics §5, num_accepted): the row entry of the window's
// first element, a - 1 with the accepted count a clamped to [1, last] (last = S - (W-1) + 1
// keeps the window inside the row; semantics §7: clamped, not checked, on the device).
__device__ __forceinline__ int64_t accepted_first(int64_t acc, int64_t last) {
  return (acc < 1 ? 1 : acc > last ? last : acc) - 1;
}
// The same for sequence n of an Args step reading row `in` (0 without accepted counts or
// without a row read).
__device__ __forceinline__ int64_t accepted_first(const Args& a, int64_t n, int64_t in) {
  if (!a.accepted.p || in < 0) return 0;
  return accepted_first(ld_index(a.accepted, n), a.S - (a.W - 1) + 1);
}
// Prefix caching: the block boundaries strictly inside sequence n's chunk of L
// tokens (0 without), and in *m0 the block number m of the first (at m * B).
__device__ __forceinline__ int64_t snapshot_count(const Args& a, int64_t n, int64_t L,
                                                  int64_t* m0) {
  *m0 = 0;
  if (a.block_size <= 0 || !a.ht.p) return 0;
  int64_t c = ld_index(a.computed, n);
  c = c < 0 ? 0 : c;
  *m0 = c / a.block_size + 1;
  if (L < 2) return 0;
  const int64_t last = (c + L - 1) / a.block_size;
  return last >= *m0 ? last - *m0 + 1 : 0;
}
// Row of dfinal_state for sequence n (with seq_idx n is the id, clamped like
// a pool index: past the rows there is no dht term); -1: none.
__device__ __forceinline__ int64_t dht_row_of(const Args& a, int64_t n) {
  return a.dht.p && n >= 0 && n < a.dht.n0 ? n : -1;
}

// Sequence n as (batch row b, first token s, length L) in x's [B, T, D] view,
// the ring offset c of its state rows (0 without rings), and whether it is a
// padding run of seq_idx (outputs 0, feeds nothing).
struct Seq {
  int64_t b, s, L, c;
  bool pad;
};
__device__ __forceinline__ int64_t ring_of(const Args& a, int64_t n) {
  if (!a.ring.p || a.S == 0) return 0;
  const int64_t c = ld_index(a.ring, n) % a.S;
  return c < 0 ? c + a.S : c;  // (negative offsets are the caller's error: clamped)
}
__device__ __forceinline__ Seq seq_of(const Args& a, int64_t n) {
  if (!a.packed) return Seq{n, 0, a.T, ring_of(a, n), false};
  const int64_t s = cu_at(a, n), e = cu_at(a, n + 1);
  return Seq{0, s, e > s ? e - s : 0, ring_of(a, n), false};
}
// Slot of logical state entry j (0 <= j < S) of sequence q in its row.
__device__ __forceinline__ int64_t state_slot(const Args& a, const Seq& q, int64_t j) {
  const int64_t s = q.c + j;
  return s >= a.S ? s - a.S : s;
}

// u_n[p] for sequence n, channel d (scalar, runtime dtypes): h0 for p < S
// (zero without a state), x for p >= S.  p must be in [0, S + L).
template <class A>
__device__ __forceinline__ A load_u(const Args& a, const Seq& q, int64_t h0row, int64_t d,
                                    int64_t p) {
  if (p >= a.S) return ld<A>(a.x.p, a.x.dt, q.b * a.x.s0 + (q.s + p - a.S) * a.x.s1 + d * a.x.s2);
  if (h0row < 0 || p < 0) return A(0);
  return ld<A>(a.h0.p, a.h0.dt, h0row * a.h0.s0 + d * a.h0.s1 + state_slot(a, q, p) * a.h0.s2);
}

// Tile `tile` of the (batch, time) axis as batch row b and tokens [tb, te).
__device__ __forceinline__ void tile_range(const Args& a, int64_t tile, int64_t* b, int64_t* tb,
                                           int64_t* te) {
  const int64_t row = tile / a.tiles_per_row;
  *b = row;
  *tb = (tile - row * a.tiles_per_row) * a.tile_t;
  const int64_t e = *tb + a.tile_t;
  *te = e < a.axis ? e : a.axis;
}

// The sliding window before token t of sequence q, for the token-major
// kernels: sl[i][c] = u(t - H + i) of channel d0 + c, H = WMAX - 1 registers
// padded at the front (taps i < kpad = WMAX - W are never used: 0); x rows
// as CH-wide vectors, positions before the sequence from its h0 row (or 0).
template <class T, int CH, int H, class A>
__device__ __forceinline__ void load_window(const Args& a, const Seq& q, int64_t h0row,
                                            const T* xp, int64_t sx, int64_t d0, int64_t t,
                                            int kpad, A (&sl)[H][CH]) {
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int64_t tok = t - H + i;
    if (i >= kpad && tok >= q.s) {
      const Pack<T, CH> v = ldp<T, CH>(xp + tok * sx);
#pragma unroll
      for (int c = 0; c < CH; ++c) sl[i][c] = v.get(c);
    } else {
#pragma unroll
      for (int c = 0; c < CH; ++c)
        sl[i][c] = i >= kpad ? load_u<A>(a, q, h0row, d0 + c, a.S + tok - q.s) : A(0);
    }
  }
}

// Channel-major chunks (fwd_cm, bwd_cm): lane l of a warp holds the VEC
// consecutive tokens [t0, t0 + VEC), t0 = base + l * VEC, of a chunk of
// 32 * VEC tokens of one (batch, channel) row.  The H inputs before t0 sit in
// lower lanes of the same chunk or, for the first lanes, in the previous
// chunk (xp: what each lane held there), exchanged by shuffles instead of
// re-read; at a tile's first chunk (`first`) those lanes read them from
// memory (x, or the sequence's h0 row before the row's start).
// u[H - 1 - i] = u(t0 - 1 - i) (the caller keeps u[H + i] = xc[i]); entries
// i >= W - 1 (pad taps) are 0 (W: a.W, or the compile-time WMAX of a
// full-window instance).  The
// sender chooses: lane s sends its value of this chunk to lane s + k when
// that lane is in this chunk (s < 32 - k), else its previous chunk's.
// Every lane of the warp must call this (warp-uniform control flow).
template <class T, int H, int VEC, class A>
__device__ __forceinline__ void cm_window(const Args& a, const Seq& q, int64_t h0row, int64_t d,
                                          const T* xr, int64_t t0, int lane, int W, bool first,
                                          const A (&xc)[VEC], const A (&xp)[VEC], A (&u)[H + VEC]) {
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int k = 1 + i / VEC, e = VEC - 1 - i % VEC;  // source lane offset and element
    // (the shuffle outside the tap test: under it every shuffle paid a
    // divergence check and a lane-id read in SASS)
    A v = __shfl_sync(0xffffffffu, lane < 32 - k ? xc[e] : xp[e], (lane - k) & 31);
    if (i < W - 1 && first && lane < k) {
      const int64_t tok = t0 - 1 - i;
      v = tok >= 0 ? to_f(xr[tok]) : load_u<A>(a, q, h0row, d, a.S + tok);
    }
    u[H - 1 - i] = i < W - 1 ? v : A(0);
  }
}

// The general path's thread coordinates: tile (grid.x x block.y), channel d
// (grid.y x block.x) and the tile's batch row and tokens; false when the
// thread has no (tile, channel).
__device__ __forceinline__ bool general_coords(const Args& a, int64_t* tile, int64_t* d, int64_t* b,
                                               int64_t* tb, int64_t* te) {
  *tile = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  *d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (*tile >= a.ntiles || *d >= a.D) return false;
  tile_range(a, *tile, b, tb, te);
  return true;
}

// seq_idx: the part [g, e) of tile [.., ge) of the flat token axis (g =
// b*T + t) that lies in one run; returns e and sets *id and *q in row-local
// tokens.  Only what the kernels read is resolved, scanning at most W-1 ids
// back and `ahead` ids past the tile: q->s is the run's start when it lies
// within W-1 tokens before g (no window reaches further; else g - (W-1)),
// and q->s + q->L its end when that lies before the tile's end + ahead (else
// that bound, clipped to the row: the look-ahead and the dht terms then see
// the run continue, as they should).
__device__ __forceinline__ int64_t id_segment(const Args& a, int64_t g, int64_t ge, Seq* q,
                                              int64_t* id) {
  const int64_t b = g / a.T, t = g - b * a.T;
  const int64_t i = sid_at(a, b, t);
  const int64_t back = t > a.W - 1 ? t - (a.W - 1) : 0;
  int64_t s = t;
  while (s > back && sid_at(a, b, s - 1) == i) --s;
  const int64_t tile_end = ge - b * a.T < a.T ? ge - b * a.T : a.T;  // row-local
  int64_t e = t + 1;
  while (e < tile_end && sid_at(a, b, e) == i) ++e;
  int64_t end = e;
  if (e == tile_end) {
    const int64_t lim = tile_end + a.ahead < a.T ? tile_end + a.ahead : a.T;
    while (end < lim && sid_at(a, b, end) == i) ++end;
  }
  *q = Seq{b, s, end - s, 0, i < 0};
  *id = i;
  return b * a.T + e;
}

// The tile walker every tiled kernel uses: calls seg(q, n, t, e) for each
// sequence n with tokens in tile [tb, te) of batch row b, in order, with
// [t, e) the part of the tile inside it (a packed tile may span several
// sequences; zero-length ones are skipped).  With seq_idx the tile is on the
// flat axis (b = 0), each run is a sequence, n is its id and [t, e) are
// tokens of row q.b; padding runs come with q.pad set.  (One call site of
// seg: the kernels' segment bodies are inlined once.)
template <class F>
__device__ __forceinline__ void for_each_segment(const Args& a, int64_t b, int64_t tb, int64_t te,
                                                 F&& seg) {
  const bool ids = a.sid.p != nullptr;
  int64_t n = ids ? 0 : a.packed ? find_seq(a, tb) : b;
  for (int64_t t = tb; t < te; ++n) {
    Seq q;
    int64_t e, row0 = 0;
    if (ids) {
      e = id_segment(a, t, te, &q, &n);
      row0 = q.b * a.T;
    } else {
      if (n >= a.N) break;
      q = seq_of(a, n);
      const int64_t send = q.s + q.L;
      e = send < te ? send : te;
      if (e <= t) continue;
    }
    seg(q, n, t - row0, e - row0);
    t = e;
  }
}

}  // namespace shortconv::cuda
