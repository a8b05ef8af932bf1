// CPU backend: the tiling, the workspace layout and the per-call context.
//
// Work decomposition (identical for forward and backward, and a function of
// the shapes and forced tiles only -- never of the thread count or the ISA):
//
//   * All tokens of the batch are numbered on one "global token axis"
//     g in [0, total): dense g = b*T + t (total = B*T), packed g = the row of x
//     (total = cu_seqlens[N]).  The axis is cut into CHUNKS of tile_t tokens.
//   * Channels are cut into D-TILES of tile_d channels.
//   * A TILE is (chunk, d-tile).  Inside a tile, the chunk is split at sequence
//     boundaries into PIECES (n, [tb, te)) -- local token range of sequence n.
//     A piece reads W-1 tokens of halo before tb (earlier rows of x, or the
//     initial state when tb < W-1) and, in the backward, W-1 rows after te
//     (recomputing their dpre): the halo is re-read, never written, so every
//     output element (y, dx, dh0) is written by exactly one tile.
//   * Backward weight/bias gradients: each tile writes its own partial sums
//     ([W+1][tile_d] in the workspace); a final pass adds the partials of all
//     chunks in chunk order.  The result is bitwise independent of threads.
//   * The threads take TASKS: one tile each, or, when x's time axis is
//     contiguous (the time-vectorised kernels) and the other activations'
//     too (time_contiguous_io), chunk_group consecutive chunks
//     of one d-tile, walked channel by channel so that each channel is read in
//     one long run.  A task computes exactly what its tiles would, in the same
//     order per output and partial entry: the grouping (which reads strides)
//     changes no result and no workspace size.
//
// Workspace (all in the accumulation type A = float, or double for f64 x),
// every block 64-byte aligned:
//   wb    [Dp/L][W+1][L]   weight taps then bias, per vector of L channels
//                          (L = the chosen kernels' lanes), zero padded
//   halo  [N][W-1][Dp]     the last W-1 initial-state entries of each sequence
//                          (copied before any final state is written: this is
//                          what makes the in-place state update safe); with
//                          seq_idx one per initial-state row (rows are ids)
//   runs  [B*T+1] int64    seq_idx: the first token of each run, then the total
//                          (built by the driver before the phases)
//   part  [tiles][tile_d/L][W+1][L]  backward partial dweight taps and dbias
//   scr   [tiles][rings][W][tile_d]  window rings, only when they exceed the
//                          stack budget (forced wide tiles or a huge W)
//   chain [tasks][W]       int64: tree drafts (parent_tokens), the u positions
//                          one token's taps read, per (sequence, d-tile) task
//
// Tree drafts replace the tiles by one task per (sequence, d-tile) that walks
// every token of its sequence (a token may read any earlier one of its step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/activation.hpp"
#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"

namespace shortconv::cpu {

// Storage tags for the 16-bit float types (raw bits).
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

constexpr int kMaxWClass = 4;  // W 1..4 get register-window kernels, other W the generic one

// The tile sizes and the stack budget of the decomposition above.
struct Tiling {
  // Channel granularity: tiles and the padded channel count are multiples of
  // this (the widest vector, 16 floats in a 512-bit register).
  static constexpr int64_t kLane = 16;
  // Automatic tile_d: 256 channels.  Kernels walk a tile row by row (time
  // outer, channel vectors inner), so every row of a tile is one contiguous
  // run (512 B of bf16) and no cache line is needed twice -- a column-wise walk
  // would revisit lines whose power-of-two row strides alias in one L1 set.
  static constexpr int64_t kAutoTileD = 256;
  // Automatic tile_t: time rows per chunk.  Long chunks amortise the W-1 halo
  // rows (re-read) and keep backward partials small (W+1 floats per channel
  // per tile); 256 rows still give total/256 * D/256 tiles for load balance.
  static constexpr int64_t kAutoTileT = 256;
  // Per-thread window rings (the last W inputs and, backward, the last W dpre
  // of each channel of the tile) live on the stack up to this size; larger
  // ones (forced wide tiles, huge W) live per tile in the workspace.
  static constexpr size_t kStackRingBytes = 32 * 1024;
  // A time-contiguous x (the time-vectorised kernels, which walk a tile
  // channel by channel): a task takes consecutive chunks of one d-tile, up to
  // this many rows, and walks each channel through all of them, so a channel
  // is read in one long run instead of 256-row pieces 8 KiB apart (this VM,
  // bf16 4x4096x2048 channel-major forward: 6.0 ms at whole-sequence runs
  // against 11.4 at 256-row ones) -- while at least kMinTasks tasks remain
  // for the threads.  The outputs do not depend on it: each y, dx, dh0
  // element is computed alone, and the backward's partial sums stay those of
  // each chunk's own tile, added in the same order.
  static constexpr int64_t kTimeTaskRows = 4096;
  static constexpr int64_t kMinTasks = 32;
  // The decode-shaped forward (cpu_kernels_decode.hpp) takes calls of at most
  // kDecodeMaxTokens tokens per sequence (a step: one token, or a few
  // speculative ones) and state rows of at most kDecodeMaxEntries entries (its
  // per-sequence offset tables live on the stack); longer sequences stream
  // better through the tiles, row by row.  A task is one d-tile of
  // kDecodeGroup sequences: the d-tile's taps stay in L1 across them.
  static constexpr int64_t kDecodeMaxTokens = 16;
  static constexpr int64_t kDecodeMaxEntries = 64;
  static constexpr int64_t kDecodeGroup = 16;
};
static_assert(Tiling::kAutoTileD % Tiling::kLane == 0, "tile_d must be whole vectors");
static_assert(Tiling::kAutoTileT >= 1, "tile_t must be positive");
static_assert(2 * 4 * Tiling::kAutoTileD * 4 <= Tiling::kStackRingBytes,
              "W = 4 rings of an automatic tile must fit the stack budget");

struct Plan {
  int64_t tile_t = 0;    // tokens per chunk (forced p.exec.tile_t, at most the axis, or automatic)
  int64_t tile_d = 0;    // channels per d-tile, a multiple of kLane
  int64_t Dp = 0;        // D rounded up to kLane (padded weight/bias/halo rows)
  int64_t total = 0;     // tokens on the global axis
  int64_t n_chunks = 0;  // ceil(total / tile_t)
  int64_t n_dtiles = 0;  // ceil(D / tile_d)
  int64_t n_tiles = 0;   // n_chunks * n_dtiles
  int64_t chunk_group = 1;  // chunks per task (consecutive, of one d-tile; time-vectorised)
  int64_t n_tasks = 0;   // phase 2's tasks: n_tiles, or ceil(n_chunks / chunk_group) * n_dtiles
  size_t acc = 4;        // bytes of the accumulation type
  int64_t ring_elems = 0;        // window rings per tile, in A elements
  bool ws_scratch = false;       // rings in the workspace (> kStackRingBytes)
  bool run_tiles = false;        // phase 2 has work (an output the tiles write, tokens, channels)
  bool halo = false;             // initial-state halo in the workspace (h0 given, W > 1, tiles run)
  bool part = false;             // backward dweight/dbias partials in the workspace
  bool tree = false;             // parent_tokens: phase 2 runs n_tiles = N * n_dtiles tree tasks
  bool runs = false;             // seq_idx: the run table in the workspace
  bool decode = false;           // phase 2 runs decode tasks instead of tiles (make_run_plan)
  int64_t halo_rows = 0;         // halo rows: N, or with seq_idx initial_state's rows
  size_t off_w = 0, off_halo = 0, off_part = 0, off_scr = 0, off_tree = 0, off_runs = 0, bytes = 0;
  bool too_large = false;        // some size does not fit in 63 bits: the call is refused
};

// The time-vectorised kernels (cpu_kernels_time.hpp) run when x's time axis
// is contiguous and its channel axis is not.
inline bool time_vectorised(const Problem& p) { return p.x.stride[1] == 1 && p.x.stride[2] != 1; }

// Whether every other activation tensor of the call (y, residual; dy, dx) has
// x's contiguous time axis too.  One that does not is read or written lane by
// lane, each lane a cache line T elements from the next channel's; the lines
// of a 256-row block stay in L1 for the channels after it, those of a
// 4096-row group do not, so such calls take no chunk groups (this VM, bf16
// 4x4096x2048, x channel-major and dy token-major, forward+backward through
// the PyTorch API: 194 ms grouped, 77 under this rule, 53 with dy channel-major).
inline bool time_contiguous_io(const Problem& p) {
  auto ok = [](const View& v) { return !v || v.stride[1] == 1 || v.shape[1] == 1; };
  return ok(p.y) && ok(p.residual) && ok(p.dy) && ok(p.dx);
}

// The longest sequence of the call is at most kDecodeMaxTokens tokens (packed:
// cu_seqlens read on the host, only when the total allows it).
inline bool short_sequences(const Problem& p) {
  if (!p.packed) return p.T <= Tiling::kDecodeMaxTokens;
  if (p.T > p.N * Tiling::kDecodeMaxTokens) return false;
  for (int64_t n = 0; n < p.N; ++n)
    if (p.seq_len(n) > Tiling::kDecodeMaxTokens) return false;
  return true;
}

// Whether phase 2 runs the decode-shaped forward (cpu_kernels_decode.hpp):
// a forward with y of short sequences, automatic time tiles (forced ones keep
// the tiles, so the sweeps test both paths on decode shapes), W with a
// register window, states of x's dtype (their entries are copied as bits), and
// none of the rules it does not implement (seq_idx runs, tree drafts, prefix
// caching's snapshots).  A channel-first x (time axis contiguous) is staged
// token-major per block when a sequence's tokens of consecutive channels lie
// within kDecodeMaxTokens elements (vLLM's speculative (batch, dim, seqlen)
// input: channel stride T); a packed [1, D, total] view, whose channels lie
// all the tokens apart, keeps the time-vectorised tiles, which walk each
// channel through many sequences (this VM, bf16, D = 4096, one thread, 64
// sequences of 16 tokens: 20.4 ms there, 42.4 staged).
inline bool decode_shaped(const Problem& p, const Plan& pl) {
  return p.dir == Dir::fwd && pl.run_tiles && !pl.tree && !pl.runs && p.block_size == 0 &&
         (!time_vectorised(p) || p.x.stride[2] <= Tiling::kDecodeMaxTokens) && p.exec.tile_t == 0 &&
         p.W <= kMaxWClass && p.S <= Tiling::kDecodeMaxEntries &&
         (!p.h0 || p.h0.dtype == p.act_dtype) && (!p.ht || p.ht.dtype == p.act_dtype) &&
         short_sequences(p);
}

// Every size below goes through Count (core/checked.hpp): shapes that pass
// validation can still multiply past 64 bits (2^58 expanded sequences x
// channels x bytes); such a plan is too_large, never a wrapped small size.
inline Plan make_plan(const Problem& p) {
  Plan pl;
  const int W = p.W;
  pl.acc = p.act_dtype == SC_F64 ? 8 : 4;
  const Count Dp = round_up(Count(std::max<int64_t>(p.D, 1)), Tiling::kLane);
  pl.Dp = Dp.value();
  pl.tile_d = p.exec.tile_d > 0 ? clamp_tile(p.exec.tile_d, pl.Dp) : Tiling::kAutoTileD;
  pl.tile_d = std::min(round_up(Count(pl.tile_d), Tiling::kLane).value(), pl.Dp);
  pl.total = p.packed ? p.T : p.B * p.T;  // fits: x's element count (B*T first) was checked
  pl.tile_t = p.exec.tile_t > 0 ? clamp_tile(p.exec.tile_t, pl.total) : Tiling::kAutoTileT;
  pl.n_chunks = ceil_div(pl.total, pl.tile_t);
  pl.n_dtiles = p.D > 0 ? ceil_div(p.D, pl.tile_d) : 0;
  pl.tree = p.dir == Dir::fwd && bool(p.parents);
  const Count tiles = Count(pl.tree ? p.N : pl.n_chunks) * pl.n_dtiles;
  pl.n_tiles = tiles.value();
  if (!pl.tree && time_vectorised(p) && time_contiguous_io(p)) {
    pl.chunk_group = std::max<int64_t>(Tiling::kTimeTaskRows / pl.tile_t, 1);
    while (pl.chunk_group > 1 && ceil_div(pl.n_chunks, pl.chunk_group) * pl.n_dtiles < Tiling::kMinTasks)
      pl.chunk_group /= 2;
  }
  pl.n_tasks = pl.chunk_group > 1 ? ceil_div(pl.n_chunks, pl.chunk_group) * pl.n_dtiles : pl.n_tiles;
  const int rings = p.dir == Dir::fwd ? 1 : 2;  // x window (+ dpre window)
  // ... or the time-vectorised kernels' staging buffers, whichever is larger
  // (the same size for every layout; time_buffer_elems in cpu_kernels_time.hpp)
  const Count ring_cv = Count(rings) * W * pl.tile_d;
  const Count ring_tv = Count(2) * Tiling::kAutoTileT + Count(3) * (W - 1) + 4 * Tiling::kLane;
  const Count ring = ring_cv.value() >= ring_tv.value() ? ring_cv : ring_tv;  // (value() saturates)
  pl.ring_elems = ring.value();
  pl.ws_scratch = !pl.tree && (ring * int64_t(pl.acc)).value() > int64_t(Tiling::kStackRingBytes);
  const bool wanted = p.dir == Dir::fwd ? bool(p.y) : (p.dx || p.dh0 || p.dweight || p.dbias);
  pl.run_tiles = wanted && pl.total > 0 && p.D > 0;
  pl.halo = p.h0 && W > 1 && pl.run_tiles;
  pl.part = p.dir == Dir::bwd && (p.dweight || p.dbias) && pl.run_tiles;
  pl.runs = bool(p.seq_idx);
  pl.halo_rows = p.seq_idx ? (p.h0 ? p.h0.shape[0] : 0) : p.N;

  const int64_t acc = int64_t(pl.acc);
  auto aligned = [](Count c) { return round_up(c, 64); };
  Count off = 0;
  pl.off_w = off.bytes();
  off += aligned(Count(W + 1) * Dp * acc);
  pl.off_halo = off.bytes();
  if (pl.halo) off += aligned(Count(pl.halo_rows) * (W - 1) * Dp * acc);
  pl.off_part = off.bytes();
  if (pl.part) off += aligned(tiles * (W + 1) * pl.tile_d * acc);
  pl.off_scr = off.bytes();
  if (pl.ws_scratch) off += aligned(tiles * ring * acc);
  pl.off_tree = off.bytes();
  if (pl.tree && pl.run_tiles) off += aligned(tiles * W * int64_t(sizeof(int64_t)));
  pl.off_runs = off.bytes();
  if (pl.runs) off += aligned((Count(pl.total) + 1) * 8);
  off += 64;  // room to align the caller's pointer
  pl.too_large = tiles.overflow() || ring.overflow() || off.overflow();
  pl.bytes = off.bytes();
  return pl;
}

// The plan of a run: make_plan's, with phase 2's decode tasks when the call is
// decode-shaped (one per d-tile and group of kDecodeGroup sequences).  The
// workspace stays the tiles' (make_plan's size, a function of the shapes
// alone: the decision reads cu_seqlens).
inline Plan make_run_plan(const Problem& p) {
  Plan pl = make_plan(p);
  pl.decode = !pl.too_large && decode_shaped(p, pl);
  if (pl.decode) pl.n_tasks = ceil_div(p.N, Tiling::kDecodeGroup) * pl.n_dtiles;
  return pl;
}

// The sequences of a call on the global token axis g: the dense rows (g =
// b*T + t), the packed sequences of cu_seqlens (g = the row of x), or the
// runs of seq_idx (numbered like dense), whose first tokens the driver
// tabulates in the workspace.  row(n) is the row of sequence n's own state
// data (halo, dfinal_state, dinitial_state): n, or with seq_idx its id.
struct Seqs {
  const Problem* p = nullptr;
  int64_t N = 0;                    // sequences (seq_idx: runs)
  const int64_t* starts = nullptr;  // seq_idx: first token of run n, starts[N] = total

  int64_t first(int64_t n) const {  // global token of sequence n's token 0
    return starts ? starts[n] : p->packed ? load_index(p->cu_seqlens, n) : n * p->T;
  }
  int64_t len(int64_t n) const { return starts ? starts[n + 1] - starts[n] : p->seq_len(n); }
  int64_t id(int64_t n) const {  // seq_idx only: the run's id
    const int64_t g = starts[n];
    return p->seq_id(g / p->T, g % p->T);
  }
  bool pad(int64_t n) const { return starts && id(n) < 0; }  // a padding run
  int64_t row(int64_t n) const { return starts ? id(n) : n; }
  // Element offset of token 0 of sequence n in an activation view [B, T, D].
  int64_t base(const View& v, int64_t n) const {
    if (!starts) return p->packed ? load_index(p->cu_seqlens, n) * v.stride[1] : n * v.stride[0];
    const int64_t g = starts[n];
    return g / p->T * v.stride[0] + g % p->T * v.stride[1];
  }
};

// The per-call context every tile kernel receives.
struct Ctx {
  const Problem* p = nullptr;
  const Plan* plan = nullptr;
  Seqs seqs;
  const void* wT = nullptr;    // A [Dp/L][W+1][L]: weight taps, then bias
  const void* halo = nullptr;  // A [halo_rows][W-1][Dp], nullptr: zero initial states
  void* part = nullptr;        // A [tiles][tile_d/L][W+1][L] (backward, when dweight/dbias wanted)
  void* scr = nullptr;         // A [tiles][ring_elems] (rings too big for the stack)
  int64_t* chains = nullptr;   // [tasks][W] tap positions of tree drafts
};

// Calls f(n, tb, te, L) for each non-empty piece of the global tokens
// [g0, g1) (a sequence's tokens in it), in sequence order.
template <class F>
inline void for_each_piece_in(const Seqs& sq, int64_t g0, int64_t g1, F&& f) {
  const Problem& p = *sq.p;
  if (!p.packed && !sq.starts) {
    for (int64_t n = g0 / p.T; n < p.N && n * p.T < g1; ++n)
      f(n, std::max<int64_t>(g0 - n * p.T, 0), std::min<int64_t>(g1 - n * p.T, p.T), p.T);
    return;
  }
  // first sequence whose end is past g0
  int64_t lo = 0, hi = sq.N;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sq.first(mid + 1) > g0) hi = mid; else lo = mid + 1;
  }
  for (int64_t n = lo; n < sq.N; ++n) {
    const int64_t s = sq.first(n), e = sq.first(n + 1);
    if (s >= g1) break;
    if (e == s) continue;
    f(n, std::max(g0, s) - s, std::min(g1, e) - s, e - s);
  }
}

// The pieces of chunk c.
template <class F>
inline void for_each_piece(const Seqs& sq, const Plan& pl, int64_t c, F&& f) {
  const int64_t g0 = c * pl.tile_t;
  for_each_piece_in(sq, g0, std::min(g0 + pl.tile_t, pl.total), f);
}

// Kernel entry points, one table per ISA (cpu_isa_{v128,avx2,avx512}.cpp;
// cpu_isa.cpp picks one).  A tile kernel processes tile `tile` =
// chunk * n_dtiles + d-tile completely.
using TileFn = void (*)(const Ctx& c, int64_t tile);
struct Kernels {
  const char* isa;
  int lanes[4];  // vector lanes per dtype slot: the packed layouts' vector width
  // [dtype f32=0, f16=1, bf16=2, f64=3][activation id][W class: 0 generic, 1..kMaxWClass]
  TileFn fwd[4][Activations::kCount][kMaxWClass + 1];
  TileFn bwd[4][Activations::kCount][kMaxWClass + 1];
  TileFn tree[4][Activations::kCount];  // forward with parent_tokens: one (sequence, d-tile) task
  // decode-shaped forwards (Plan::decode): one (d-tile, sequence group) task; W classes 1..4 only
  TileFn decode[4][Activations::kCount][kMaxWClass + 1];
};
// Instruction sets, in order: a machine that runs one runs every lower one.
// v128: 128-bit vectors, every architecture's baseline (SSE2, NEON, generic);
// avx2 / avx512 / avx512bf16 (AVX-512 with its BF16 conversions: bf16 y and
// dx rounded by one instruction): x86-64 only.
enum class Isa { v128 = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3 };
const Kernels& kernels(Isa isa);
Isa best_isa();
const char* v128_name();  // "sse2", "neon" or "generic"

}  // namespace shortconv::cpu
