// The CUDA backend's entry points (shortconv::cuda::workspace / run):
// choose the kernel path and tiling from the Problem and the device's SM
// count, lay out the caller's workspace, launch on the caller's stream.
//
// Contract kept here: no host-device synchronisation (only attribute queries),
// no device allocation (scratch = exec.workspace, its size a function of the
// shapes, dtypes and forced tiles only: planned for kPlanMaxSms (traits.hpp), the
// most partial rows any device's plan can need), every launch on exec.stream,
// launch errors reported as SC_ERR_BACKEND naming the kernel.
//
// Paths and plans: plan.hpp / plan.cpp (host code); kernel shapes: traits.hpp;
// run-time -> template dispatch: dispatch.cuh.  Paths: token-major vectorised (channel axis contiguous and
// 16-byte aligned), channel-major (time axis contiguous, dense), token-major
// scalar (any strides), general (W > 16).
#include <algorithm>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "cuda/dispatch.cuh"
#include "cuda/plan.hpp"

namespace shortconv::cuda {

namespace {

constexpr int kFallbackSms = 132;  // H200; used only when no device answers

// The current device's multiprocessor count (an attribute query: no
// synchronisation), capped at kPlanMaxSms (plan.hpp: the workspace's bound).
int plan_sms() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // clear the query's own error
    n = kFallbackSms;
  }
  return std::min(n, kPlanMaxSms);
}

DTensor dt(const View& v) {
  DTensor t;
  if (!v.present) return t;
  t.p = v.data;
  t.dt = v.dtype;
  t.n0 = v.shape[0];
  t.s0 = v.stride[0];
  t.s1 = v.stride[1];
  t.s2 = v.stride[2];
  return t;
}

}  // namespace

Args make_args(const Problem& p, const Plan& pl, void* workspace) {
  Args a{};
  a.W = p.W;
  a.S = p.S;
  a.act = p.act;
  a.B = p.B;
  a.T = p.T;
  a.D = p.D;
  a.N = p.N;
  a.packed = p.packed;
  a.x = dt(p.x);
  a.weight = dt(p.weight);
  a.bias = dt(p.bias);
  a.residual = dt(p.residual);
  a.cu = dt(p.cu_seqlens);
  a.h0 = dt(p.h0);
  a.h0_idx = dt(p.h0_idx);
  a.y = dt(p.y);
  a.ht = dt(p.ht);
  a.ht_idx = dt(p.ht_idx);
  a.dy = dt(p.dy);
  a.dht = dt(p.dht);
  a.dx = dt(p.dx);
  a.dweight = dt(p.dweight);
  a.dbias = dt(p.dbias);
  a.dh0 = dt(p.dh0);
  a.has_h0 = dt(p.has_h0);
  a.ring = dt(p.ring);
  a.pad_index = p.pad_index;
  a.accepted = dt(p.accepted);
  a.parents = dt(p.parents);
  a.parent_cols = p.parents ? p.parents.shape[1] : 0;
  a.table = dt(p.table);
  a.init_blk = dt(p.init_blk);
  a.final_blk = dt(p.final_blk);
  a.first_blk = dt(p.first_blk);
  a.computed = dt(p.computed);
  a.table_cols = p.table ? p.table.shape[1] : 0;
  a.block_size = p.block_size;
  a.zero_pads = p.zero_pads && pl.zero_pads_fused;  // (read by the fused kernel only)
  a.state_io = int(pl.state_io);
  a.sid = dt(p.seq_idx);
  a.axis = pl.axis;
  // seq_idx: the walker resolves run ends up to the backward's look-ahead
  // (WMAX-1 taps on the register-window paths, W-1 on the general one) and,
  // with dfinal_state, S tokens past a tile (the last S tokens take dht).
  if (p.dir == Dir::bwd) {
    const int64_t look = pl.wmax > 0 ? pl.wmax - 1 : p.W - 1;
    a.ahead = p.dht && p.S > look ? p.S : look;
  }
  a.tile_t = pl.tile_t;
  a.tiles_per_row = pl.tiles_per_row;
  a.ntiles = pl.ntiles;
  uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  base = (base + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  a.part = pl.part_bytes.value() ? reinterpret_cast<void*>(base) : nullptr;
  a.dpre = pl.dpre_bytes.value()
               ? reinterpret_cast<void*>(base + align_workspace(pl.part_bytes).bytes())
               : nullptr;
  return a;
}

sc_status workspace(const Problem& p, size_t* bytes, sc_error* err) {
  const Count need = workspace_bytes(p);
  if (need.overflow()) return workspace_too_large(p, err);
  *bytes = need.bytes();
  return SC_OK;
}

sc_status run(const Problem& p, sc_error* err) {
  if (serving_step(p) && p.W > kMaxFastW)
    return fail(err, SC_ERR_UNSUPPORTED,
                "%s: the cuda backend runs serving steps (num_accepted, parent_tokens) for "
                "W <= %d, got W = %d", p.accepted ? "num_accepted" : "parent_tokens", kMaxFastW,
                p.W);
  const Path path = choose_path(p);
  const Plan pl = plan_for(p, path, plan_sms());
  if (pl.grid_x > kMaxGridX || pl.grid_y > kMaxGridY)
    return fail(err, SC_ERR_UNSUPPORTED,
                "cuda backend: shape [B=%lld, T=%lld, D=%lld] needs a grid of %lld x %lld blocks "
                "on the %s path, beyond the device limits (tiles: raise exec.tile_t / "
                "exec.tile_d)",
                (long long)p.B, (long long)p.T, (long long)p.D, (long long)pl.grid_x,
                (long long)pl.grid_y, path_name(path));
  const Args a = make_args(p, pl, p.exec.workspace);
  Launch l{static_cast<cudaStream_t>(p.exec.stream)};
  l.overlap = pl.overlap != SC_OVERLAP_NONE;
  cudaError_t e = p.dir == Dir::fwd ? launch_fwd(p, pl, a, &l) : launch_bwd(p, pl, a, &l);
  // zero_padded_outputs where the forward's kernel does not zero them itself: a
  // second kernel, in stream order after it (never overlapped: it waits for y)
  if (e == cudaSuccess && !l.missing && p.dir == Dir::fwd && p.zero_pads && p.y &&
      !pl.zero_pads_fused) {
    l.overlap = false;
    e = launch_zero_padded_y(p, a, &l);
  }
  if (l.missing)
    return fail(err, SC_ERR_BACKEND,
                "cuda backend: the %s path planned %s with window bound %d for %s activations, "
                "and this build has no such kernel instance",
                path_name(path), l.kernel, pl.wmax, dtype_name(p.act_dtype));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // the launch error is reported here, not left pending
    return fail(err, SC_ERR_BACKEND, "cuda backend: launching kernel %s failed: %s (%s)",
                l.kernel, cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return SC_OK;
}

}  // namespace shortconv::cuda
