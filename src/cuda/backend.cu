// The CUDA backend's entry points (shortconv::cuda::workspace / run):
// choose the kernel path and tiling from the Problem and the device's SM
// count, lay out the caller's workspace, launch on the caller's stream.
//
// Contract kept here: no host-device synchronisation (only attribute queries),
// no device allocation (scratch = exec.workspace, its size a function of the
// shapes, dtypes and forced tiles only: planned for Policy::kPlanMaxSms, the
// most partial rows any device's plan can need), every launch on exec.stream,
// launch errors reported as SC_ERR_BACKEND naming the kernel.
//
// Paths (plan.hpp): token-major vectorised (channel axis contiguous and
// 16-byte aligned), channel-major (time axis contiguous, dense), token-major
// scalar (any strides), general (W > 16).
#include <algorithm>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "cuda/plan.hpp"

namespace shortconv::cuda {

namespace {

constexpr int kFallbackSms = 132;  // H200; used only when no device answers (size queries)
constexpr size_t kAlign = 256;     // workspace sub-buffer alignment

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

Count align_up(Count v) { return round_up(v, int64_t(kAlign)); }

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

bool tm_vec_ok(const Problem& p) {
  if (p.act_dtype == SC_F64) return false;  // fp64 is correct, not fast: scalar path
  const int es = dtype_size(p.act_dtype);
  const int ch = tm_ch(es, wmax_for(p.W), p.dir == Dir::bwd);
  if (ch == 1 || p.D % ch != 0) return false;
  return all_act(p, [&](const View& v) {
    return (v.stride[2] == 1 || v.shape[2] == 1) && v.stride[0] % ch == 0 &&
           v.stride[1] % ch == 0 && aligned(v.data, int64_t(ch) * es);
  });
}

bool cm_ok(const Problem& p) {
  if (p.packed || p.act_dtype == SC_F64) return false;
  const int es = dtype_size(p.act_dtype);
  const int vec = 16 / es;
  if (p.T % vec != 0) return false;
  return all_act(p, [&](const View& v) {
    return v.stride[1] == 1 && v.stride[0] % vec == 0 && v.stride[2] % vec == 0 &&
           aligned(v.data, 16);
  });
}

}  // namespace

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // clear the query's own error
    return kFallbackSms;
  }
  return n;
}

Path choose_path(const Problem& p) {
  if (p.W > Policy::kMaxFastW) return Path::general;
  if (tm_vec_ok(p)) return Path::token_major_vec;
  if (cm_ok(p)) return Path::channel_major;
  return Path::token_major_scalar;
}

Plan plan_for(const Problem& p, Path path, int sms) {
  Plan pl;
  pl.path = path;
  const bool bwd = p.dir == Dir::bwd;
  const int es = dtype_size(p.act_dtype);
  const int64_t target = int64_t(sms) * Policy::kResidentThreads;  // threads for one full wave
  if (path == Path::channel_major) {
    pl.ch = 16 / es;
    const int64_t chunk = 32 * int64_t(pl.ch);  // tokens a warp covers per step
    int64_t tile;
    if (p.exec.tile_t > 0) {
      tile = ceil_div(clamp_tile(p.exec.tile_t, p.T), chunk) * chunk;
    } else {  // several chunks per warp (set-up amortised, fewer partial rows), >= one wave
      const int64_t warps = p.B * p.D * ceil_div(p.T, chunk);
      const int64_t iters = std::clamp<int64_t>(warps * 32 / std::max<int64_t>(target, 1), 1,
                                                Policy::kCmMaxIters);
      tile = chunk * iters;
    }
    pl.tile_t = tile;
    pl.tiles_per_row = ceil_div(p.T, tile);
    pl.ntiles = p.B * pl.tiles_per_row;
    pl.parts = pl.ntiles;
  } else {
    pl.ch = path == Path::token_major_vec ? tm_ch(es, wmax_for(p.W), bwd) : 1;
    const int64_t cols = ceil_div(p.D, pl.ch);
    if (p.exec.tile_d > 0)
      pl.cx = int(std::clamp<int64_t>(ceil_div(p.exec.tile_d, pl.ch), 1, Policy::kThreads));
    else
      pl.cx = int(std::min<int64_t>(32, pow2_ceil(std::max<int64_t>(cols, 1))));
    pl.ty = std::max(1, Policy::kThreads / pl.cx);
    if (p.exec.tile_t > 0) {
      pl.tile_t = clamp_tile(p.exec.tile_t, p.T);
    } else {
      const int64_t work = p.B * p.T * cols;  // thread-tokens
      const int64_t per_thread = ceil_div(work, std::max<int64_t>(target, 1));
      if (bwd || pow2_ceil(per_thread) <= Policy::kMaxTileT) {  // one wave, or longest tiles
        pl.tile_t = std::clamp<int64_t>(pow2_ceil(per_thread), Policy::kMinTileT,
                                        Policy::kMaxTileT);
      } else {  // forward, several waves: at least kMinWaves (the last wave's tail is a
                // smaller share; the backward measured slower with the shorter tiles)
        pl.tile_t = std::clamp<int64_t>(pow2_floor(per_thread / Policy::kMinWaves),
                                        Policy::kMinTileT, Policy::kMaxTileT);
      }
    }
    pl.tiles_per_row = ceil_div(p.T, pl.tile_t);
    pl.ntiles = p.B * pl.tiles_per_row;
    pl.parts = path == Path::general ? pl.ntiles : ceil_div(pl.ntiles, pl.ty);
  }
  const bool want_dw = bwd && (p.dweight || p.dbias);
  const int64_t acc = p.act_dtype == SC_F64 ? 8 : 4;
  pl.part_bytes = want_dw ? Count(pl.parts) * p.D * (p.W + 1) * acc : Count(0);
  pl.dpre_bytes = (bwd && path == Path::general) ? Count(p.B * p.T) * p.D * acc : Count(0);
  return pl;
}

// The most any eligible path can use: a function of shapes, dtypes, forced
// tiles and SM count only (not of strides or pointer alignment).
Count workspace_need(const Problem& p, int sms) {
  if (p.dir == Dir::fwd) return 0;
  Count most = 0;
  auto consider = [&](Path path) {
    const Plan pl = plan_for(p, path, sms);
    const Count bytes = pl.part_bytes + pl.dpre_bytes;
    if (bytes.overflow() || bytes.value() > 0) {
      const Count need = align_up(pl.part_bytes) + pl.dpre_bytes + int64_t(kAlign);
      if (need.overflow() || need.value() > most.value()) most = need;
    }
  };
  if (p.W > Policy::kMaxFastW) {
    consider(Path::general);
  } else {
    consider(Path::token_major_vec);
    consider(Path::token_major_scalar);
    if (!p.packed && p.act_dtype != SC_F64) consider(Path::channel_major);
  }
  return most;
}

namespace {

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
  a.tile_t = pl.tile_t;
  a.tiles_per_row = pl.tiles_per_row;
  a.ntiles = pl.ntiles;
  uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  base = (base + kAlign - 1) / kAlign * kAlign;
  a.part = pl.part_bytes.value() ? reinterpret_cast<void*>(base) : nullptr;
  a.dpre = pl.dpre_bytes.value() ? reinterpret_cast<void*>(base + align_up(pl.part_bytes).bytes())
                                 : nullptr;
  return a;
}

sc_status workspace(const Problem& p, size_t* bytes, sc_error* err) {
  const Count need = workspace_need(p, Policy::kPlanMaxSms);
  if (need.overflow()) return workspace_too_large(p, err);
  *bytes = need.bytes();
  return SC_OK;
}

sc_status run(const Problem& p, sc_error* err) {
  const int sms = std::min(sm_count(), Policy::kPlanMaxSms);
  const Plan pl = plan_for(p, choose_path(p), sms);
  // Grid limits: tiles on grid.x (2^31-1), channel groups on grid.y (65535).
  const int64_t groups =
      pl.path == Path::channel_major ? 1 : ceil_div(p.D, int64_t(pl.cx) * pl.ch);
  const int64_t blocks_x = pl.path == Path::channel_major
                               ? ceil_div(p.B * p.D * pl.tiles_per_row * 32, Policy::kThreads)
                               : ceil_div(pl.ntiles, pl.ty);
  if (groups > 65535 || blocks_x > int64_t(INT32_MAX))
    return fail(err, SC_ERR_UNSUPPORTED,
                "cuda backend: shape [B=%lld, T=%lld, D=%lld] needs a grid of %lld x %lld blocks, "
                "beyond the device limits (tiles: raise exec.tile_t / exec.tile_d)",
                (long long)p.B, (long long)p.T, (long long)p.D, (long long)blocks_x,
                (long long)groups);
  const Args a = make_args(p, pl, p.exec.workspace);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.exec.stream);
  const char* kernel = "?";
  const cudaError_t e = p.dir == Dir::fwd ? launch_fwd(p, pl, a, stream, &kernel)
                                          : launch_bwd(p, pl, a, stream, &kernel);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // the launch error is reported here, not left pending
    return fail(err, SC_ERR_BACKEND, "cuda backend: launching kernel %s failed: %s (%s)", kernel,
                cudaGetErrorString(e), cudaGetErrorName(e));
  }
  return SC_OK;
}

}  // namespace shortconv::cuda
