// CUDA decode kernels for linear steps (no tree) whose state rows are held in
// registers: one launch per decode step (Path::decode), chosen by
// launch_decode (decode.cu) for vLLM's channel-contiguous rows
// (StateIo::channel_vec, fwd_decode_linear: narrow and wide, one token or
// speculative; the engines' common one-token and speculative steps on them
// are decode_plain.cu's and decode_spec.cu's)
// and for [P, D, S] rows of S = W-1 or W, or speculative 1+K
// tokens on rows of (W-1) + K (fwd_decode_linear_rows, with raw taps: wide,
// and narrow since 2026-12-05: H100, bf16, batch 1-8, 3.3-5.3 -> 2.5-4.1 us,
// bench/RESULTS.md).
//
// Math: decode.cu's (docs/semantics.md §1 and §5).  Sequence n of L tokens
// has s entries before x_n in its extended sequence u (s = S, or W-1 with
// num_accepted: the row's entries from a_n - 1), and per channel
//   pre[t] = bias + sum_{k<W} weight[k] * u[s - (W-1) + t + k],
//   y[t] = act(pre[t]) + residual[t],   ht[j] = u[from + j] for j < E,
// from = s + L - E (E = S; speculative: (W-2) + L entries from the row's start).
//
// Ownership and grid: decode.cu's.  A thread owns CH consecutive channels of
// one sequence (kVecBytes of x per token, or kWideBytes in the wide instance);
// a block kThreads threads along the channels; grid N x ceil(D / (kThreads *
// CH)).  No workspace, no host synchronisation; row indices, flags and
// accepted counts are read on the device and clamped (semantics §7).
//
// Why kernels of their own: decode.cu's generic instance holds the window and
// the taps as accumulators (bf16, W = 4, CH = 8: 56 fp32 registers) and
// re-reads the row's kept entries after the tokens (wide: 113-117 registers,
// 4 blocks of 128 threads per SM; H200 at batch 256, D = 8192: 23% achieved
// occupancy, no eligible warp in 52% of cycles).  Here the window is the raw
// words of the row's entries, the taps the weight's raw words when the plan
// allows (RawTaps: converted at each use, one integer operation per 16-bit
// element), and every row entry is stored from a register: the kept entries
// before the first token (all of the row's reads are done by then), each
// token's x after its output.  The in-place update is then ordered by the
// thread's own data dependences: entry j is stored after every entry it could
// overwrite was loaded, and each element has one owner thread.  64 registers
// (fp32: 72) in the wide instances, 8 (7) blocks per SM; H200, bf16, W = 4,
// D = 8192, batch 256, one token: vLLM rows 16.9 -> 12.1 µs, [P, D, S] rows
// 23.4 -> 12.3 µs; batch 1: 3.0 -> 2.7 µs (bench/RESULTS.md).
#include "cuda/activation.cuh"
#include "cuda/common.cuh"
#include "cuda/decode.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

namespace {

// RAW: the taps as RawTaps (the plan's raw_taps: W = kVecWmax), else AccTaps.
// OV: kOverlapLaunch (raw taps only; the plan's overlap) waits for the
// previous kernel before its first access to memory (common.cuh).
template <class T, int CH, bool RAW, int OV = kOverlapNone>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (linear_min_blocks<T, CH, RAW>()))
    fwd_decode_linear(const Args a) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  constexpr int WMAX = DecodeTraits::kVecWmax, H = WMAX - 1;
  const int64_t n = blockIdx.x;
  const int64_t d0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * CH;
  if (n >= a.N || d0 >= a.D) return;
  static_assert(OV == kOverlapNone || OV == kOverlapLaunch, "no reads ahead in this kernel");
  if constexpr (OV == kOverlapLaunch) overlap_wait();
  const int W = a.W;
  const int kpad = RAW ? 0 : WMAX - W;  // taps below kpad are padding, never multiplied
  const Seq q = seq_of(a, n);
  const int64_t in = h0_row_of(a, n), out = ht_row_of(a, n);
  const bool spec = a.accepted.p != nullptr;
  const int64_t s = spec ? W - 1 : a.S;
  const int64_t base = accepted_first(a, n, in);  // the h0 entry of u[0]
  // h0: row `in` at channel d0 (entry j at h0 + j * sh), ht: row `out`; x token t at xp + t * sx
  const int64_t sh = a.h0.s2, so = a.ht.s2, sx = a.x.s1;
  const T* h0 = in >= 0 ? static_cast<const T*>(a.h0.p) + in * a.h0.s0 + d0 : nullptr;
  T* ht = out >= 0 ? static_cast<T*>(a.ht.p) + out * a.ht.s0 + d0 : nullptr;
  const T* xp = static_cast<const T*>(a.x.p) + q.b * a.x.s0 + q.s * sx + d0 * a.x.s2;

  // The first token's x, issued before the window's loads, which wait for the
  // row index (x does not); each later token's x is issued before the previous
  // token's stores (H200, bf16, vLLM rows, same call: batch 1 2.58 -> 2.36 us,
  // 1+3 tokens 3.54 -> 3.06; batch 256, D = 8192 12.21 -> 11.8, 1+3 tokens
  // 22.8 -> 21.5).  (The same in fwd_decode_linear_rows was 4-8% slower at
  // batch 64-256: its row block leaves no registers for it.)
  P xn = q.L > 0 ? ldp<T, CH>(xp) : P::zero();
  // The window's loads, then the taps' (one round trip after the row index).
  P win[H];  // win[i] = u[s - H + i] as raw words (zeros: padding, or no initial state)
#pragma unroll
  for (int i = 0; i < H; ++i) win[i] = h0 && i >= kpad ? ldp<T, CH>(h0 + (base + s - H + i) * sh) : P::zero();
  // The row's entries u[from ..] that precede x, before the first token: those
  // older than the window (rows longer than W-1) copied first, while only the
  // window's registers are live (the taps' then fit the instance's cap).
  int64_t E = a.S;
  if (spec) E = q.L > 0 ? (W - 2 + q.L < a.S ? W - 2 + q.L : a.S) : 0;
  const int64_t from = s + q.L - E, lo = s - (W - 1);  // lo: the window's oldest entry
  if (ht)
    for (int64_t p = from; p < lo; ++p)
      stp<T, CH>(ht + (p - from) * so, h0 ? ldp<T, CH>(h0 + (base + p) * sh) : P::zero());
  std::conditional_t<RAW, RawTaps<T, WMAX, CH>, AccTaps<T, WMAX, CH>> taps;
  const RuntimeAct<MathOf<T>> act{a.act};
  if constexpr (RAW) taps.load(a, d0);
  else taps.load(a, d0, kpad, A(act.scale()));
  if (ht) {  // (after the taps' loads: these stores wait for the window's)
#pragma unroll
    for (int i = 0; i < H; ++i)
      if (i >= kpad && s - H + i >= from) stp<T, CH>(ht + (s - H + i - from) * so, win[i]);
  }

  for (int64_t t = 0; t < q.L; ++t) {
    const P xv = xn;
    if (t + 1 < q.L) xn = ldp<T, CH>(xp + (t + 1) * sx);  // in flight during this token's stores
    taps.per_token();
    A acc[CH];
    linear_sum<T, CH, H>(taps, win, xv, kpad, acc);
#pragma unroll
    for (int i = 0; i + 1 < H; ++i) win[i] = win[i + 1];
    win[H - 1] = xv;
    decode_store_y<T, CH>(a, act, q.b, q.s + t, d0, acc);
    if (ht && s + t >= from) stp<T, CH>(ht + (s + t - from) * so, xv);
  }
}

// Blocks per SM of fwd_decode_linear_rows (its register cap): the one-token
// instances the raw-tap wide cap, the speculative ones their own (the row's
// kept entries, the window and the first tokens are live at once).
template <class T, int CH, int S_, bool SPEC>
constexpr int rows_min_blocks() {
  if (!SPEC) return linear_min_blocks<T, CH, true>();
  return DecodeTraits::spec_rows_min_blocks(S_ - (DecodeTraits::kVecWmax - 1));
}

// SPEC: a speculative step (num_accepted) on rows of S_ = (W-1) + K entries.
// The window is the W-1 entries from a_n - 1 (chosen among the S_ - (W-1) + 1
// positions by predicated moves: no dynamic register index), and the new row
// is u[1 .. (W-1) + L) = entries 1.. of the window, then the tokens: built in
// place in row[] before and during the token loop, for the first
// S_ - (W-1) + 1 tokens with compile-time indices (guarded by t < L; entries
// past (W-2) + L keep the row's values).  A valid step has no more tokens
// (the host checks (W-2) + L <= S); a longer one, from device-resident
// lengths, keeps the last S_ entries of u by sliding, as the staged instance
// does (E = S there) and the one-token instance always.  Written as whole
// vectors when the row is read and written in place or all S_ entries are new,
// else (another row, fewer entries) only the (W-2) + L written entries.
// The planner sends it dense steps of exactly 1+K tokens (every row rewritten
// whole: spec_rows_in_registers), the forms verified on the GPU; packed and
// shorter steps, which keep entries of their rows, take the staged instance.
// (The plain and the common speculative step on these rows are decode_plain.cu's
// and decode_spec.cu's: this form keeps flags, block tables and index tensors of
// two dtypes.)
template <class T, int CH, int S_, bool SPEC>
__global__ void __launch_bounds__(DecodeTraits::kThreads, (rows_min_blocks<T, CH, S_, SPEC>()))
    fwd_decode_linear_rows(const Args a) {
  using A = acc_t<T>;
  using P = Pack<T, CH>;
  using B = RowBlock<T, CH, S_>;
  constexpr int WMAX = DecodeTraits::kVecWmax, H = WMAX - 1;
  static_assert(S_ >= H, "the row holds the window");
  static_assert(!SPEC || S_ > H, "a speculative row holds drafts");
  constexpr int LT = SPEC ? S_ - H + 1 : 0;  // speculative: tokens placed at compile-time entries
  const int64_t n = blockIdx.x;
  const int64_t d0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * CH;
  if (n >= a.N || d0 >= a.D) return;
  const Seq q = seq_of(a, n);
  RawTaps<T, WMAX, CH> taps;
  const int64_t in = h0_row_of(a, n), out = ht_row_of(a, n);
  // the thread's blocks: row `in` of h0 and row `out` of ht at channel d0 (CH * S adjacent)
  using Vec = Pack<T, B::kPer>;
  const Vec* h0 = in >= 0 ? reinterpret_cast<const Vec*>(static_cast<const T*>(a.h0.p) + in * a.h0.s0 + d0 * S_)
                          : nullptr;
  const int64_t sx = a.x.s1;
  const T* xp = static_cast<const T*>(a.x.p) + q.b * a.x.s0 + q.s * sx + d0 * a.x.s2;
  int base = 0;  // speculative: the row entry of the window's oldest, a_n - 1 clamped into the row
  if (SPEC && in >= 0) base = int(accepted_first(ld_index(a.accepted, n), LT));
  B blk;
#pragma unroll
  for (int i = 0; i < B::kVecs; ++i) blk.v[i] = h0 ? ldp<T, B::kPer>(reinterpret_cast<const T*>(h0 + i)) : Vec::zero();
  taps.load(a, d0);
  const RuntimeAct<MathOf<T>> act{a.act};
  P row[S_];  // one token: row[j] = u[L' + j] after L' tokens; speculative: the new row
  blk.to_packs(row);
  auto token = [&](const P& xv, const P (&win)[H], int64_t t) {
    taps.per_token();
    A acc[CH];
    linear_sum<T, CH, H>(taps, win, xv, 0, acc);
    decode_store_y<T, CH>(a, act, q.b, q.s + t, d0, acc);
  };
  int64_t t = 0;
  if constexpr (SPEC) {
    P win[H];  // u[t .. t + H): the window of token t
    spec_row_window(row, base, win);
#pragma unroll
    for (int u = 0; u < LT; ++u)
      if (u < q.L) {
        const P xv = ldp<T, CH>(xp + u * sx);
        token(xv, win, u);
#pragma unroll
        for (int i = 0; i + 1 < H; ++i) win[i] = win[i + 1];
        win[H - 1] = xv;
        row[H - 1 + u] = xv;  // new entry H-1+u = u[H + u]
      }
    t = LT;
  }
  for (; t < q.L; ++t) {  // one token: every token; speculative: those past LT (row[] full)
    const P xv = ldp<T, CH>(xp + t * sx);
    P win[H];
#pragma unroll
    for (int k = 0; k < H; ++k) win[k] = row[S_ - H + k];
    token(xv, win, t);
#pragma unroll
    for (int j = 0; j + 1 < S_; ++j) row[j] = row[j + 1];
    row[S_ - 1] = xv;
  }
  if (out < 0) return;
  T* ht = static_cast<T*>(a.ht.p) + out * a.ht.s0 + d0 * S_;
  if constexpr (SPEC) {
    if (q.L <= 0) return;  // no token: nothing written (semantics §5)
    const int64_t E = H - 1 + q.L;  // entries written, when fewer than S_
    if (E < S_ && out != in) {  // only those: the rest of another row is not this step's
#pragma unroll
      for (int j = 0; j < S_; ++j)
        if (j < E) {
#pragma unroll
          for (int c = 0; c < CH; ++c) {  // element c of the pack, as its raw bits
            if constexpr (sizeof(T) == 2)
              reinterpret_cast<uint16_t*>(ht)[c * S_ + j] = uint16_t(row[j].w[c / 2] >> (16 * (c % 2)));
            else
              reinterpret_cast<uint32_t*>(ht)[c * S_ + j] = row[j].w[c];
          }
        }
      return;
    }
  }
  blk.from_packs(row);
#pragma unroll
  for (int i = 0; i < B::kVecs; ++i) stp<T, B::kPer>(ht + i * B::kPer, blk.v[i]);
}

}  // namespace

// An instance's name, spelled once per form: "fwd_decode_linear_rows(<form>)",
// with "narrow, " before the form in the narrow instances (kWide false).
#define SC_ROWS_NAME(form) \
  (kWide ? "fwd_decode_linear_rows(" form ")" : "fwd_decode_linear_rows(narrow, " form ")")

// The step on [P, D, S] rows held in registers (pl.row_regs = S) with CH
// channels per thread (the wide or the narrow instance).
template <class T, int CH>
cudaError_t launch_rows_in_registers(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  constexpr int H = DecodeTraits::kVecWmax - 1;
  constexpr bool kWide = CH * int(sizeof(T)) == DecodeTraits::kWideBytes;
  if (p.accepted) {  // S = (W-1) + K, K = 1 .. kSpecRowsMaxDrafts
    static_assert(DecodeTraits::kSpecRowsMaxDrafts == 4, "one instance per draft count below");
    switch (pl.row_regs - H) {
      case 1: return l->main(SC_ROWS_NAME("speculative, K = 1"), fwd_decode_linear_rows<T, CH, H + 1, true>, pl, a);
      case 2: return l->main(SC_ROWS_NAME("speculative, K = 2"), fwd_decode_linear_rows<T, CH, H + 2, true>, pl, a);
      case 3: return l->main(SC_ROWS_NAME("speculative, K = 3"), fwd_decode_linear_rows<T, CH, H + 3, true>, pl, a);
      case 4: return l->main(SC_ROWS_NAME("speculative, K = 4"), fwd_decode_linear_rows<T, CH, H + 4, true>, pl, a);
      default: return l->no_instance("decode, speculative rows in registers (S - (W-1) in 1..4)");
    }
  }
  if (pl.row_regs == H)
    return l->main(SC_ROWS_NAME("S = W-1"), fwd_decode_linear_rows<T, CH, H, false>, pl, a);
  if (pl.row_regs == H + 1)
    return l->main(SC_ROWS_NAME("S = W"), fwd_decode_linear_rows<T, CH, H + 1, false>, pl, a);
  return l->no_instance("decode, rows in registers");
}
#undef SC_ROWS_NAME

// The linear step on vLLM rows, or on [P, D, S] rows held in registers, for a
// plan of the decode path with pl.ch = kWideBytes (or kVecBytes) / element
// size (launch_decode's choice).
cudaError_t launch_decode_linear(const Problem& p, const Plan& pl, const Args& a, Launch* l) {
  return with_act_type(p.act_dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      return l->no_instance("decode, wide (fp64)");
    } else {
      constexpr int kWide = DecodeTraits::kWideBytes / int(sizeof(T));
      constexpr int kNarrow = DecodeTraits::kVecBytes / int(sizeof(T));
      if (pl.plain_step) return launch_decode_plain(p, pl, a, l);
      if (pl.spec_step) return launch_decode_spec(p, pl, a, l);
      if (pl.row_regs > 0) {
        if (pl.ch == kWide) return launch_rows_in_registers<T, kWide>(p, pl, a, l);
        if (pl.ch == kNarrow) return launch_rows_in_registers<T, kNarrow>(p, pl, a, l);
        return l->no_instance("decode, rows in registers");
      }
      // (the plan's overlap: kOverlapLaunch for raw taps' steps other than the plain one)
      if (pl.ch == kWide) {
        if (pl.raw_taps && pl.overlap == kOverlapLaunch)
          return l->main("fwd_decode_linear(channel rows, raw taps, overlapped)", fwd_decode_linear<T, kWide, true, kOverlapLaunch>, pl, a);
        if (pl.raw_taps)
          return l->main("fwd_decode_linear(channel rows, raw taps)", fwd_decode_linear<T, kWide, true>, pl, a);
        return l->main("fwd_decode_linear(channel rows)", fwd_decode_linear<T, kWide, false>, pl, a);
      }
      if (pl.ch == kNarrow) {
        if (pl.raw_taps && pl.overlap == kOverlapLaunch)
          return l->main("fwd_decode_linear(narrow, channel rows, raw taps, overlapped)", fwd_decode_linear<T, kNarrow, true, kOverlapLaunch>, pl, a);
        if (pl.raw_taps)
          return l->main("fwd_decode_linear(narrow, channel rows, raw taps)", fwd_decode_linear<T, kNarrow, true>, pl, a);
        return l->main("fwd_decode_linear(narrow, channel rows)", fwd_decode_linear<T, kNarrow, false>, pl, a);
      }
      return l->no_instance("decode on channel rows");
    }
  });
}

}  // namespace shortconv::cuda
