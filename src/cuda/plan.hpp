// Host-side plan of one CUDA call: which kernel path, the tiling policy, the
// workspace layout.  A pure function of the Problem (shapes, dtypes, strides,
// forced tiles) and the device's multiprocessor count; never autotuned.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/checked.hpp"
#include "core/problem.hpp"
#include "cuda/common.cuh"

namespace shortconv::cuda {

// Fixed launch-shape constants (the tile lengths are chosen per shape).
struct Policy {
  static constexpr int kThreads = 256;        // threads per block of every main kernel
  static constexpr int kMaxFastW = 16;        // W above this takes the general path
  static constexpr int kResidentThreads = 512;   // threads one SM holds: 2 blocks (the main kernels' register cap)
  static constexpr int64_t kMinTileT = 8;     // token-major: shortest automatic tile (small shapes; halo W-1 re-read per tile)
  static constexpr int64_t kMaxTileT = 256;   // token-major: longest automatic tile (enough work per thread)
  static constexpr int64_t kMinWaves = 3;    // token-major forward: shapes beyond one wave of kMaxTileT tiles get >= this many waves (tail)
  static constexpr int64_t kBwdFullMinTileT = 64;  // bwd_tm: shortest tile taking the full-window SiLU instance
  static constexpr int kCmMaxIters = 16;      // channel-major: most 32*VEC-token chunks per warp tile
  static constexpr int kSmallThreads = 128;   // threads per block of the per-(sequence, channel) state kernels
  // Plans are made for min(device SMs, kPlanMaxSms) and the workspace for
  // kPlanMaxSms: more SMs only ever shorten tiles (more partial rows), so a
  // size queried once covers every device, however large (a device beyond
  // this count runs the plan of this count: correct, a little less parallel).
  static constexpr int kPlanMaxSms = 256;
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block must be whole warps");
  static_assert(kMinTileT >= 1 && kMinTileT <= kMaxTileT, "tile bounds");
};

// The compile-time window bound of the fast paths for a runtime W (1..16):
// three steps on the vectorised token-major path (the targets' W = 4 exact),
// two on the scalar and channel-major paths (fewer template instances: CI
// compiles every instance for two architectures on two cores).
inline int wmax_for(int W) { return W <= 4 ? 4 : (W <= 8 ? 8 : 16); }
inline int wmax_narrow(int W) { return W <= 4 ? 4 : 16; }

// Channels per thread on the vectorised token-major path: a 16-byte vector,
// narrowed for wide windows so that weights + window stay in registers.
constexpr int tm_ch(int elem_bytes, int wmax, bool bwd) {
  const int vec = 16 / elem_bytes;
  const int budget = 16 / wmax;  // weight registers per channel group / WMAX: no spills at 2 blocks/SM
  const int c = vec < budget ? vec : budget;
  return c < 1 ? 1 : c;
}

enum class Path { token_major_vec, token_major_scalar, channel_major, general };

struct Plan {
  Path path = Path::general;
  int ch = 1;              // channels per thread (token-major), tokens per vector (channel-major)
  int cx = 32, ty = 8;     // token-major block: cx threads along channels x ty tiles along time
  int64_t tile_t = 0;      // tokens per tile
  int64_t tiles_per_row = 0, ntiles = 0;
  int64_t parts = 0;       // dweight/dbias partial rows in the workspace (backward)
  Count part_bytes = 0, dpre_bytes = 0;
};

int sm_count();  // the current device's multiprocessor count (no synchronisation)

// Plan for a given path (any path can be planned; run() picks the eligible one).
Plan plan_for(const Problem& p, Path path, int sms);
Path choose_path(const Problem& p);
Count workspace_need(const Problem& p, int sms);

Args make_args(const Problem& p, const Plan& pl, void* workspace);

// Kernel launches of each direction (fwd.cu, bwd.cu).  Return cudaSuccess or
// the launch error; *kernel names the kernel that failed.
cudaError_t launch_fwd(const Problem& p, const Plan& pl, const Args& a, cudaStream_t s,
                       const char** kernel);
cudaError_t launch_bwd(const Problem& p, const Plan& pl, const Args& a, cudaStream_t s,
                       const char** kernel);

// cudaLaunchKernel with the Args block as the only parameter.
template <class K>
inline cudaError_t launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          const Args& a) {
  void* params[] = {const_cast<Args*>(&a)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, params, smem, s);
}


}  // namespace shortconv::cuda
