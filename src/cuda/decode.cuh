// Pieces of the decode step shared by its kernels (decode.cu: trees, staged
// and scalar rows; decode_linear.cu: linear steps with the rows in registers;
// decode_plain.cu and decode_spec.cu: the engines' common steps): the taps'
// loads, the linear steps' sum and register cap, [P, D, S] row blocks in
// registers, the output store, and the common steps' argument block.
#pragma once

#include "cuda/common.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

// The taps and bias of the thread's CH channels.  A contiguous [D, W]
// weight of x's dtype with W = WMAX holds them as CH * WMAX adjacent
// elements, a whole number of 16-byte vectors (CH * WMAX * sizeof(T) =
// 16 or 64 bytes): those loads, not CH * WMAX.
template <class T, int WMAX, int CH, class A>
__device__ __forceinline__ void decode_taps(const Args& a, int64_t d0, int kpad, A scale,
                                            A (&wp)[WMAX][CH], A (&bs)[CH]) {
  constexpr int kN = WMAX * CH;
  constexpr int kBytes = kN * int(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / int(sizeof(T));  // elements per vector
    const T* w = static_cast<const T*>(a.weight.p) + d0 * WMAX;
    if (kpad == 0 && a.weight.dt == DtypeCode<T>::value && a.weight.s1 == 1 && a.weight.s0 == WMAX &&
        reinterpret_cast<uintptr_t>(w) % 16 == 0) {
      Pack<T, kPer> v[kN / kPer];
#pragma unroll
      for (int i = 0; i < kN / kPer; ++i) v[i] = ldp<T, kPer>(w + i * kPer);
      A bf[CH];
      if (a.bias.p)
        ld_many(a.bias, [&](int c) { return (d0 + c) * a.bias.s0; }, [](int) { return true; }, bf);
#pragma unroll
      for (int c = 0; c < CH; ++c) {
#pragma unroll
        for (int j = 0; j < WMAX; ++j) {
          const int e = c * WMAX + j;
          wp[j][c] = scale * A(v[e / kPer].get(e % kPer));
        }
        bs[c] = a.bias.p ? scale * bf[c] : A(0);
      }
      return;
    }
  }
  load_taps<A, WMAX, CH>(a.weight, a.bias, d0, a.D, kpad, scale, wp, bs);
}

// The taps as the weight's raw words (decode_linear.cu): a contiguous [D, WMAX]
// weight and a [D] bias (or none) of x's dtype T, 16-byte aligned (the plan's
// raw_taps), held as loaded and converted at each use: CH * WMAX / 2 registers
// for a 16-bit T instead of CH * WMAX accumulators.  Exact: the scale is 1 in
// every CUDA math (MathOf<T>::kTanhForm is false), so tap k of channel c is
// weight[d0 + c, k] as the accumulator type, what decode_taps computes.
template <class T, int WMAX, int CH>
struct RawTaps {
  using A = acc_t<T>;
  static constexpr int kPer = 16 / int(sizeof(T));  // elements per 16-byte vector
  static constexpr int kVecs = WMAX * CH / kPer;
  static_assert(WMAX * CH % kPer == 0, "a whole number of 16-byte vectors of taps");
  static_assert(!MathOf<T>::kTanhForm, "raw taps assume a scale of 1");
  Pack<T, kPer> w[kVecs];
  Pack<T, CH> b;

  __device__ __forceinline__ void load(const Args& a, int64_t d0) {
    load(static_cast<const T*>(a.weight.p), static_cast<const T*>(a.bias.p), d0);
  }
  // weight: [D, WMAX] contiguous; bias: [D] or nullptr
  __device__ __forceinline__ void load(const T* weight, const T* bias, int64_t d0) {
    const T* wp = weight + d0 * WMAX;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) w[i] = ldp<T, kPer>(wp + i * kPer);
    b = bias ? ldp<T, CH>(bias + d0) : Pack<T, CH>::zero();
  }
  __device__ __forceinline__ A tap(int k, int c) const {
    const int e = c * WMAX + k;
    return w[e / kPer].get(e % kPer);
  }
  __device__ __forceinline__ A bias(int c) const { return b.get(c); }
  // Called once per token: the words look new to the compiler, so the taps'
  // conversions are not hoisted out of the token loop into CH * WMAX
  // accumulator registers (what this struct avoids; an empty asm, no instruction).
  __device__ __forceinline__ void per_token() {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int j = 0; j < Pack<T, kPer>::kWords; ++j) asm volatile("" : "+r"(w[i].w[j]));
  }
};

// The same interface over decode_taps' accumulators (any weight and bias).
template <class T, int WMAX, int CH>
struct AccTaps {
  using A = acc_t<T>;
  A wp[WMAX][CH], bs[CH];

  __device__ __forceinline__ void load(const Args& a, int64_t d0, int kpad, A scale) {
    decode_taps<T, WMAX, CH>(a, d0, kpad, scale, wp, bs);
  }
  // RawTaps' words converted once (the same values: RawTaps::tap is the word as A)
  __device__ __forceinline__ void from(const RawTaps<T, WMAX, CH>& r) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
      for (int k = 0; k < WMAX; ++k) wp[k][c] = r.tap(k, c);
      bs[c] = r.bias(c);
    }
  }
  // Holds the converted values in registers from here on: ptxas would rather
  // redo a one-instruction conversion at each use than keep the register
  // (an empty asm per value, no instruction).
  __device__ __forceinline__ void pin() {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
      for (int k = 0; k < WMAX; ++k) asm volatile("" : "+f"(wp[k][c]));
      asm volatile("" : "+f"(bs[c]));
    }
  }
  __device__ __forceinline__ A tap(int k, int c) const { return wp[k][c]; }
  __device__ __forceinline__ A bias(int c) const { return bs[c]; }
  __device__ __forceinline__ void per_token() {}
};

// Blocks per SM a linear step's instance is compiled for (its register
// cap): RAW, raw taps (RawTaps).
template <class T, int CH, bool RAW>
constexpr int linear_min_blocks() {
  if (CH * int(sizeof(T)) == DecodeTraits::kVecBytes)
    return sizeof(T) == 2 ? DecodeTraits::kMinBlocksLinear16 : DecodeTraits::kMinBlocksPerSm;
  if (!RAW) return DecodeTraits::kMinBlocksPerSm;
  return sizeof(T) == 2 ? DecodeTraits::kMinBlocksWide16 : DecodeTraits::kMinBlocksWide32;
}

// CH channels of one entry as accumulators, with Pack's get(): a window
// converted once, where a Pack's elements are converted at each use.
template <class T, int CH>
struct AccPack {
  using A = acc_t<T>;
  A v[CH];
  __device__ __forceinline__ static AccPack of(const Pack<T, CH>& p) {
    AccPack r;
#pragma unroll
    for (int c = 0; c < CH; ++c) r.v[c] = p.get(c);
    return r;
  }
  __device__ __forceinline__ A get(int c) const { return v[c]; }
};

// acc[c] = bias + sum_k tap k * win[k] + tap H * x, channel by channel: the
// bias, then the taps oldest -> newest, the order of every path.  V: Pack<T,
// CH> or AccPack<T, CH> (the same values).
template <class T, int CH, int H, class Taps, class V>
__device__ __forceinline__ void linear_sum(const Taps& taps, const V (&win)[H], const V& xv, int kpad,
                                           acc_t<T> (&acc)[CH]) {
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    acc[c] = taps.bias(c);
#pragma unroll
    for (int k = 0; k < H; ++k)
      if (k >= kpad) acc[c] = fma(taps.tap(k, c), win[k].get(c), acc[c]);
    acc[c] = fma(taps.tap(H, c), xv.get(c), acc[c]);
  }
}

// [P, D, S] rows (StateIo::row_vec) with S = S_ (W - 1 or W, W = kVecWmax): a
// thread's block of the row, CH channels x S entries, is CH * S adjacent
// elements: whole 16-byte vectors in the wide instance, 4-byte words in the
// narrow one (CH * sizeof(T) = 4).  Loaded as raw words, moved into S packs
// of CH channels (row[j] = entry j; one byte permute per 32-bit word of a
// 16-bit type), slid along with the tokens like the window, and after the
// last token row[] is the new row, ht[j] = u[L + j] (one-token and longer
// linear steps alike), moved back and stored as vectors.  decode.cu's
// instance stages the same block in shared memory instead, whose throughput
// bounded the wide one (H200 ncu, batch 256, D = 8192: 61% L1 / shared
// throughput) and whose load, stage, read-back and rewrite phases lengthen
// the narrow one's latency path (H100, batch 1: 3.27 us against vLLM rows'
// 2.39 in registers).
template <class T, int CH, int S_>
struct RowBlock {
  static constexpr int kElems = CH * S_;
  static constexpr int kBytes = kElems * int(sizeof(T));
  // bytes per load and store: the planner guarantees the alignment of a
  // thread's CH channels (StateIo::row_vec: 16 bytes wide, 4 narrow), not more
  static constexpr int kUnit = CH * int(sizeof(T)) == 16 ? 16 : 4;
  static_assert(kBytes % kUnit == 0 && CH * int(sizeof(T)) % 4 == 0, "a whole number of units per block");
  static constexpr int kVecs = kBytes / kUnit;
  static constexpr int kPer = kUnit / int(sizeof(T));  // elements per unit
  Pack<T, kPer> v[kVecs];

  // Word k of pack `to` gathered from the block (to_packs) or the reverse.
  // Element e of the block lies in v[e / kPer], element e % kPer.
  __device__ __forceinline__ static unsigned word_of(const Pack<T, kPer>* src, int e0, int e1) {
    // 16-bit: the 32-bit word holding elements e0 (low half) and e1 (high half)
    const unsigned a = src[e0 / kPer].w[(e0 % kPer) / 2], b = src[e1 / kPer].w[(e1 % kPer) / 2];
    const unsigned lo = (e0 % 2) ? 0x32u : 0x10u, hi = (e1 % 2) ? 0x7600u : 0x5400u;
    return __byte_perm(a, b, lo | hi);
  }
  // row[j] = entry j of the block (channel c's entry j is element c * S_ + j)
  __device__ __forceinline__ void to_packs(Pack<T, CH> (&row)[S_]) const {
#pragma unroll
    for (int j = 0; j < S_; ++j)
#pragma unroll
      for (int k = 0; k < Pack<T, CH>::kWords; ++k) {
        if constexpr (sizeof(T) == 2) {
          row[j].w[k] = word_of(v, (2 * k) * S_ + j, (2 * k + 1) * S_ + j);
        } else {
          const int e = k * S_ + j;
          row[j].w[k] = v[e / kPer].w[e % kPer];
        }
      }
  }
  __device__ __forceinline__ void from_packs(const Pack<T, CH> (&row)[S_]) {
    // as 16-bit elements: element e = c * S_ + j is channel c of row[j]
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Pack<T, kPer>::kWords; ++k) {
        if constexpr (sizeof(T) == 2) {
          const int e0 = i * kPer + 2 * k, e1 = e0 + 1;
          const int c0 = e0 / S_, j0 = e0 % S_, c1 = e1 / S_, j1 = e1 % S_;
          const unsigned a = row[j0].w[c0 / 2], b = row[j1].w[c1 / 2];
          const unsigned lo = (c0 % 2) ? 0x32u : 0x10u, hi = (c1 % 2) ? 0x7600u : 0x5400u;
          v[i].w[k] = __byte_perm(a, b, lo | hi);
        } else {
          const int e = i * kPer + k;
          v[i].w[k] = row[e % S_].w[e / S_];
        }
      }
  }
};

// A speculative step on [P, D, S] rows of S_ = H + K entries held in registers
// (row[j] = entry j): the first token's window, win = row[first .. first + H)
// for first in [0, K] (predicated moves: no dynamic register index), and the
// new row's entries 0 .. H-2, u[1 .. H), moved into row[0 .. H-1); the tokens
// then fill row[H-1 ..].
template <class P, int H, int S_>
__device__ __forceinline__ void spec_row_window(P (&row)[S_], int first, P (&win)[H]) {
  static_assert(S_ > H, "a speculative row holds drafts");
#pragma unroll
  for (int i = 0; i < H; ++i) win[i] = row[i];
#pragma unroll
  for (int b = 1; b + H <= S_; ++b)
    if (first == b) {
#pragma unroll
      for (int i = 0; i < H; ++i) win[i] = row[b + i];
    }
#pragma unroll
  for (int j = 0; j + 1 < H; ++j) row[j] = win[j + 1];
}

// y of packed token `tok` (x's view: row b, token tok) for channels
// d0..d0+CH from the pre-activations acc, with the residual loaded after the
// sums (fwd_decode_plain, on its own argument block, loads its residual first).
template <class T, int CH, class Act>
__device__ __forceinline__ void decode_store_y(const Args& a, const Act& act, int64_t b, int64_t tok,
                                               int64_t d0, const acc_t<T> (&acc)[CH]) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  if (!a.y.p) return;
  A o[CH];
  P rv = P::zero();
  if (a.residual.p)
    rv = ldp<T, CH>(static_cast<const T*>(a.residual.p) + b * a.residual.s0 + tok * a.residual.s1 +
                    d0 * a.residual.s2);
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    o[c] = act.value(acc[c]);
    if (a.residual.p) o[c] += rv.get(c);
  }
  stp<T, CH>(static_cast<T*>(a.y.p) + b * a.y.s0 + tok * a.y.s1 + d0 * a.y.s2, P::make(o));
}

// What fwd_decode_plain reads, in three lines of the constant bank (and
// fwd_decode_spec, whose SpecArgs extend it: decode_spec.cu).
// Element strides; a tensor's channel stride is 1 (the planner's vector
// rule), so channel d of a row is at row pointer + d.
struct PlainArgs {
  const void* x;         // x: [N, D], token n at x + n * x_n
  void* y;               // y: [N, D], y_n (nullptr: no output)
  const void* weight;    // [D, W] contiguous (raw taps)
  const void* bias;      // [D], or nullptr
  const void* residual;  // [N, D], r_n, or nullptr
  const void* h0_idx;    // [N] rows of h0 (I; stride h0_idx_s), nullptr: row n
  const void* ht_idx;    // [N] rows of ht, likewise
  const void* h0;        // pool [P0, D, S]: vLLM rows: row r entry j channel d at r * h0_row + j * h0_entry + d,
                         // [P, D, S] rows: at r * h0_row + d * S + j; nullptr: zeros
  void* ht;              // pool [P1, D, S], likewise (nullptr: not written)
  int64_t x_n, y_n, r_n;
  int64_t h0_idx_s, ht_idx_s;
  int64_t h0_row, h0_entry, h0_rows;  // h0_rows: P0 (rows past it, and the pad index, are no row)
  int64_t ht_row, ht_entry, ht_rows;
  int64_t pad_index;     // an index meaning "no row", besides negative ones
  int32_t D;
  int16_t act;           // sc_activation
  int16_t zero_pads;     // padded sequences' y = 0 (fwd_decode_plain; 0 in fwd_decode_spec)
};
static_assert(sizeof(PlainArgs) <= 3 * 64, "three constant-cache lines");

// PlainArgs of the library's argument block (decode_plain.cu).
PlainArgs plain_args(const Args& a);

// Row r of a pool of `rows` rows as indexed (`indexed`: r came from an index
// tensor, where the pad index also means none), or -1.
__device__ __forceinline__ int64_t plain_row(int64_t r, int64_t rows, bool indexed, int64_t pad) {
  return r < 0 || r >= rows || (indexed && r == pad) ? -1 : r;
}

}  // namespace shortconv::cuda
