// The CUDA planner (src/cuda/plan.cpp, host code: runs without a GPU and
// without the CUDA backend compiled in).
//
// - The workspace a problem's query returns covers the plan of every device:
//   for any multiprocessor count (1 .. beyond kPlanMaxSms) and every path the
//   problem could take, the plan's partial rows and dpre buffer fit.  (Before,
//   the size came from the querying GPU's SM count, and a size queried on a
//   small GPU was too small on a larger one.)
// - Plans name only instantiated kernels: the window bound is one of the
//   path's instance set (traits.hpp, checked against the launchers' lists in
//   dispatch.cuh), the vector path has more than one channel per thread.
// - The launch geometry covers the work: grid x block tiles every tile and
//   every channel, blocks have the traits' thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/problem.hpp"
#include "core/dtype.hpp"
#include "cuda/plan.hpp"

namespace {

using namespace shortconv;
using namespace shortconv::cuda;

// A present view of `dt` at `data` (the planner reads its alignment, not its contents).
View view3(void* data, sc_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t s0, int64_t s1,
           int64_t s2) {
  View v;
  v.present = true;
  v.data = data;
  v.dtype = dt;
  v.shape[0] = n0;
  v.shape[1] = n1;
  v.shape[2] = n2;
  v.stride[0] = s0;
  v.stride[1] = s1;
  v.stride[2] = s2;
  return v;
}

// A plausible backward problem (pointers only matter for alignment).
Problem problem(std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Problem p;
  p.dir = uni(0, 3) ? Dir::bwd : Dir::fwd;
  p.W = int(uni(0, 5) ? uni(1, 8) : uni(9, 40));
  p.S = p.W - 1 + int(uni(0, 2));
  const sc_dtype dts[4] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  p.act_dtype = dts[uni(0, 3)];
  p.packed = uni(0, 2) == 0;
  p.D = uni(0, 4) ? 8 * uni(1, 1024) : uni(1, 5000);
  if (p.packed) {
    p.B = 1;
    p.T = uni(1, 1 << 17);
    p.N = uni(1, 64);
  } else {
    p.B = uni(1, 16);
    p.T = uni(1, 1 << 14);
    p.N = p.B;
  }
  static char buffer[64] alignas(64);
  auto view = [&](bool token_major) {
    return token_major ? view3(buffer, p.act_dtype, p.B, p.T, p.D, p.T * p.D, p.D, 1)
                       : view3(buffer, p.act_dtype, p.B, p.T, p.D, p.T * p.D, 1, p.T);
  };
  const bool tm = uni(0, 2) != 0;
  p.x = view(tm);
  if (p.dir == Dir::bwd) {
    p.dy = view(tm);
    p.dx = view(tm);
    p.dweight.present = uni(0, 4) != 0;
    p.dbias.present = uni(0, 1) != 0;
  } else {
    p.y = view(tm);
  }
  if (uni(0, 3) == 0) p.exec.tile_t = uni(1, 700);
  if (uni(0, 3) == 0) p.exec.tile_d = uni(1, 300);
  return p;
}

int64_t need(const Plan& pl) {
  const Count bytes = pl.part_bytes + pl.dpre_bytes;
  if (bytes.value() == 0) return 0;
  return (align_workspace(pl.part_bytes) + pl.dpre_bytes + int64_t(kWorkspaceAlign)).value();
}

TEST(CudaPlan, WorkspaceCoversEveryDevice) {
  std::mt19937_64 rng(31);
  const int sm_counts[] = {1, 2, 7, 16, 46, 66, 80, 108, 114, 132, 144, 148, 160, 200, 255, 256};
  for (int i = 0; i < 3000; ++i) {
    const Problem p = problem(rng);
    const Count ws = workspace_bytes(p);  // what the C ABI's query answers
    ASSERT_FALSE(ws.overflow());
    Path cand[kMaxPaths];
    const int n = candidate_paths(p, cand);
    for (int c = 0; c < n; ++c)
      for (int sms : sm_counts) {
        const Plan pl = plan_for(p, cand[c], sms);
        ASSERT_LE(need(pl), ws.value())
            << path_name(cand[c]) << " at " << sms << " SMs needs more than the query's answer "
            << "(B=" << p.B << " T=" << p.T << " D=" << p.D << " W=" << p.W << " dtype "
            << p.act_dtype << " tiles " << p.exec.tile_t << "x" << p.exec.tile_d << ")";
      }
  }
}

TEST(CudaPlan, PlansNameInstantiatedKernelsAndCoverTheWork) {
  std::mt19937_64 rng(32);
  for (int i = 0; i < 3000; ++i) {
    const Problem p = problem(rng);
    Path cand[kMaxPaths];
    const int n = candidate_paths(p, cand);
    ASSERT_GE(n, 1);
    EXPECT_EQ(cand[n - 1] == Path::general, p.W > kMaxFastW);
    bool chosen_is_candidate = false;
    for (int c = 0; c < n; ++c) chosen_is_candidate |= cand[c] == choose_path(p);
    EXPECT_TRUE(chosen_is_candidate);
    for (int c = 0; c < n; ++c) {
      const Plan pl = plan_for(p, cand[c], 132);
      switch (pl.path) {
        case Path::decode:
          EXPECT_TRUE((pl.ch == 1 && pl.wmax == DecodeTraits::kScalarWmax) ||
                      (pl.ch == DecodeTraits::kVecBytes / shortconv::dtype_size(p.act_dtype) &&
                       pl.wmax == DecodeTraits::kVecWmax && p.act_dtype != SC_F64 &&
                       p.W <= DecodeTraits::kVecWmax) ||
                      (pl.ch == DecodeTraits::kWideBytes / shortconv::dtype_size(p.act_dtype) &&
                       pl.wmax == DecodeTraits::kVecWmax && p.act_dtype != SC_F64 &&
                       p.W <= DecodeTraits::kVecWmax && pl.state_io != StateIo::scalar &&
                       !p.parents));
          EXPECT_LE(p.W, kMaxFastW);
          break;
        case Path::token_major_vec:
          EXPECT_EQ(pl.wmax, tm_vec_wmax(shortconv::dtype_size(p.act_dtype)).for_width(p.W));
          EXPECT_NE(pl.wmax, 0);
          EXPECT_GT(pl.ch, 1);
          EXPECT_NE(p.act_dtype, SC_F64);
          break;
        case Path::token_major_scalar:
        case Path::channel_major:
          EXPECT_EQ(pl.wmax, kNarrowWmax.for_width(p.W));
          EXPECT_NE(pl.wmax, 0);
          break;
        case Path::general:
          EXPECT_GT(p.W, kMaxFastW);
          break;
      }
      if (pl.path == Path::token_major_vec && pl.wmax > kTmWideFullOnly)  // (no generic wide instance)
        EXPECT_TRUE(p.dir == Dir::fwd ? pl.full_fwd : pl.full_bwd);
      if (pl.full_fwd) {  // (only the 16-bit vector forward has the instance)
        EXPECT_EQ(pl.path, Path::token_major_vec);
        EXPECT_EQ(p.dir, Dir::fwd);
        EXPECT_LE(pl.ch * shortconv::dtype_size(p.act_dtype), TmTraits::kFullPackBytes);
      }
      if (pl.path == Path::decode) {  // a block per (sequence, kThreads*CH channels)
        EXPECT_EQ(pl.block_x * pl.block_y, DecodeTraits::kThreads);
        EXPECT_EQ(pl.grid_x, p.N);
        EXPECT_GE(pl.grid_y * pl.block_x * pl.ch, p.D);
        EXPECT_EQ(pl.ntiles, p.N);
        continue;
      }
      if (pl.path == Path::channel_major) {
        const int threads = CmTraits::threads(p.dir == Dir::bwd);  // the kernel's __launch_bounds__
        EXPECT_EQ(pl.block_x * pl.block_y, threads);
        EXPECT_GE(pl.grid_x * threads, p.B * p.D * pl.tiles_per_row * CmTraits::kWarp);
        EXPECT_EQ(pl.tile_t % (CmTraits::kWarp * pl.vec), 0);
      } else {
        EXPECT_LE(pl.block_x * pl.block_y, TmTraits::kThreads);
        EXPECT_GE(pl.grid_x * pl.block_y, pl.ntiles);
        EXPECT_GE(pl.grid_y * pl.block_x * pl.ch, p.D);
      }
      EXPECT_GE(pl.tile_t * pl.tiles_per_row, p.T);
      EXPECT_EQ(pl.ntiles, p.B * pl.tiles_per_row);
    }
  }
}

// A dense token-major problem of direction dir over an aligned buffer (the
// planner reads shapes, strides and alignment only): x and y (forward) or x,
// dy and dx (backward), D = 4096, a contiguous [D, W] weight (and its
// gradient in the backward).
Problem dense_tm(Dir dir, sc_dtype dt, int W, sc_activation act, int64_t B, int64_t T) {
  static char buffer[64] alignas(64);
  Problem p;
  p.dir = dir;
  p.W = W;
  p.S = W - 1;
  p.act = act;
  p.act_dtype = p.param_dtype = p.state_dtype = dt;
  p.B = B;
  p.T = T;
  p.D = 4096;
  p.N = p.B;
  const View v = view3(buffer, dt, p.B, p.T, p.D, p.T * p.D, p.D, 1);
  p.x = v;
  if (dir == Dir::fwd) p.y = v;
  else p.dy = p.dx = v;
  const View w = view3(buffer, dt, p.D, W, 1, W, 1, 1);
  p.weight = w;
  if (dir == Dir::bwd) p.dweight = w;
  return p;
}

// The 16-bit full-window SiLU forward (x, and a residual, staged in shared
// memory, its own register cap) is planned exactly for W == the window bound
// and SiLU; its waves are sized with its residency.
TEST(CudaPlan, FullWindowForwardInstance) {
  auto make = [](sc_dtype dt, int W, sc_activation act, bool residual) {
    Problem p = dense_tm(Dir::fwd, dt, W, act, 8, 4096);
    if (residual) p.residual = p.x;
    return p;
  };
  for (sc_dtype dt : {SC_BF16, SC_F16})
    for (int W : {2, 3, 4, 8}) {
      const Plan pl = plan_for(make(dt, W, SC_ACT_SILU, false), Path::token_major_vec, 132);
      EXPECT_TRUE(pl.full_fwd) << "W=" << W;
      EXPECT_TRUE(plan_for(make(dt, W, SC_ACT_SILU, true), Path::token_major_vec, 132).full_fwd) << "W=" << W;
      EXPECT_EQ(pl.smem, 0u);  // (its ring is static)
      // Its tiles are the generic instance's (here: without SiLU) on a
      // device with as many more SMs as it has more resident threads per SM.
      const int full_blocks = TmTraits::full_min_blocks(W), generic_blocks = TmTraits::min_blocks(W, pl.ch);
      ASSERT_EQ(132 * full_blocks % generic_blocks, 0) << "whole SMs";
      const int sms = 132 * full_blocks / generic_blocks;
      const Plan generic = plan_for(make(dt, W, SC_ACT_NONE, false), Path::token_major_vec, sms);
      EXPECT_FALSE(generic.full_fwd);
      EXPECT_EQ(pl.tile_t, generic.tile_t);
      EXPECT_FALSE(plan_for(make(dt, W, SC_ACT_NONE, false), Path::token_major_vec, 132).full_fwd);
    }
  // W below the bound (5..7 take the 8-tap instance), fp32, and the backward: generic.
  EXPECT_FALSE(plan_for(make(SC_BF16, 6, SC_ACT_SILU, false), Path::token_major_vec, 132).full_fwd);
  EXPECT_FALSE(plan_for(make(SC_F32, 4, SC_ACT_SILU, false), Path::token_major_vec, 132).full_fwd);
  Problem b = make(SC_BF16, 4, SC_ACT_SILU, false);
  b.dir = Dir::bwd;
  b.y = View();
  b.dx = b.dy = b.x;
  EXPECT_FALSE(plan_for(b, Path::token_major_vec, 132).full_fwd);
}

// The 16-bit full-window SiLU backward (x and dy staged in shared memory, the
// block's reduction in the same ring: no dynamic shared memory) is planned
// exactly for W == the window bound, SiLU, dx and dy present, dweight or dbias
// wanted, and tiles of at least kBwdFullMinTileT tokens.
TEST(CudaPlan, FullWindowBackwardInstance) {
  auto make = [](sc_dtype dt, int W, sc_activation act) { return dense_tm(Dir::bwd, dt, W, act, 8, 4096); };
  auto generic_smem = [](const Plan& pl, int acc_bytes) {
    return TmTraits::bwd_smem(pl.block_x, pl.block_y, pl.ch, pl.wmax, acc_bytes);
  };
  for (sc_dtype dt : {SC_BF16, SC_F16})
    for (int W : {2, 3, 4, 8}) {
      const Plan pl = plan_for(make(dt, W, SC_ACT_SILU), Path::token_major_vec, 132);
      EXPECT_TRUE(pl.full_bwd) << "W=" << W;
      EXPECT_FALSE(pl.full_fwd);
      EXPECT_EQ(pl.smem, 0u) << "W=" << W;
      // The reduction fits in the ring: kThreads rows of ch * (wmax + 1) fp32.
      EXPECT_LE(generic_smem(pl, 4), TmTraits::kBwdRingBytes);
      const Plan none = plan_for(make(dt, W, SC_ACT_NONE), Path::token_major_vec, 132);
      EXPECT_FALSE(none.full_bwd);
      EXPECT_EQ(none.smem, generic_smem(none, 4));
      Problem no_dw = make(dt, W, SC_ACT_SILU);
      no_dw.dweight = View();
      EXPECT_FALSE(plan_for(no_dw, Path::token_major_vec, 132).full_bwd);
      no_dw.dbias = no_dw.weight;  // (a bias gradient alone takes it too)
      no_dw.dbias.shape[1] = 1;
      EXPECT_TRUE(plan_for(no_dw, Path::token_major_vec, 132).full_bwd);
      Problem no_dx = make(dt, W, SC_ACT_SILU);
      no_dx.dx = View();
      EXPECT_FALSE(plan_for(no_dx, Path::token_major_vec, 132).full_bwd);
      Problem short_tiles = make(dt, W, SC_ACT_SILU);
      short_tiles.exec.tile_t = TmTraits::kBwdFullMinTileT / 2;
      const Plan sp = plan_for(short_tiles, Path::token_major_vec, 132);
      EXPECT_FALSE(sp.full_bwd);
      EXPECT_EQ(sp.smem, generic_smem(sp, 4));
      short_tiles.exec.tile_t = TmTraits::kBwdFullMinTileT;
      EXPECT_TRUE(plan_for(short_tiles, Path::token_major_vec, 132).full_bwd);
    }
  EXPECT_FALSE(plan_for(make(SC_BF16, 6, SC_ACT_SILU), Path::token_major_vec, 132).full_bwd);
  EXPECT_FALSE(plan_for(make(SC_F32, 4, SC_ACT_SILU), Path::token_major_vec, 132).full_bwd);
}

// Window bounds beyond kTmWideFullOnly (W = 16) take the vector path only in
// full-window form (16-bit, W == 16, SiLU; the backward with dx, dy and a
// weight gradient, tiles of at least kBwdFullMinTileT); everything else
// there is the scalar path's.
TEST(CudaPlan, WideWindowsTakeTheVectorPathInFullWindowFormOnly) {
  auto make = [](Dir dir, sc_dtype dt, int W, sc_activation act, int64_t T) {
    return dense_tm(dir, dt, W, act, 2, T);
  };
  for (sc_dtype dt : {SC_BF16, SC_F16})
    for (int64_t T : {int64_t(40), int64_t(4096)}) {  // (40: tiles made long enough)
      const Plan f = plan_for(make(Dir::fwd, dt, 16, SC_ACT_SILU, T), Path::token_major_vec, 132);
      EXPECT_EQ(choose_path(make(Dir::fwd, dt, 16, SC_ACT_SILU, T)), Path::token_major_vec);
      EXPECT_TRUE(f.full_fwd);
      EXPECT_EQ(f.ch, 2);
      const Problem b = make(Dir::bwd, dt, 16, SC_ACT_SILU, T);
      EXPECT_EQ(choose_path(b), Path::token_major_vec);
      const Plan bp = plan_for(b, Path::token_major_vec, 132);
      EXPECT_TRUE(bp.full_bwd) << "T=" << T;
      EXPECT_GE(bp.tile_t, TmTraits::kBwdFullMinTileT);
      EXPECT_EQ(bp.smem, 0u);
      EXPECT_EQ(bp.ch, 2);
      Problem forced = b;
      forced.exec.tile_t = TmTraits::kBwdFullMinTileT;
      EXPECT_EQ(choose_path(forced), Path::token_major_vec);
      forced.exec.tile_t = TmTraits::kBwdFullMinTileT - 1;
      EXPECT_EQ(choose_path(forced), Path::token_major_scalar);
      // no full-window instance: the scalar path
      EXPECT_EQ(choose_path(make(Dir::fwd, dt, 16, SC_ACT_NONE, T)), Path::token_major_scalar);
      EXPECT_EQ(choose_path(make(Dir::bwd, dt, 16, SC_ACT_NONE, T)), Path::token_major_scalar);
      for (int W : {9, 12, 15}) {
        EXPECT_EQ(choose_path(make(Dir::fwd, dt, W, SC_ACT_SILU, T)), Path::token_major_scalar) << W;
        EXPECT_EQ(choose_path(make(Dir::bwd, dt, W, SC_ACT_SILU, T)), Path::token_major_scalar) << W;
      }
      Problem no_dw = b;
      no_dw.dweight = View();
      EXPECT_EQ(choose_path(no_dw), Path::token_major_scalar);
      Problem no_dx = b;
      no_dx.dx = View();
      EXPECT_EQ(choose_path(no_dx), Path::token_major_scalar);
    }
  // A backward axis shorter than the shortest full tile: automatic tiles
  // still take it; a forced tile is clamped to the axis, so not.
  Problem tiny = make(Dir::bwd, SC_BF16, 16, SC_ACT_SILU, 5);
  EXPECT_EQ(choose_path(tiny), Path::token_major_vec);
  EXPECT_TRUE(plan_for(tiny, Path::token_major_vec, 132).full_bwd);
  tiny.exec.tile_t = TmTraits::kBwdFullMinTileT;
  EXPECT_EQ(choose_path(tiny), Path::token_major_scalar);
  EXPECT_EQ(choose_path(make(Dir::fwd, SC_F32, 16, SC_ACT_SILU, 4096)), Path::token_major_scalar);
  EXPECT_EQ(choose_path(make(Dir::bwd, SC_F32, 16, SC_ACT_SILU, 4096)), Path::token_major_scalar);
}

TEST(CudaPlan, ForcedTilesBeyondTheAxisAreTheWholeAxis) {
  std::mt19937_64 rng(33);
  for (int i = 0; i < 200; ++i) {
    Problem p = problem(rng);
    p.exec.tile_t = INT64_MAX;
    p.exec.tile_d = INT64_MAX;
    Path cand[kMaxPaths];
    const int n = candidate_paths(p, cand);
    for (int c = 0; c < n; ++c) {
      const Plan pl = plan_for(p, cand[c], 132);
      EXPECT_EQ(pl.tiles_per_row, 1) << path_name(cand[c]);
      EXPECT_GE(pl.tile_t, p.T);
      EXPECT_FALSE(workspace_need(p, kPlanMaxSms).overflow());
    }
  }
}

// seq_idx (docs/semantics.md section 3): a planned restriction to the token-major
// and general paths (the channel-major kernels own whole rows of one sequence
// and have no walker), and tiles over the flat B*T axis: exactly the plan of
// the equivalent packed batch [1, B*T, D] (so partial sums, and results, are
// those of that batch).
TEST(CudaPlan, SeqIdxPlansAreThoseOfTheEquivalentPackedBatch) {
  std::mt19937_64 rng(34);
  int restricted = 0;
  for (int i = 0; i < 2000; ++i) {
    Problem p = problem(rng);
    if (p.packed) continue;
    Path before[kMaxPaths];
    const int nb = candidate_paths(p, before);
    restricted += std::count(before, before + nb, Path::channel_major) > 0;
    p.seq_idx.present = true;
    p.seq_idx.shape[0] = p.B;
    p.seq_idx.shape[1] = p.T;
    p.N = p.B * p.T;
    Problem q = p;  // the packed batch of the same tokens (the planner reads strides, shapes)
    q.seq_idx = View{};
    q.packed = true;
    q.B = 1;
    q.T = p.B * p.T;
    for (View* v : {&q.x, &q.y, &q.dy, &q.dx}) {
      v->shape[0] = 1;
      v->shape[1] = q.T;
    }
    Path cand[kMaxPaths], qcand[kMaxPaths];
    const int n = candidate_paths(p, cand);
    // The packed batch may also take the decode kernel, which finds its sequences by
    // offsets only (never a seq_idx call's); the other candidates are the same.
    const int qn = candidate_paths(q, qcand);
    const bool q_decode = qn > 0 && qcand[0] == Path::decode;
    ASSERT_EQ(n, qn - q_decode);
    if (q_decode) std::copy(qcand + 1, qcand + qn, qcand);
    EXPECT_EQ(std::count(cand, cand + n, Path::channel_major), 0);
    EXPECT_EQ(std::count(cand, cand + n, Path::decode), 0);
    if (!q_decode) EXPECT_EQ(choose_path(p), choose_path(q));
    EXPECT_EQ(workspace_bytes(p).value(), workspace_bytes(q).value());
    for (int c = 0; c < n; ++c)
      for (int sms : {1, 66, 132, 256}) {
        ASSERT_EQ(cand[c], qcand[c]);
        const Plan a = plan_for(p, cand[c], sms), b = plan_for(q, cand[c], sms);
        EXPECT_EQ(a.axis, p.B * p.T);
        EXPECT_EQ(a.tile_t, b.tile_t);
        EXPECT_EQ(a.tiles_per_row, b.tiles_per_row);
        EXPECT_EQ(a.ntiles, b.ntiles);
        EXPECT_EQ(a.ntiles, a.tiles_per_row);  // one row: the flat axis
        EXPECT_EQ(a.parts, b.parts);
        EXPECT_EQ(a.grid_x, b.grid_x);
        EXPECT_EQ(a.grid_y, b.grid_y);
        EXPECT_EQ(a.block_x * a.block_y, b.block_x * b.block_y);
        EXPECT_EQ(a.smem, b.smem);
      }
  }
  EXPECT_GT(restricted, 100) << "too few problems that the channel-major path would take";
}

}  // namespace

namespace {

// A decode step: x [B, T, D] token-major (or channel-major), a pool [P, D, S]
// of rows contiguous per channel ([P, D, S] strides) or vLLM's channel-
// contiguous rows ([P, S, D] storage), updated in place.
Problem decode_step(int64_t B, int64_t T, int64_t D, int64_t P, int W, int S, sc_dtype dt,
                    bool vllm_pool, bool channel_major_x = false) {
  alignas(64) static char buffer[256];
  Problem p;
  p.dir = Dir::fwd;
  p.W = W;
  p.S = S;
  p.act_dtype = p.param_dtype = p.state_dtype = dt;
  p.B = B;
  p.T = T;
  p.D = D;
  p.N = B;
  p.x = p.y = view3(buffer, dt, B, T, D, T * D, channel_major_x ? 1 : D, channel_major_x ? T : 1);
  p.h0 = p.ht = view3(buffer, dt, P, D, S, D * S, vllm_pool ? 1 : S, vllm_pool ? D : 1);
  p.h0_idx.present = p.ht_idx.present = true;
  p.state_in_place = true;
  return p;
}

TEST(CudaPlan, DecodeStepsTakeTheOneLaunchPath) {
  // bf16, W = 4, one token per sequence, a few sequences: the vector
  // instance, 2 channels (4 bytes) per thread
  Problem p = decode_step(4, 1, 8192, 1024, 4, 3, SC_BF16, false);
  Path cand[kMaxPaths];
  ASSERT_GE(candidate_paths(p, cand), 1);
  EXPECT_EQ(cand[0], Path::decode);
  ASSERT_EQ(choose_path(p), Path::decode);
  Plan pl = plan_for(p, Path::decode, 132);
  EXPECT_EQ(pl.ch, 2);
  EXPECT_EQ(pl.wmax, DecodeTraits::kVecWmax);
  EXPECT_EQ(pl.state_io, StateIo::row_vec);  // [P, D, S] rows: 3 4-byte words per thread
  EXPECT_EQ(pl.smem, DecodeTraits::rowvec_smem(3, 4));
  EXPECT_EQ(pl.grid_x, 4);
  EXPECT_EQ(pl.grid_y, 8192 / (DecodeTraits::kThreads * 2));
  EXPECT_EQ(workspace_bytes(p).value(), 0);

  // vLLM's pools (stride(D) = 1): one word per entry, no shared memory
  pl = plan_for(decode_step(8, 4, 4096, 1024, 4, 6, SC_BF16, true), Path::decode, 132);
  EXPECT_EQ(pl.state_io, StateIo::channel_vec);
  EXPECT_EQ(pl.smem, 0u);

  // Many threads (batch 64 and 256 at D = 8192): the wide instance (16 bytes
  // of x per thread) on either layout of rows, not for a tree, not below
  // kWideMinThreadsPerSm narrow threads per SM
  for (bool vllm_pool : {true, false})
    for (int64_t B : {64, 256}) {
      p = decode_step(B, 1, 8192, 1024, 4, 3, SC_BF16, vllm_pool);
      ASSERT_GE(B * 8192 / 2, DecodeTraits::kWideMinThreadsPerSm * 132);
      pl = plan_for(p, Path::decode, 132);
      EXPECT_EQ(pl.ch, DecodeTraits::kWideBytes / 2);
      EXPECT_EQ(pl.state_io, vllm_pool ? StateIo::channel_vec : StateIo::row_vec);
      EXPECT_EQ(pl.smem, vllm_pool ? 0 : DecodeTraits::rowvec_smem(3, DecodeTraits::kWideBytes));
      EXPECT_EQ(pl.grid_y, 8192 / (DecodeTraits::kThreads * pl.ch));
      Problem spec = p;  // speculative steps: wide on vLLM's rows only
      spec.accepted.present = true;
      EXPECT_EQ(plan_for(spec, Path::decode, 132).ch, vllm_pool ? pl.ch : 2);
      p.parents.present = true;
      EXPECT_EQ(plan_for(p, Path::decode, 132).ch, 2);
    }
  // The wide instance on vLLM rows keeps the taps as the weight's words only for
  // W = kVecWmax, a contiguous [D, W] weight and a [D] bias of x's dtype, 16-byte aligned
  {
    alignas(64) static char params[64];
    auto with_params = [&](int W, sc_dtype param, int64_t w_offset, int64_t bias_stride, bool bias,
                           bool vllm = true, int S = -1, bool accepted = false, int64_t T = 1,
                           bool packed = false, int64_t batch = 256) {
      Problem q = decode_step(batch, T, 8192, 1024, W, S < 0 ? W - 1 : S, SC_BF16, vllm);
      q.accepted.present = accepted;
      q.packed = packed;
      q.param_dtype = param;
      q.weight.present = true;
      q.weight.data = params + w_offset;
      q.weight.dtype = param;
      q.weight.shape[0] = 8192;
      q.weight.shape[1] = W;
      q.weight.stride[0] = W;
      q.weight.stride[1] = 1;
      q.bias.present = bias;
      q.bias.data = params;
      q.bias.dtype = param;
      q.bias.shape[0] = 8192;
      q.bias.stride[0] = bias_stride;
      return plan_for(q, Path::decode, 132);
    };
    EXPECT_TRUE(with_params(4, SC_BF16, 0, 1, true).raw_taps);
    EXPECT_TRUE(with_params(4, SC_BF16, 0, 1, false).raw_taps);
    EXPECT_EQ(with_params(4, SC_BF16, 0, 1, true).ch, DecodeTraits::kWideBytes / 2);
    EXPECT_FALSE(with_params(3, SC_BF16, 0, 1, true).raw_taps);   // padded taps
    EXPECT_FALSE(with_params(4, SC_F32, 0, 1, true).raw_taps);    // another dtype
    EXPECT_FALSE(with_params(4, SC_BF16, 8, 1, true).raw_taps);   // not 16-byte aligned
    EXPECT_FALSE(with_params(4, SC_BF16, 0, 2, true).raw_taps);   // a strided bias
    EXPECT_EQ(with_params(3, SC_BF16, 0, 1, true).ch, DecodeTraits::kWideBytes / 2);  // still wide
    EXPECT_EQ(with_params(4, SC_BF16, 0, 1, true).row_regs, 0);
    // [P, D, S] rows: the wide instance holds the row in registers for S = W-1 or W
    // with raw taps (no shared-memory stage), else stages it (decode.cu)
    for (int S : {3, 4, 5}) {
      const Plan q = with_params(4, SC_BF16, 0, 1, true, false, S);
      EXPECT_EQ(q.ch, DecodeTraits::kWideBytes / 2);
      EXPECT_EQ(q.row_regs, S <= 4 ? S : 0);
      EXPECT_EQ(q.smem, S <= 4 ? 0 : DecodeTraits::rowvec_smem(S, DecodeTraits::kWideBytes));
      EXPECT_FALSE(q.raw_taps);  // (raw_taps names the vLLM rows' instance)
    }
    EXPECT_EQ(with_params(4, SC_F32, 0, 1, true, false, 3).row_regs, 0);
    EXPECT_EQ(with_params(3, SC_BF16, 0, 1, true, false, 2).row_regs, 0);
    // Speculative steps on [P, D, S] rows: held in registers by the wide
    // instance for S = (W-1) + K, K = 1 .. kSpecRowsMaxDrafts, with raw taps,
    // for a dense step of 1+K tokens; else the narrow staged instance (S = W-1
    // holds no draft; fewer tokens, or a packed step, keep entries of the row)
    const int H = DecodeTraits::kVecWmax - 1;
    for (int S = H; S <= H + DecodeTraits::kSpecRowsMaxDrafts + 1; ++S) {
      const bool regs = S > H && S <= H + DecodeTraits::kSpecRowsMaxDrafts;
      const int64_t T = S - H + 1;
      const Plan q = with_params(4, SC_BF16, 0, 1, true, false, S, true, T);
      if (regs && T > 2) {  // fewer tokens than the row's drafts take
        EXPECT_EQ(with_params(4, SC_BF16, 0, 1, true, false, S, true, T - 1).row_regs, 0) << "S=" << S;
        EXPECT_EQ(with_params(4, SC_BF16, 0, 1, true, false, S, true, T, true).row_regs, 0) << "S=" << S;
      }
      EXPECT_EQ(q.row_regs, regs ? S : 0) << "S=" << S;
      EXPECT_EQ(q.ch, regs ? DecodeTraits::kWideBytes / 2 : DecodeTraits::kVecBytes / 2) << "S=" << S;
      EXPECT_EQ(q.smem, regs ? 0 : DecodeTraits::rowvec_smem(S, DecodeTraits::kVecBytes)) << "S=" << S;
      EXPECT_EQ(with_params(4, SC_F32, 0, 1, true, false, S, true, T).row_regs, 0) << "S=" << S;  // no raw taps
    }
    // Steps too small for the wide instance hold the row in registers too (the
    // narrow instance: a thread's CH x S block is S 4-byte words), one token on
    // rows of W-1 or W entries and speculative 1+K tokens, under the same conditions
    ASSERT_LT(8 * 8192 / 2, DecodeTraits::kWideMinThreadsPerSm * 132);
    for (int S = H; S <= H + DecodeTraits::kSpecRowsMaxDrafts + 1; ++S) {
      const Plan one = with_params(4, SC_BF16, 0, 1, true, false, S, false, 1, false, 8);
      EXPECT_EQ(one.ch, DecodeTraits::kVecBytes / 2) << "S=" << S;
      EXPECT_EQ(one.row_regs, S <= H + 1 ? S : 0) << "S=" << S;
      EXPECT_EQ(one.smem, S <= H + 1 ? 0 : DecodeTraits::rowvec_smem(S, DecodeTraits::kVecBytes)) << "S=" << S;
      const bool regs = S > H && S <= H + DecodeTraits::kSpecRowsMaxDrafts;
      const int64_t T = S - H + 1;
      const Plan spec = with_params(4, SC_BF16, 0, 1, true, false, S, true, T, false, 8);
      EXPECT_EQ(spec.ch, DecodeTraits::kVecBytes / 2) << "S=" << S;
      EXPECT_EQ(spec.row_regs, regs ? S : 0) << "S=" << S;
      EXPECT_EQ(with_params(4, SC_BF16, 0, 1, true, false, S, true, T, true, 8).row_regs, 0) << "S=" << S;  // packed
    }
    EXPECT_EQ(with_params(4, SC_BF16, 8, 1, true, false, 3, false, 1, false, 8).row_regs, 0);  // taps not aligned
  }
  ASSERT_LT(8 * 4096 / 2, DecodeTraits::kWideMinThreadsPerSm * 132);
  EXPECT_EQ(plan_for(decode_step(8, 1, 4096, 1024, 4, 3, SC_BF16, true), Path::decode, 132).ch, 2);
  EXPECT_EQ(plan_for(decode_step(256, 1, 8192, 1024, 4, 3, SC_F32, true), Path::decode, 132).ch, 4);

  // fp32: the vector instance with 1 channel per thread; rows longer than kRowVecMaxS,
  // other state dtypes and ring rows: element by element; an odd D of bf16: scalar
  pl = plan_for(decode_step(8, 1, 4096, 64, 4, 3, SC_F32, false), Path::decode, 132);
  EXPECT_EQ(pl.ch, 1);
  EXPECT_EQ(pl.wmax, DecodeTraits::kVecWmax);
  EXPECT_EQ(pl.state_io, StateIo::row_vec);
  pl = plan_for(decode_step(8, 1, 4095, 64, 4, 3, SC_BF16, false), Path::decode, 132);
  EXPECT_EQ(pl.ch, 1);
  EXPECT_EQ(pl.wmax, DecodeTraits::kScalarWmax);
  p = decode_step(8, 1, 4096, 64, 4, DecodeTraits::kRowVecMaxS + 1, SC_BF16, false);
  EXPECT_EQ(plan_for(p, Path::decode, 132).state_io, StateIo::scalar);
  p = decode_step(8, 1, 4096, 64, 4, 3, SC_BF16, true);
  p.state_dtype = p.h0.dtype = p.ht.dtype = SC_F32;
  EXPECT_EQ(plan_for(p, Path::decode, 132).state_io, StateIo::scalar);
  p = decode_step(8, 1, 4096, 64, 4, 3, SC_BF16, true);
  p.ring.present = true;
  EXPECT_EQ(plan_for(p, Path::decode, 132).state_io, StateIo::scalar);

  // the scalar instance: channel-major x, fp64, W 5..16
  for (const Problem& q : {decode_step(8, 2, 4096, 64, 4, 3, SC_BF16, false, true),
                           decode_step(8, 1, 4096, 64, 4, 3, SC_F64, false),
                           decode_step(8, 1, 4096, 64, 9, 8, SC_BF16, false)}) {
    ASSERT_EQ(choose_path(q), Path::decode);
    pl = plan_for(q, Path::decode, 132);
    EXPECT_EQ(pl.ch, 1);
    EXPECT_EQ(pl.wmax, DecodeTraits::kScalarWmax);
    EXPECT_EQ(pl.state_io, StateIo::scalar);
  }
}

// The plain step (fwd_decode_plain, per row layout and row-index dtype: vLLM
// rows of W-1 entries, [P, D, S] rows of W-1 or W entries): raw taps, one
// token per sequence of a dense batch, row indices of one dtype, none of the
// ring offsets, block tables, has_initial_state flags, accepted counts or
// parents; every other step keeps the generic instance.
// A bf16 decode step (W = 4, D = 8192, a pool of 1024 rows of S entries) whose
// weight is raw taps: [D, W] contiguous, 64-byte aligned, of dtype `param`.
Problem raw_taps_step(int64_t B, int64_t T, bool vllm, sc_dtype param = SC_BF16, int S = 3) {
  alignas(64) static char params[64];
  Problem q = decode_step(B, T, 8192, 1024, 4, S, SC_BF16, vllm);
  q.param_dtype = param;
  q.weight.present = true;
  q.weight.data = params;
  q.weight.dtype = param;
  q.weight.shape[0] = 8192;
  q.weight.shape[1] = 4;
  q.weight.stride[0] = 4;
  q.weight.stride[1] = 1;
  return q;
}

TEST(CudaPlan, PlainDecodeStep) {
  auto step = [](int64_t B, int64_t T, bool vllm, sc_dtype param = SC_BF16) {
    return raw_taps_step(B, T, vllm, param);
  };
  for (int64_t B : {1, 8, 64, 256}) {
    const Plan pl = plan_for(step(B, 1, true), Path::decode, 132);
    EXPECT_TRUE(pl.plain_step) << "batch " << B;
    EXPECT_TRUE(pl.raw_taps);
    EXPECT_EQ(pl.row_regs, 0);
    EXPECT_FALSE(plan_for(step(B, 2, true), Path::decode, 132).plain_step) << "two tokens";
    const Plan rows = plan_for(step(B, 1, false), Path::decode, 132);
    EXPECT_TRUE(rows.plain_step) << "[P, D, S] rows of W-1 entries";
    EXPECT_EQ(rows.row_regs, 3);
    EXPECT_FALSE(plan_for(step(B, 1, true, SC_F32), Path::decode, 132).plain_step) << "no raw taps";
    // fwd_decode_plain's instances: the row layout (vLLM rows of W-1 entries,
    // [P, D, S] rows in registers), the row indices' dtype
    for (const sc_dtype I : {SC_I32, SC_I64}) {
      for (bool vllm : {true, false}) {
        Problem q = step(B, 1, vllm);
        q.h0_idx.dtype = q.ht_idx.dtype = I;
        const Plan o = plan_for(q, Path::decode, 132);
        EXPECT_TRUE(o.plain_step);
        EXPECT_EQ(o.plain_index, I);
        q.ht_idx.dtype = I == SC_I32 ? SC_I64 : SC_I32;  // two dtypes: the generic linear kernels
        EXPECT_FALSE(plan_for(q, Path::decode, 132).plain_step) << "index dtypes differ";
        q.ht_idx.dtype = I;
        q.ht_idx.present = false;  // one index tensor: its dtype
        EXPECT_EQ(plan_for(q, Path::decode, 132).plain_index, I);
        q.h0_idx.present = false;  // none: rows n
        EXPECT_TRUE(plan_for(q, Path::decode, 132).plain_step);
      }
    }
    for (int S : {4, 7}) {  // vLLM rows longer than W-1: fwd_decode_linear (waits first under overlap)
      Problem q = decode_step(B, 1, 8192, 1024, 4, S, SC_BF16, true);
      q.weight = step(B, 1, true).weight;
      q.exec.overlap = SC_OVERLAP_READS;
      const Plan o = plan_for(q, Path::decode, 132);
      EXPECT_TRUE(o.raw_taps) << "S = " << S;
      EXPECT_FALSE(o.plain_step) << "S = " << S;
      EXPECT_EQ(o.overlap, SC_OVERLAP_LAUNCH) << "S = " << S;
    }
    // exec.overlap: the plain step's instances take the mode asked for; the other
    // steps on vLLM rows with raw taps wait first (launch); every other kernel,
    // and every other path, launches as usual
    EXPECT_EQ(pl.overlap, SC_OVERLAP_NONE);
    for (bool vllm : {true, false}) {
      const char* rows_name = vllm ? "vLLM rows" : "[P, D, S] rows";
      for (int mode : {int(SC_OVERLAP_LAUNCH), int(SC_OVERLAP_READS)}) {
        Problem q = step(B, 1, vllm);
        q.exec.overlap = mode;
        const Plan o = plan_for(q, Path::decode, 132);
        EXPECT_TRUE(o.plain_step);
        EXPECT_EQ(o.overlap, mode) << rows_name;
        q = step(B, 2, vllm);  // two tokens: not a plain step
        q.exec.overlap = mode;
        EXPECT_EQ(plan_for(q, Path::decode, 132).overlap, vllm ? SC_OVERLAP_LAUNCH : SC_OVERLAP_NONE)
            << "two tokens, " << rows_name;
        q = step(B, 1, vllm);
        q.exec.overlap = mode;
        q.has_h0.present = true;  // flags: not a plain step
        EXPECT_EQ(plan_for(q, Path::decode, 132).overlap, vllm ? SC_OVERLAP_LAUNCH : SC_OVERLAP_NONE)
            << "flags, " << rows_name;
        q.has_h0.present = false;
        q.parents.present = true;  // a tree: decode.cu's kernel
        EXPECT_EQ(plan_for(q, Path::decode, 132).overlap, SC_OVERLAP_NONE) << "tree, " << rows_name;
        q = step(B, DecodeTraits::kMaxTokens + 1, vllm);  // a prefill: the tiled paths
        q.exec.overlap = mode;
        ASSERT_NE(choose_path(q), Path::decode);
        EXPECT_EQ(plan_for(q, choose_path(q), 132).overlap, SC_OVERLAP_NONE) << "prefill";
      }
    }
    for (int extra = 0; extra < 12; ++extra) {
      Problem q = step(B, 1, extra < 6);  // vLLM rows, then [P, D, S] rows
      const char* what = "";
      switch (extra % 6) {
        case 0: q.has_h0.present = true; what = "has_initial_state"; break;
        case 1: q.ring.present = true; what = "ring offsets"; break;
        case 2: q.table.present = true; what = "block tables"; break;
        case 3: q.accepted.present = true; what = "accepted counts"; break;
        case 4: q.parents.present = true; what = "parents"; break;
        default: q.packed = true; what = "packed"; break;
      }
      EXPECT_FALSE(plan_for(q, Path::decode, 132).plain_step)
          << what << ", batch " << B << (extra < 6 ? ", vLLM rows" : ", [P, D, S] rows");
    }
  }
}

// zero_padded_outputs: the plain step zeroes padded outputs in its own kernel
// (one launch); every other plan leaves them to zero_padded_y after its kernel.
TEST(CudaPlan, ZeroPaddedOutputsFusedInThePlainStepOnly) {
  for (bool vllm : {true, false})
    for (int64_t T : {1, 2}) {
      Problem q = raw_taps_step(8, T, vllm);
      EXPECT_FALSE(plan_for(q, Path::decode, 132).zero_pads_fused) << "flag off";
      q.zero_pads = true;
      const Plan pl = plan_for(q, Path::decode, 132);
      EXPECT_EQ(pl.zero_pads_fused, T == 1) << (vllm ? "vLLM rows" : "[P, D, S] rows") << ", T " << T;
      EXPECT_EQ(pl.zero_pads_fused, pl.plain_step);
      q.ring.present = true;  // rings: another kernel, the second pass
      EXPECT_FALSE(plan_for(q, Path::decode, 132).zero_pads_fused);
    }
}

// The speculative step (fwd_decode_spec, per row layout and index dtype): raw
// taps, accepted counts, a dense batch, index tensors (the accepted counts
// among them) of one dtype, none of the ring offsets, block tables, flags or
// parents; on vLLM rows 1 .. kSpecMaxTokens tokens per sequence on rows of at
// least (W-2) + T entries, on [P, D, S] rows K + 1 tokens on rows of (W-1) + K
// entries held in registers; it takes the overlap mode asked for.  Every
// other speculative step keeps its kernel (fwd_decode_linear on vLLM rows,
// which waits first under overlap; the staged rows).
TEST(CudaPlan, SpecDecodeStep) {
  const int W = 4, most = DecodeTraits::kSpecMaxTokens;
  auto step = [&](int64_t B, int64_t T, int S, bool vllm = true, sc_dtype I = SC_I32) {
    Problem q = raw_taps_step(B, T, vllm, SC_BF16, S);
    q.accepted.present = true;
    q.h0_idx.dtype = q.ht_idx.dtype = q.accepted.dtype = I;
    return q;
  };
  for (int64_t B : {1, 8, 64, 256})
    for (int64_t T = 1; T <= most; ++T)
      for (const sc_dtype I : {SC_I32, SC_I64}) {
        const std::string at = "batch " + std::to_string(B) + ", T = " + std::to_string(T);
        const int S = std::max(W - 1, W - 2 + int(T));
        const Plan pl = plan_for(step(B, T, S, true, I), Path::decode, 132);
        EXPECT_TRUE(pl.spec_step) << at;
        EXPECT_FALSE(pl.plain_step) << at;
        EXPECT_EQ(pl.plain_index, I) << at;
        EXPECT_EQ(pl.overlap, SC_OVERLAP_NONE) << at;
        EXPECT_TRUE(plan_for(step(B, T, S + 3, true, I), Path::decode, 132).spec_step) << "longer rows, " << at;
        if (S > W - 1)  // rows too short for the step's new entries (the host rejects it)
          EXPECT_FALSE(plan_for(step(B, T, S - 1, true, I), Path::decode, 132).spec_step) << at;
        // [P, D, S] rows: held in registers, rows of (W-1) + K entries stepped K + 1 tokens
        const Plan rows = plan_for(step(B, T, S, false, I), Path::decode, 132);
        EXPECT_EQ(rows.spec_step, T >= 2) << "[P, D, S] rows, " << at;
        if (T >= 2) {
          EXPECT_EQ(rows.row_regs, S) << at;
          EXPECT_EQ(rows.plain_index, I) << at;
        }
        EXPECT_FALSE(plan_for(step(B, T, S + 1, false, I), Path::decode, 132).spec_step)
            << "[P, D, S] rows longer than the step's, " << at;
        for (int mode : {int(SC_OVERLAP_LAUNCH), int(SC_OVERLAP_READS)}) {
          Problem q = step(B, T, S, true, I);
          q.exec.overlap = mode;
          EXPECT_EQ(plan_for(q, Path::decode, 132).overlap, mode) << at;
        }
        // one dtype among the index tensors: the accepted counts' counts too
        Problem q = step(B, T, S, true, I);
        q.accepted.dtype = I == SC_I32 ? SC_I64 : SC_I32;
        EXPECT_FALSE(plan_for(q, Path::decode, 132).spec_step) << "accepted counts' dtype differs, " << at;
        q.exec.overlap = SC_OVERLAP_READS;  // fwd_decode_linear: waits first
        EXPECT_EQ(plan_for(q, Path::decode, 132).overlap, SC_OVERLAP_LAUNCH) << at;
        q.h0_idx.present = q.ht_idx.present = false;  // the accepted counts alone: their dtype
        const Plan o = plan_for(q, Path::decode, 132);
        EXPECT_TRUE(o.spec_step) << "rows n, " << at;
        EXPECT_EQ(o.plain_index, q.accepted.dtype) << at;
        for (int extra = 0; extra < 5; ++extra) {
          Problem e = step(B, T, S, true, I);
          const char* what = "";
          switch (extra) {
            case 0: e.has_h0.present = true; what = "has_initial_state"; break;
            case 1: e.ring.present = true; what = "ring offsets"; break;
            case 2: e.table.present = true; what = "block tables"; break;
            case 3: e.parents.present = true; what = "parents"; break;
            default: e.packed = true; what = "packed"; break;
          }
          EXPECT_FALSE(plan_for(e, Path::decode, 132).spec_step) << what << ", " << at;
        }
      }
  // more tokens than the kernel's unrolled loop: fwd_decode_linear
  EXPECT_FALSE(plan_for(step(8, most + 1, W - 2 + most + 1), Path::decode, 132).spec_step);
  // fp32 weights (no raw taps)
  Problem q = step(8, 4, 6);
  q.param_dtype = q.weight.dtype = SC_F32;
  EXPECT_FALSE(plan_for(q, Path::decode, 132).spec_step);
}

TEST(CudaPlan, DecodeEligibility) {
  const int64_t most = DecodeTraits::kMaxTokens;
  Problem p = decode_step(8, most, 1024, 64, 4, 3, SC_BF16, false);
  EXPECT_EQ(choose_path(p), Path::decode);
  p = decode_step(8, most + 1, 1024, 64, 4, 3, SC_BF16, false);  // a prefill: the tiled paths
  EXPECT_NE(choose_path(p), Path::decode);
  p.packed = true;  // packed: at most kMaxTokens per sequence on average
  p.B = 1;
  p.N = 4;
  p.T = 4 * most;
  EXPECT_EQ(choose_path(p), Path::decode);
  p.T = 4 * most + 1;
  EXPECT_NE(choose_path(p), Path::decode);
  p = decode_step(8, 1, 1024, 64, kMaxFastW + 1, kMaxFastW, SC_BF16, false);
  EXPECT_EQ(choose_path(p), Path::general);
  p = decode_step(8, 1, 1024, 64, 4, 3, SC_BF16, false);
  p.exec.tile_t = 1;  // forced time tiles: the tiled paths (the sweeps force them)
  EXPECT_NE(choose_path(p), Path::decode);
  p.dir = Dir::bwd;
  EXPECT_NE(choose_path(p), Path::decode);
  // block tables: still a decode step; prefix-caching snapshots: state_fwd's (tiled paths)
  p = decode_step(8, 1, 1024, 64, 4, 3, SC_BF16, false);
  p.table.present = p.init_blk.present = p.final_blk.present = true;
  EXPECT_EQ(choose_path(p), Path::decode);
  p.block_size = 16;
  p.first_blk.present = p.computed.present = true;
  EXPECT_NE(choose_path(p), Path::decode);

  // serving steps take the decode kernel and nothing else, forced tiles or not,
  // any length; none at all beyond kMaxFastW (the backend refuses them)
  for (int which = 0; which < 2; ++which) {
    p = decode_step(8, 3 * most, 1024, 64, 4, 3 * most + 2, SC_BF16, true);
    p.exec.tile_t = 2;
    (which ? p.parents : p.accepted).present = true;
    EXPECT_TRUE(serving_step(p));
    Path cand[kMaxPaths];
    ASSERT_EQ(candidate_paths(p, cand), 1);
    EXPECT_EQ(cand[0], Path::decode);
    p.W = kMaxFastW + 1;
    EXPECT_EQ(candidate_paths(p, cand), 0);
  }
}

TEST(CudaPlan, DecodePlansDoNotDependOnThePoolSize) {
  for (bool vllm_pool : {false, true})
    for (sc_dtype dt : {SC_BF16, SC_F32, SC_F16}) {
      const Plan a = plan_for(decode_step(256, 4, 8192, 256, 4, 6, dt, vllm_pool), Path::decode, 132);
      const Plan b = plan_for(decode_step(256, 4, 8192, int64_t(1) << 24, 4, 6, dt, vllm_pool),
                              Path::decode, 132);
      EXPECT_EQ(a.grid_x, b.grid_x);
      EXPECT_EQ(a.grid_y, b.grid_y);
      EXPECT_EQ(a.smem, b.smem);
      EXPECT_EQ(a.state_io, b.state_io);
      EXPECT_EQ(a.ch, b.ch);
    }
}

}  // namespace
