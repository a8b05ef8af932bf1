// The CUDA planner (plan.hpp): path choice, tiles, launch geometry, workspace.
#include "cuda/plan.hpp"

#include <algorithm>

#include "core/dtype.hpp"

namespace shortconv::cuda {

namespace {

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p <<= 1;
  return p;
}

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0;
}

// Activation tensors the main kernel of direction p.dir touches.
template <class F>
bool all_act(const Problem& p, F ok) {
  if (!ok(p.x)) return false;
  if (p.dir == Dir::fwd) return (!p.y || ok(p.y)) && (!p.residual || ok(p.residual));
  return (!p.dy || ok(p.dy)) && (!p.dx || ok(p.dx));
}

// The conditions of the full-window vector instances that do not depend on
// the tiles: W == wmax, SiLU, 16-bit; the backward with dx, dy and a weight or
// bias gradient.
bool full_window(const Problem& p, int wmax) {
  if (dtype_size(p.act_dtype) != 2 || p.W != wmax || p.act != SC_ACT_SILU) return false;
  return p.dir == Dir::fwd || (p.dx && p.dy && (p.dweight || p.dbias));
}

// The tiled token axis: B rows of T tokens, or with seq_idx one row of B*T
// (the packed batch of semantics section 3: the tiles, and so every partial
// sum, are those of the equivalent cu_seqlens batch).
int64_t axis_rows(const Problem& p) { return p.seq_idx ? 1 : p.B; }
int64_t axis_len(const Problem& p) { return p.seq_idx ? p.B * p.T : p.T; }

// Channels per thread of the vector path for p (1: the path does not apply).
// Window bounds beyond kTmWideFullOnly only in full-window form: a forced
// backward tile shorter than kBwdFullMinTileT takes the scalar path (an
// automatic one is made that long, plan_tm).
int vec_channels(const Problem& p) {
  if (p.act_dtype == SC_F64) return 1;  // fp64 is correct, not fast: the scalar path
  const int wmax = tm_vec_wmax(dtype_size(p.act_dtype)).for_width(p.W);
  if (wmax > kTmWideFullOnly &&
      (!full_window(p, wmax) ||
       (p.dir == Dir::bwd && p.exec.tile_t > 0 &&
        clamp_tile(p.exec.tile_t, axis_len(p)) < TmTraits::kBwdFullMinTileT)))
    return 1;
  return wmax ? tm_vec_channels(dtype_size(p.act_dtype), wmax) : 1;
}

bool tm_vec_ok(const Problem& p) {
  const int ch = vec_channels(p);
  if (ch == 1 || p.D % ch != 0) return false;
  const int es = dtype_size(p.act_dtype);
  return all_act(p, [&](const View& v) {
    return (v.stride[2] == 1 || v.shape[2] == 1) && v.stride[0] % ch == 0 &&
           v.stride[1] % ch == 0 && aligned(v.data, int64_t(ch) * es);
  });
}

// Channel-major kernels own whole rows of one sequence (no segment walker):
// not for packed batches nor seq_idx (a planned restriction; those take the
// token-major paths, whose walker splits tiles at sequence boundaries).
bool cm_shape_ok(const Problem& p) { return !p.packed && !p.seq_idx && p.act_dtype != SC_F64; }

bool cm_ok(const Problem& p) {
  if (!cm_shape_ok(p)) return false;
  const int vec = CmTraits::vec(dtype_size(p.act_dtype));
  if (p.T % vec != 0) return false;
  return all_act(p, [&](const View& v) {
    return v.stride[1] == 1 && v.stride[0] % vec == 0 && v.stride[2] % vec == 0 &&
           aligned(v.data, 16);
  });
}

// Channel-major tiles: several 32*vec-token chunks per warp (set-up amortised,
// fewer partial rows), at least one wave.
void plan_cm(const Problem& p, int sms, Plan* pl) {
  pl->vec = CmTraits::vec(dtype_size(p.act_dtype));
  pl->wmax = kNarrowWmax.for_width(p.W);
  const int64_t chunk = int64_t(CmTraits::kWarp) * pl->vec;  // tokens a warp covers per step
  if (p.exec.tile_t > 0) {
    pl->tile_t = ceil_div(clamp_tile(p.exec.tile_t, p.T), chunk) * chunk;
  } else {
    const int64_t target = int64_t(sms) * CmTraits::kResidentThreads;
    const int64_t warps = p.B * p.D * ceil_div(p.T, chunk);
    const int64_t iters = std::clamp<int64_t>(warps * CmTraits::kWarp / std::max<int64_t>(target, 1),
                                              1, CmTraits::kMaxIters);
    pl->tile_t = chunk * iters;
  }
  pl->axis = p.T;
  pl->tiles_per_row = ceil_div(p.T, pl->tile_t);
  pl->ntiles = p.B * pl->tiles_per_row;
  pl->parts = pl->ntiles;  // one partial row per warp tile
  const int threads = CmTraits::threads(p.dir == Dir::bwd);
  pl->block_x = threads;
  pl->grid_x = ceil_div(p.B * p.D * pl->tiles_per_row * CmTraits::kWarp, threads);
}

// Token-major and general tiles: one wave of resident threads when the work
// allows it, longest tiles otherwise (the forward keeps >= kMinWaves waves:
// the last wave's tail is then a smaller share; tiles filling whole waves
// instead, any multiple of 8 tokens, ran 1-2% slower on the W = 4 rows:
// H200, 2026-12-04, 8x4096x4096 bf16 149.8 us against 146.9-148.5 with these
// tiles in the calls before and after).
void plan_tm(const Problem& p, Path path, int sms, Plan* pl) {
  const bool bwd = p.dir == Dir::bwd;
  pl->ch = path == Path::token_major_vec ? vec_channels(p) : 1;
  pl->wmax = path == Path::token_major_vec    ? tm_vec_wmax(dtype_size(p.act_dtype)).for_width(p.W)
             : path == Path::token_major_scalar ? kNarrowWmax.for_width(p.W)
                                                : 0;
  pl->full_fwd = path == Path::token_major_vec && !bwd && full_window(p, pl->wmax);
  const int threads = path == Path::general ? GeneralTraits::kThreads : TmTraits::kThreads;
  const int64_t cols = ceil_div(p.D, pl->ch);
  int cx;
  if (p.exec.tile_d > 0)
    cx = int(std::clamp<int64_t>(ceil_div(p.exec.tile_d, pl->ch), 1, threads));
  else
    cx = int(std::min<int64_t>(pl->full_fwd ? TmTraits::kFullMaxCx : TmTraits::kMaxCx,
                               pow2_ceil(std::max<int64_t>(cols, 1))));
  const int ty = std::max(1, threads / cx);
  if (p.exec.tile_t > 0) {
    pl->tile_t = clamp_tile(p.exec.tile_t, axis_len(p));
  } else {
    const int64_t target = int64_t(sms) * TmTraits::resident_threads(pl->full_fwd, pl->wmax, pl->ch);  // threads of one wave
    const int64_t work = p.B * p.T * cols;                               // thread-tokens
    const int64_t per_thread = ceil_div(work, std::max<int64_t>(target, 1));
    if (bwd) {
      // (the wide windows' vector instance is the full-window one only: its tiles are long enough)
      const int64_t shortest = path == Path::token_major_vec && pl->wmax > kTmWideFullOnly
                                   ? TmTraits::kBwdFullMinTileT
                                   : TmTraits::kMinTileT;
      pl->tile_t = std::clamp<int64_t>(pow2_ceil(per_thread), shortest, TmTraits::kMaxTileTBwd);
    } else if (pow2_ceil(per_thread) <= TmTraits::kMaxTileT) {
      pl->tile_t = std::clamp<int64_t>(pow2_ceil(per_thread), TmTraits::kMinTileT, TmTraits::kMaxTileT);
    } else {  // (the backward measured slower with the shorter tiles)
      pl->tile_t = std::clamp<int64_t>(pow2_floor(per_thread / TmTraits::kMinWaves),
                                       TmTraits::kMinTileT, TmTraits::kMaxTileT);
    }
  }
  pl->axis = axis_len(p);
  pl->tiles_per_row = ceil_div(pl->axis, pl->tile_t);
  pl->ntiles = axis_rows(p) * pl->tiles_per_row;
  pl->parts = path == Path::general ? pl->ntiles : ceil_div(pl->ntiles, ty);
  pl->block_x = cx;
  pl->block_y = ty;
  pl->grid_x = ceil_div(pl->ntiles, ty);
  pl->grid_y = ceil_div(p.D, int64_t(cx) * pl->ch);
  pl->full_bwd = path == Path::token_major_vec && bwd && full_window(p, pl->wmax) &&
                 pl->tile_t >= TmTraits::kBwdFullMinTileT;
  if (bwd && path != Path::general && !pl->full_bwd)  // (the full instance reduces in its ring)
    pl->smem = TmTraits::bwd_smem(cx, ty, pl->ch, pl->wmax, p.act_dtype == SC_F64 ? 8 : 4);
}

// The decode path's vector instance: x, y, residual channel-contiguous in
// words of `bytes` (CH = bytes / element-size channels), W <= kVecWmax, not fp64.
bool decode_vec_ok(const Problem& p, int bytes) {
  if (p.act_dtype == SC_F64 || p.W > DecodeTraits::kVecWmax) return false;
  const int ch = bytes / dtype_size(p.act_dtype);
  if (p.D % ch != 0) return false;
  return all_act(p, [&](const View& v) {
    return (v.stride[2] == 1 || v.shape[2] == 1) && v.stride[0] % ch == 0 &&
           v.stride[1] % ch == 0 && aligned(v.data, bytes);
  });
}

// How the decode kernel's CH-channel threads read and write the state rows.
StateIo decode_state_io(const Problem& p, int ch, bool vec) {
  if (!vec || p.ring || p.state_dtype != p.act_dtype || (!p.h0 && !p.ht)) return StateIo::scalar;
  const int64_t es = dtype_size(p.state_dtype);
  auto both = [&](auto ok) { return (!p.h0 || ok(p.h0)) && (!p.ht || ok(p.ht)); };
  if (both([&](const View& v) {
        return v.stride[1] == 1 && v.stride[0] % ch == 0 && v.stride[2] % ch == 0 &&
               aligned(v.data, ch * es);
      }))
    return StateIo::channel_vec;
  const int64_t unit = ch * es;  // a thread's CH channels: its block of a row is S units
  if (p.S <= DecodeTraits::kRowVecMaxS &&
      (unit == DecodeTraits::kVecBytes || unit == DecodeTraits::kWideBytes) &&
      both([&](const View& v) {
        return v.stride[2] == 1 && v.stride[1] == p.S && v.stride[0] % ch == 0 && aligned(v.data, unit);
      }))
    return StateIo::row_vec;
  return StateIo::scalar;
}

// The taps as the weight's raw words (RawTaps, decode.cuh; the linear steps on
// vLLM rows, and on [P, D, S] rows held in registers):
// W = kVecWmax, weight [D, W] contiguous and bias [D] (or none) of x's dtype,
// each 16-byte aligned (a thread's CH * W taps are then whole vectors).
bool decode_raw_taps(const Problem& p) {
  if (p.W != DecodeTraits::kVecWmax || p.param_dtype != p.act_dtype) return false;
  const View& w = p.weight;
  if (w.stride[1] != 1 || w.stride[0] != p.W || !aligned(w.data, 16)) return false;
  return !p.bias || (p.bias.stride[0] == 1 && aligned(p.bias.data, 16));
}

// A speculative step on [P, D, S] rows that fwd_decode_linear_rows holds in
// registers: raw taps, S = (W-1) + K with K = 1 .. kSpecRowsMaxDrafts, and a
// dense batch of 1+K tokens per sequence (every row rewritten whole; packed
// and shorter steps keep entries of their rows: the staged instance).
bool spec_rows_in_registers(const Problem& p) {
  const int K = p.S - (DecodeTraits::kVecWmax - 1);
  return p.accepted && !p.parents && !p.packed && p.T == K + 1 && decode_raw_taps(p) && K >= 1 &&
         K <= DecodeTraits::kSpecRowsMaxDrafts;
}

// The wide vector instance (DecodeTraits::kWideBytes per thread): a linear
// step (no parent tokens) on vector rows whose narrow launch would have at
// least kWideMinThreadsPerSm threads per multiprocessor.  Speculative steps
// on [P, D, S] rows only when the rows are held in registers
// (spec_rows_in_registers): staged, their rows are rewritten entry by entry,
// 8 channels per thread serially (H200, bf16, 1+3 tokens, batch 256, D = 8192:
// 51.3 µs wide against 44.3 narrow; one token: 23.4 against 27.3).
bool decode_wide_ok(const Problem& p, int sms) {
  if (p.parents || !decode_vec_ok(p, DecodeTraits::kWideBytes)) return false;
  const int ch = DecodeTraits::kWideBytes / dtype_size(p.act_dtype);
  const StateIo io = decode_state_io(p, ch, true);
  if (io == StateIo::scalar || (io == StateIo::row_vec && p.accepted && !spec_rows_in_registers(p)))
    return false;
  const int64_t narrow_threads = p.N * (p.D / (DecodeTraits::kVecBytes / dtype_size(p.act_dtype)));
  return narrow_threads >= DecodeTraits::kWideMinThreadsPerSm * int64_t(sms);
}

// Decode: a block per (sequence, kThreads*CH channels), grid.x sequences,
// grid.y channel groups; a thread walks its sequence's tokens in order.
void plan_decode(const Problem& p, int sms, Plan* pl) {
  const bool vec = decode_vec_ok(p, DecodeTraits::kVecBytes);
  const int bytes = decode_wide_ok(p, sms) ? DecodeTraits::kWideBytes : DecodeTraits::kVecBytes;
  pl->ch = vec ? bytes / dtype_size(p.act_dtype) : 1;
  pl->wmax = vec ? DecodeTraits::kVecWmax : DecodeTraits::kScalarWmax;
  pl->state_io = decode_state_io(p, pl->ch, vec);
  pl->raw_taps = vec && pl->state_io == StateIo::channel_vec && decode_raw_taps(p);
  const int W = DecodeTraits::kVecWmax;  // (decode_raw_taps: p.W == W)
  if (pl->state_io == StateIo::row_vec && !p.parents &&
      decode_raw_taps(p) && (p.accepted ? spec_rows_in_registers(p) : (p.S == W - 1 || p.S == W)))
    pl->row_regs = p.S;
  // fwd_decode_plain (vLLM rows of W-1 entries or [P, D, S] rows in registers) and
  // fwd_decode_spec (accepted counts: vLLM rows, or [P, D, S] rows in registers): index
  // tensors of one dtype, their template parameter
  sc_dtype index_dtype = SC_I64;
  bool one_index_type = true, any_index = false;
  for (const View* v : {&p.h0_idx, &p.ht_idx, &p.accepted}) {
    if (!*v) continue;
    one_index_type = one_index_type && (!any_index || v->dtype == index_dtype);
    index_dtype = v->dtype;
    any_index = true;
  }
  const bool common = one_index_type && !p.packed && !p.ring && !p.table && !p.has_h0 && !p.parents &&
                      !p.seq_idx;
  const bool vllm_plain = pl->raw_taps && p.S == W - 1;
  pl->plain_step = common && (vllm_plain || pl->row_regs > 0) && p.T == 1 && !p.accepted;
  const bool vllm_spec = pl->raw_taps && p.T >= 1 && p.T <= DecodeTraits::kSpecMaxTokens && p.S >= W - 2 + p.T;
  pl->spec_step = common && p.accepted && (vllm_spec || pl->row_regs > 0);
  if (pl->plain_step || pl->spec_step) pl->plain_index = index_dtype == SC_I32 ? SC_I32 : SC_I64;
  pl->zero_pads_fused = p.zero_pads && pl->plain_step;
  // exec.overlap: the kernels with overlapped instances (decode_plain.cu, decode_spec.cu,
  // decode_linear.cu)
  const bool vllm_linear = pl->raw_taps && pl->row_regs == 0 && !p.parents;
  if (pl->plain_step || pl->spec_step) pl->overlap = p.exec.overlap;
  else if (vllm_linear && p.exec.overlap != SC_OVERLAP_NONE) pl->overlap = SC_OVERLAP_LAUNCH;
  pl->block_x = DecodeTraits::kThreads;
  pl->grid_x = p.N;
  pl->grid_y = ceil_div(p.D, int64_t(DecodeTraits::kThreads) * pl->ch);
  pl->smem = pl->state_io == StateIo::row_vec && pl->row_regs == 0
                 ? DecodeTraits::rowvec_smem(p.S, pl->ch * dtype_size(p.act_dtype))
                 : 0;
  pl->tile_t = std::max<int64_t>(p.T, 1);  // a "tile" is a whole sequence
  pl->tiles_per_row = 1;
  pl->ntiles = p.N;
}

}  // namespace

bool serving_step(const Problem& p) { return p.dir == Dir::fwd && (p.accepted || p.parents); }

bool decode_shaped(const Problem& p) {
  // (prefix-caching snapshots are state_fwd's: a prefill chunk takes the tiled paths;
  // seq_idx runs are found by the tiled walker: the decode kernel takes offsets only)
  if (p.dir != Dir::fwd || p.W > kMaxFastW || p.block_size > 0 || p.seq_idx) return false;
  if (serving_step(p)) return true;
  if (p.exec.tile_t > 0) return false;  // forced time tiles are the tiled paths' (tests sweep them)
  const int64_t most = DecodeTraits::kMaxTokens;
  return p.packed ? p.T <= most * std::max<int64_t>(p.N, 1) : p.T <= most;
}

const char* state_io_name(StateIo io) {
  switch (io) {
    case StateIo::scalar: return "scalar";
    case StateIo::channel_vec: return "channel vectors";
    case StateIo::row_vec: return "row vectors";
  }
  return "?";
}

const char* path_name(Path path) {
  switch (path) {
    case Path::token_major_vec: return "token-major vector";
    case Path::token_major_scalar: return "token-major scalar";
    case Path::channel_major: return "channel-major";
    case Path::general: return "general";
    case Path::decode: return "decode";
  }
  return "?";
}

int candidate_paths(const Problem& p, Path out[kMaxPaths]) {
  int n = 0;
  if (decode_shaped(p)) out[n++] = Path::decode;
  if (serving_step(p)) return n;  // the decode kernel only (none for W > kMaxFastW)
  if (p.W > kMaxFastW) {
    out[n++] = Path::general;
    return n;
  }
  if (vec_channels(p) > 1) out[n++] = Path::token_major_vec;
  if (cm_shape_ok(p)) out[n++] = Path::channel_major;
  out[n++] = Path::token_major_scalar;
  return n;
}

Path choose_path(const Problem& p) {
  Path cand[kMaxPaths];
  const int n = candidate_paths(p, cand);
  for (int i = 0; i < n; ++i) {
    if (cand[i] == Path::token_major_vec && !tm_vec_ok(p)) continue;
    if (cand[i] == Path::channel_major && !cm_ok(p)) continue;
    return cand[i];
  }
  // Reached only by a serving step with W > kMaxFastW, which has no candidate
  // (run() refuses it first); every other problem has the scalar or general path.
  return Path::general;
}

Plan plan_for(const Problem& p, Path path, int sms) {
  Plan pl;
  pl.path = path;
  if (path == Path::channel_major) plan_cm(p, sms, &pl);
  else if (path == Path::decode) plan_decode(p, sms, &pl);
  else plan_tm(p, path, sms, &pl);
  const bool bwd = p.dir == Dir::bwd;
  const bool want_dw = bwd && (p.dweight || p.dbias);
  const int64_t acc = p.act_dtype == SC_F64 ? 8 : 4;
  pl.part_bytes = want_dw ? Count(pl.parts) * p.D * (p.W + 1) * acc : Count(0);
  pl.dpre_bytes = (bwd && path == Path::general) ? Count(p.B * p.T) * p.D * acc : Count(0);
  return pl;
}

Count workspace_need(const Problem& p, int sms) {
  if (p.dir == Dir::fwd) return 0;
  Path cand[kMaxPaths];
  const int n = candidate_paths(p, cand);
  Count most = 0;
  for (int i = 0; i < n; ++i) {
    const Plan pl = plan_for(p, cand[i], sms);
    const Count bytes = pl.part_bytes + pl.dpre_bytes;
    if (!bytes.overflow() && bytes.value() == 0) continue;
    const Count need = align_workspace(pl.part_bytes) + pl.dpre_bytes + int64_t(kWorkspaceAlign);
    if (need.overflow() || need.value() > most.value()) most = need;
  }
  return most;
}

}  // namespace shortconv::cuda
