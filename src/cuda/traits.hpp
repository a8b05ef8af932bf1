// Compile-time shape of every CUDA kernel, in one place.
//
// Each kernel's traits type is read by its __launch_bounds__ (SC_BOUNDS), by
// its body (unroll depths, channels per thread, caches) and by the host planner
// (plan.cpp: block shape, residency for wave sizing, shared memory), so no
// launch number is written twice.  The instance sets (which window bounds WMAX
// exist for which path) are listed here too: the planner picks from them and
// the launchers instantiate exactly them, so a plan without a kernel cannot
// happen (dispatch.cuh reports it as SC_ERR_BACKEND if it ever did).
//
// Pure C++: included by host code compiled without nvcc (the planner and its
// test) as well as by the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

// constexpr functions the kernels call in constant expressions too.
#if defined(__CUDACC__)
#define SC_TRAIT constexpr __host__ __device__
#else
#define SC_TRAIT constexpr
#endif

namespace shortconv::cuda {

// The window bounds instantiated per path.  A runtime W uses the smallest bound
// >= W; the window is padded to it and the pad taps are predicated off.
struct WmaxSet {
  int v[5];
  int n;
  SC_TRAIT int for_width(int W) const {
    for (int i = 0; i < n; ++i)
      if (W <= v[i]) return v[i];
    return 0;  // beyond the set: the general path
  }
};
// Token-major vector path: W = 4 (the targets') exact, and W <= 8 with two
// channels per thread (wider windows leave too few registers for vectors).
constexpr WmaxSet kTmVecWmax = {{4, 8, 0, 0, 0}, 2};
// The same for 16-bit activations, with W = 2 and 3 exact too: only W = WMAX
// takes the full-window instances (no pad predicates), and padded to 4 they
// ran at 0.80 / 0.65 of the floor against W = 4's 0.85 / 0.81 (H200, bf16).
// (fp32 at W = 2, 3 padded to 4 already ran at 0.89 / 0.87: no instances.)
// And W = 16 in full-window form only (kTmWideFullOnly), two channels per
// thread: one channel per thread (the scalar kernels) took 53 instructions per
// element in the W = 16 forward's loop and 136 in the backward's (SASS, sm_90:
// runtime pad predicates, addresses per 2-byte element), the full-window
// instances 34 and 78.  (H200, 8x4096x4096 bf16, same call: 444.6 / 1385.7 us
// -> 223.3 / 858.5.)
constexpr WmaxSet kTmVecWmax16 = {{2, 3, 4, 8, 16}, 5};
// Window bounds beyond this take the vector path only where their direction's
// full-window instance applies (W == WMAX, SiLU; the backward with dx, dy and a
// weight or bias gradient, tiles of at least kBwdFullMinTileT): the generic
// 16-tap forms ran slower than the scalar kernels at one block per SM (H200,
// same call: W = 12 bf16 f+b 1357.1 -> 1550.8 us, W = 16 fp32 1488.9 -> 1688.7;
// forwards within 6%), so they are not compiled.
constexpr int kTmWideFullOnly = 8;
SC_TRAIT WmaxSet tm_vec_wmax(int elem_bytes) { return elem_bytes == 2 ? kTmVecWmax16 : kTmVecWmax; }
// Token-major scalar and channel-major paths: two steps (fewer instances:
// CI compiles every instance for two architectures on two cores).
constexpr WmaxSet kNarrowWmax = {{4, 16, 0, 0, 0}, 2};
// Widest window of the register-window paths; wider W takes the general path.
constexpr int kMaxFastW = 16;
static_assert(kNarrowWmax.for_width(kMaxFastW) == kMaxFastW, "the scalar path reaches kMaxFastW");

// Channels per thread on the token-major vector path: one 16-byte vector,
// narrowed for wide windows so that weights and window stay in registers
// (16 / WMAX weight registers per channel group: no spills at 2 blocks/SM),
// and never below two (WMAX = 16: one block per SM, TmTraits::min_blocks).
// Windows below 4 keep W = 4's channels (the same thread shape, one channel
// count per dtype up to W = 4).
SC_TRAIT int tm_vec_channels(int elem_bytes, int wmax) {
  const int vec = 16 / elem_bytes;
  const int fit = 16 / (wmax < 4 ? 4 : wmax);
  const int budget = fit < 2 ? 2 : fit;
  return vec < budget ? vec : budget;
}

// fwd_tm / bwd_tm: a thread owns CH channels x one time tile; a block is
// cx threads along channels x ty tiles (cx * ty = kThreads).
struct TmTraits {
  static constexpr int kThreads = 256;
  // Register cap: 2 blocks (512 threads) per SM; the planner sizes waves with it.
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr int kResidentThreads = kThreads * kMinBlocksPerSm;
  // Vector instances (ch > 1) of windows beyond kTmWideFullOnly (the 16-tap ones)
  // run one block per SM: a thread's taps, window, look-ahead and partials
  // (2 channels x 16) need more than the 128 registers of two.  (The scalar
  // instances, one channel, keep two.)
  static constexpr int kWideMinBlocks = 1;
  static SC_TRAIT int min_blocks(int wmax, int ch) {
    return wmax > kTmWideFullOnly && ch > 1 ? kWideMinBlocks : kMinBlocksPerSm;
  }
  // The 16-bit full-window SiLU forward without residual (fwd_tm's FULL
  // instance) takes x through the thread's slots of a shared-memory ring,
  // filled by cp.async kFullStages stages of kFullTokens tokens ahead: the
  // bytes in flight hold no registers, so the kernel fits kFullMinBlocks
  // blocks per SM (in flight per SM: (stages - 1) * tokens * 8 bytes per thread).
  // (H200, 8x4096x4096 bf16 forward: 6 stages 148.9 us, 8 of 2 tokens 153.9,
  // against 148.1 here; 4 blocks (64 registers) spill 108-344 B: 168.6.)
  static constexpr int kFullStages = 4;     // ring stages (one cp.async group each)
  static constexpr int kFullTokens = 4;     // tokens per stage
  static constexpr int kFullMinBlocks = 3;  // its register cap: blocks per SM (80 registers)
  // The same for the 16-tap instance: 32 taps and 30 window registers leave
  // too few of 80 (2 blocks: 128).
  static constexpr int kFullWideMinBlocks = 2;
  static SC_TRAIT int full_min_blocks(int wmax) { return wmax > kTmWideFullOnly ? kFullWideMinBlocks : kFullMinBlocks; }
  static constexpr int kFullPackBytes = 8;                // the widest 16-bit pack (CH = 4 at W <= 4)
  // With a residual the ring holds two packs per token (x, residual) in
  // fewer stages, within the same 48 KB bound.
  static constexpr int kFullResStages = 3;
  static SC_TRAIT int full_stages(bool res) { return res ? kFullResStages : kFullStages; }
  static SC_TRAIT size_t full_ring_bytes(bool res) {
    return size_t(full_stages(res)) * kFullTokens * (res ? 2 : 1) * kThreads * kFullPackBytes;
  }
  // Threads of one wave of an instance (the planner's tile sizing): the
  // full-window forward's, or any other of window bound wmax.
  static SC_TRAIT int resident_threads(bool full_fwd, int wmax, int ch) {
    return kThreads * (full_fwd ? full_min_blocks(wmax) : min_blocks(wmax, ch));
  }
  static constexpr int kMaxCx = 32;                 // threads along channels (one warp)
  // The same, the full-window forward: wider blocks along channels (H200,
  // bf16 W = 8: 178.2 -> 170.5 us at 128; W = 4 within 1%).
  static constexpr int kFullMaxCx = 128;
  static constexpr int kUnroll = 4;                 // tokens whose loads are issued together
  static constexpr int64_t kMinTileT = 8;           // shortest automatic tile (halo W-1 re-read per tile)
  static constexpr int64_t kMaxTileT = 256;         // longest automatic forward tile (enough work per thread)
  // Longest automatic backward tile: each tile pays 2(W-1) generic warm-up and
  // look-ahead steps and a block reduction, so the backward takes longer tiles
  // (H200: f+b -1% to -4% on the dense, long and packed shapes against 256).
  static constexpr int64_t kMaxTileTBwd = 512;
  static constexpr int64_t kMinWaves = 3;           // forward beyond one wave of kMaxTileT tiles: >= this many waves
  // Widest window whose full-window forward issues its ring's first stages
  // before the taps' loads on dense tiles (fwd_tm's prime; H100, 2026-12-06:
  // W = 8 primed 216.7 -> 219.4 us, its instance spilling more).
  static constexpr int kPrimeMaxWmax = 4;
  // Shortest tile taking the full-window backward instance.  (H200, 2026-12-04: 32, so that
  // the small 1x2048x2048 shape's 16-token tiles take the generic instance, made its f+b
  // 32.0 -> 33.9 us.)
  static constexpr int64_t kBwdFullMinTileT = 16;
  // The 16-bit full-window SiLU backward (bwd_tm's FULL instance, the plan's
  // full_bwd) takes x and dy the same way: the thread's slots of a ring of
  // kBwdStages stages of kBwdTokens tokens, two packs each.  After the tiles
  // the ring holds the block's dweight/dbias reduction (bwd_smem fits in it),
  // so the instance takes no dynamic shared memory.  (H200, bf16 8x4096x4096
  // f+b against the register loop with L2 prefetches: W = 8 518.7 -> 493.2 us,
  // W = 3 365.1 -> 360.3, W = 4 382.8 -> 383.2; 3 stages of 4 tokens: W = 4
  // 392.9, W = 8 517.6.)
  static constexpr int kBwdStages = 4;  // ring stages (one cp.async group each)
  static constexpr int kBwdTokens = 3;  // tokens per stage (x and dy: two packs each)
  static constexpr size_t kBwdRingBytes = size_t(kBwdStages) * kBwdTokens * 2 * kThreads * kFullPackBytes;
  // Stages per trip of the ring loop: two, so that the window registers a
  // trip hands to the next are those the previous trip filled (W <= 4: 6
  // tokens, a multiple of W - 1) and the compiler needs no moves between
  // trips.  (H200, bf16, f+b against one stage per trip, same call: dense
  // W = 4 378.6 -> 374.1 us, long 741.3 -> 722.8, packed 773.2 -> 762.8, W = 8
  // 494.3 -> 492.4, W = 2, 3 within 0.3%; W = 8 with 7-token stages, 3 of them,
  // also move-free and 14% fewer instructions per element: 493.4.  SASS of
  // the W = 4 loop: 33 -> 30 instructions per element, no spill in it.)
  static constexpr int kBwdUnroll = 2;
  // Shared memory of bwd_tm: the block's dweight/dbias partials, one row of
  // ch * (WMAX + 1) accumulators per thread.
  static SC_TRAIT size_t bwd_smem(int cx, int ty, int ch, int wmax, int acc_bytes) {
    return size_t(cx) * size_t(ty) * size_t(ch) * size_t(wmax + 1) * size_t(acc_bytes);
  }
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "a block is whole warps");
  static_assert(kThreads % kMaxCx == 0 && kThreads % kFullMaxCx == 0, "cx * ty = kThreads");
  static_assert(kMinTileT >= 1 && kMinTileT <= kMaxTileT && kMaxTileT <= kMaxTileTBwd, "tile bounds");
  static_assert(kFullStages >= 2 && kFullTokens >= 1, "a stage computed while the next is in flight");
  static_assert(kFullResStages >= 2, "a stage computed while the next is in flight");
  static_assert(kBwdStages >= 2 && kBwdTokens >= 1 && kBwdRingBytes <= 48 * 1024, "the backward's ring, likewise");
  static_assert(kBwdUnroll >= 1, "at least one stage per trip");
};
static_assert(TmTraits::full_ring_bytes(false) <= 48 * 1024 && TmTraits::full_ring_bytes(true) <= 48 * 1024,
              "the forward's ring is static shared memory (48 KB at most)");

// fwd_cm / bwd_cm: a warp owns a (batch, channel) row tile, a lane kVec
// consecutive tokens (one 16-byte vector) per step.
struct CmTraits {
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocksPerSm = 0;         // no register cap (0: unspecified; 1 made ptxas use more registers)
  // Residency assumed for wave sizing (measured: 2 blocks/SM).
  static constexpr int kResidentThreads = 2 * kThreads;
  static constexpr int kWarp = 32;
  static SC_TRAIT int vec(int elem_bytes) { return 16 / elem_bytes; }
  static constexpr int kMaxIters = 16;              // most 32*kVec-token chunks per warp tile
  // fwd_cm: chunks whose x (and residual) loads a warp issues together before
  // computing them (the y store is a compiler barrier: no load crosses it).
  // H200, 8x4096x4096, full-window instance: bf16 fwd 148.2 us at 2, 146.5 at
  // 4 (64 -> 80 registers, no spill); fp32 272.5 -> 265.8.  A cap of 6 blocks
  // per SM at 2 (40 registers) ran 184.5 (bf16).
  static constexpr int kFwdUnroll = 4;
  // bwd_cm: chunks of x and dy staged per warp in shared memory by cp.async,
  // kBwdStages - 1 of them in flight while one is computed (its registers
  // allow few warps per SM; the stage keeps the bytes in flight instead).
  // H200, bf16 f+b: 4 stages 515.8 us, 6 stages 514.3, one chunk ahead in
  // registers (before) 583.6.
  static constexpr int kBwdStages = 4;
  // bwd_cm's block and register cap (its own: its registers, not fwd_cm's,
  // set the residency).
  // (full-window bf16 f+b: 5 blocks 416.5 us, 4 blocks (128 registers, no
  // spill) 421.5.)
  static constexpr int kBwdThreads = 128;
  static constexpr int kBwdMinBlocksPerSm = 5;
  static SC_TRAIT int threads(bool bwd) { return bwd ? kBwdThreads : kThreads; }
  // The cap per window bound: the WMAX = 16 instances spill hundreds of bytes
  // under it (ptxas -v) and run uncapped.
  static SC_TRAIT int bwd_min_blocks(int wmax) { return wmax <= 4 ? kBwdMinBlocksPerSm : 0; }
  static SC_TRAIT size_t bwd_stage_bytes() { return size_t(kBwdThreads / kWarp) * kBwdStages * 2 * kWarp * 16; }
  static_assert(kFwdUnroll >= 1 && kBwdStages >= 2, "at least the chunk computed and one in flight");
};
static_assert(CmTraits::bwd_stage_bytes() <= 48 * 1024, "bwd_cm's stage is static shared memory");

// fwd_general / dpre_general / bwd_general (W > kMaxFastW): a thread per
// (channel, tile); block shape as the token-major path with one channel per thread.
struct GeneralTraits {
  static constexpr int kThreads = TmTraits::kThreads;
  static constexpr int kMinBlocksPerSm = 0;  // no register cap
};

// state_fwd / state_bwd / reduce_parts: one thread per (sequence, channel)
// or (channel, tap); small launches.
struct SmallTraits {
  static constexpr int kThreads = 128;
  static constexpr int kMinBlocksPerSm = 0;  // no register cap
  // state_bwd keeps the dpre of a sequence's first kDpreCache tokens (W <= 17
  // never recomputes one).
  static constexpr int kDpreCache = 16;
  // Grid-stride kernels (dx_from_dht) launch at most this many threads.
  static constexpr int64_t kMaxGridThreads = int64_t(1) << 22;
  static_assert(kDpreCache >= kMaxFastW, "the fast paths' windows fit the cache");
};

// fwd_decode (Path::decode, one launch per decode step): a thread owns CH
// channels of one sequence; a block is kThreads threads along channels.  It
// reads the window once, runs the sequence's few tokens in order and
// rewrites the state row itself.
struct DecodeTraits {
  static constexpr int kThreads = 128;
  static constexpr int kMinBlocksPerSm = 0;  // no register cap
  // Register cap of the narrow 16-bit linear instances (the serving dtypes'
  // common step): 12 blocks (75% occupancy, 40 registers, no spills in
  // ptxas -v) instead of 56 registers' 9; more warps to hide the row's round trips.
  static constexpr int kMinBlocksLinear16 = 12;
  // Vector instance: a thread's x per token is one kVecBytes word (CH = 2
  // channels of a 16-bit type, 1 of fp32), W <= kVecWmax.  A step is latency
  // bound: a thread's instruction path grows with its channels, and with 8
  // channels (16 bytes) a batch-1 step ran one warp per scheduler issuing every
  // 12 cycles (H200, ncu); 4-byte lanes still make 128-byte warp accesses.
  static constexpr int kVecBytes = 4;
  static constexpr int kVecWmax = 4;
  // Wide instance: kWideBytes of x per thread (8 bf16 channels), for steps
  // of many threads, where the issue rate bounds a step and the per-sequence
  // work (row indices, addresses, the taps' loads) is paid once per 16 bytes.
  // Linear steps on vector rows (either layout) only.
  static constexpr int kWideBytes = 16;
  // The wide instance when the narrow one would launch at least this many
  // threads per multiprocessor (H200, bf16 vLLM rows: wide 4.1 against 4.9 µs
  // at 990 threads per SM (batch 64, D = 4096), 3.40 against 3.32 at 250
  // (batch 8, D = 8192), 3.29 against 3.02 at 31 (batch 1)).
  static constexpr int64_t kWideMinThreadsPerSm = 512;
  // Register caps of the wide instance on vLLM rows with raw taps
  // (decode_linear.cu), as blocks per SM: 8 = 64 registers for the 16-bit types,
  // 7 = 72 for fp32 (no spills in ptxas -v; fp32 spilled 12 bytes at 64).
  static constexpr int kMinBlocksWide16 = 8;
  static constexpr int kMinBlocksWide32 = 7;
  // Speculative steps on [P, D, S] rows in registers (fwd_decode_spec_rows,
  // and fwd_decode_linear_rows' SPEC instances): rows of S = (W-1) + K
  // entries, K up to kSpecRowsMaxDrafts (one instance per K).  Register caps as blocks per SM: 6 (80 registers)
  // for K <= 2, 5 (102) beyond, where 80 spilled 36-68 bytes (ptxas -v, sm_90).
  static constexpr int kSpecRowsMaxDrafts = 4;
  static constexpr int kSpecRowsShortK = 2;
  static constexpr int kMinBlocksSpecRowsShort = 6;
  static constexpr int kMinBlocksSpecRowsLong = 5;
  static SC_TRAIT int spec_rows_min_blocks(int K) {
    return K <= kSpecRowsShortK ? kMinBlocksSpecRowsShort : kMinBlocksSpecRowsLong;
  }
  // The speculative step on vLLM rows (fwd_decode_spec, decode_spec.cu): at
  // most this many tokens per sequence (1 + kSpecRowsMaxDrafts), whose x
  // loads it issues together (one x register set per token; more tokens take
  // fwd_decode_linear).
  static constexpr int kSpecMaxTokens = kSpecRowsMaxDrafts + 1;
  // Its wide instances' register cap, as blocks per SM: 6 (80 registers; they
  // take 72-80, and spilled 108-320 bytes at the raw-tap cap of 64, with two
  // tokens' x in flight or all of them).
  static constexpr int kMinBlocksSpecWide = 6;
  // Its narrow instances' (the steps of fewer than kWideMinThreadsPerSm
  // threads per SM, where registers do not bound occupancy, and larger steps
  // the wide instance cannot take): 8 (64 registers; they take 34-48), room
  // for the taps and the window as fp32, converted once.
  static constexpr int kMinBlocksSpecNarrow = 8;
  // Scalar instance (any strides, fp64, W 5..16): one channel per thread.
  static constexpr int kScalarWmax = kMaxFastW;
  // "A decode step": at most kMaxTokens tokens per sequence (dense), at most
  // that many per sequence on average (packed; a longer sequence of a packed
  // step is walked by its threads token after token, correct but serial).
  static constexpr int64_t kMaxTokens = 16;
  // Row-contiguous states ([P, D, S], S entries of a channel adjacent): a
  // thread's CH x S block is S kVecBytes words, staged in its own slice of
  // shared memory, up to this S.
  static constexpr int kRowVecMaxS = 16;
  // Entries of a vLLM-layout row copied per round: read them all, then write.
  static constexpr int kRowChunk = 4;
  // Units of a [P, D, S] row staged per round (all loaded, then stored).
  static constexpr int kStageChunk = 8;
  // The row_vec stage: S units of unit_bytes (CH * element size) per thread.
  static SC_TRAIT size_t rowvec_smem(int S, int unit_bytes) {
    return size_t(kThreads) * size_t(S) * size_t(unit_bytes);
  }
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "a block is whole warps");
  static_assert(kVecBytes == 4, "the stage and the x vectors are 32-bit words");
  static_assert(kWideBytes % kVecBytes == 0 && kWideBytes <= 16, "a wide x word is one vector access");
};
static_assert(DecodeTraits::rowvec_smem(DecodeTraits::kRowVecMaxS, DecodeTraits::kWideBytes) <= 48 * 1024,
              "the row_vec stage fits the default dynamic shared memory limit");

// state_fwd_ids / state_bwd_ids (seq_idx): a block's warps share kTokens
// consecutive tokens of the flat B*T axis (one warp ballot finds the runs
// ending / starting there), each thread one channel of their state rows:
// grid = (tokens / kTokens) x (D / kThreads).
struct IdStateTraits {
  static constexpr int kTokens = 32;  // one ballot: a lane per token
  static constexpr int kThreads = 128;
  static constexpr int kMinBlocksPerSm = 0;  // no register cap
  static_assert(kThreads % 32 == 0, "a block is whole warps");
};

// CUDA grid limits the planner checks (grid.x is the tile axis, grid.y the
// channel-group axis).
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

// Plans are made for min(device SMs, kPlanMaxSms) and the workspace for
// kPlanMaxSms: more SMs only ever shorten tiles (more partial rows), so a size
// queried once covers every device, however large (a device beyond this count
// runs the plan of this count: correct, a little less parallel).
constexpr int kPlanMaxSms = 256;

}  // namespace shortconv::cuda
