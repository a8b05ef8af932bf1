// Host-side plan of one CUDA call: the kernel path, its window instance, the
// tiling and the launch geometry, the workspace layout.  A pure function of
// the Problem (shapes, dtypes, strides, pointer alignment, forced tiles) and a
// multiprocessor count; never autotuned.  Pure C++ (plan.cpp is compiled by
// the host compiler), so tests/cpp/cuda_plan_test.cpp checks it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/checked.hpp"
#include "core/problem.hpp"
#include "cuda/traits.hpp"

namespace shortconv::cuda {

enum class Path {
  token_major_vec,     // channel axis contiguous, 16-byte aligned, W <= 8, not fp64: fwd_tm/bwd_tm, CH > 1
  token_major_scalar,  // any strides, fp64, W 9..16: fwd_tm/bwd_tm, CH = 1
  channel_major,       // dense, time axis contiguous, not packed, no seq_idx, not fp64: fwd_cm/bwd_cm
  general,             // W > kMaxFastW: fwd_general, dpre_general + bwd_general
  decode,              // forward of a few tokens per sequence, or a serving step: fwd_decode,
                       // one launch that also rewrites the state rows
};
const char* path_name(Path path);

// How fwd_decode reads and writes state rows, from the state tensors' strides,
// dtype and alignment (the same for initial_state and final_state):
enum class StateIo {
  scalar,       // any strides and dtype: one element at a time (ring rows too)
  channel_vec,  // channel axis contiguous ([P, D, S] with stride(D) = 1, vLLM's pools): one
                // CH-channel vector per entry
  row_vec,      // rows [P, D, S] contiguous (entries of a channel adjacent): a thread's
                // CH x S block is S 16-byte vectors, staged in its slice of shared memory
};
const char* state_io_name(StateIo io);

constexpr int kMaxPaths = 5;  // candidates of one problem, at most

// Whether p is a decode step (a few tokens per sequence) or a serving step
// (num_accepted / parent_tokens: the decode path only).
bool decode_shaped(const Problem& p);
bool serving_step(const Problem& p);

struct Plan {
  Path path = Path::general;
  int wmax = 0;             // window bound instance (kTmVecWmax / kNarrowWmax); 0: general
  int ch = 1;               // token-major: channels per thread
  bool full_fwd = false;    // token-major vector forward: the 16-bit full-window SiLU instance
                            // (W == wmax; x and a residual staged in shared memory)
  bool full_bwd = false;    // token-major vector backward: the 16-bit full-window SiLU instance
                            // (W == wmax, dx and dweight or dbias wanted, tiles of at least
                            // kBwdFullMinTileT; x and dy staged in shared memory, no dynamic)
  int vec = 1;              // channel-major: tokens per lane (one 16-byte vector)
  int block_x = 1, block_y = 1;  // threads per block (token-major, general: cx along channels x ty tiles)
  int64_t grid_x = 0, grid_y = 1;  // blocks (grid.x: tiles; grid.y: channel groups)
  size_t smem = 0;          // dynamic shared memory of the main kernel
  int64_t tile_t = 0;       // tokens per tile
  int64_t axis = 0;         // tokens per tiled row: T, or B*T with seq_idx (one row)
  int64_t tiles_per_row = 0, ntiles = 0;
  int64_t parts = 0;        // dweight/dbias partial rows in the workspace (backward)
  StateIo state_io = StateIo::scalar;  // decode: how state rows are read and written
  bool raw_taps = false;    // decode on vLLM rows (decode_linear.cu): taps kept as the weight's
                            // words (weight [D, kVecWmax] contiguous, bias [D] or none, of
                            // x's dtype, 16-byte aligned)
  bool plain_step = false;  // decode with raw taps on vLLM rows of W-1 entries or on [P, D, S]
                            // rows in registers, row indices of one dtype: one token per
                            // sequence of a dense batch, no ring offsets, block tables, flags
                            // or accepted counts (fwd_decode_plain, decode_plain.cu)
  bool spec_step = false;   // decode with raw taps and accepted counts, a dense batch, index
                            // tensors (accepted counts included) of one dtype, no ring
                            // offsets, block tables, flags or parents: on vLLM rows of at
                            // least (W-2) + T entries, 1 .. kSpecMaxTokens tokens per
                            // sequence, or on [P, D, S] rows in registers (row_regs)
                            // (fwd_decode_spec / fwd_decode_spec_rows, decode_spec.cu)
  int plain_index = SC_I64;  // fwd_decode_plain / fwd_decode_spec: the index tensors' dtype
                            // (SC_I32, SC_I64), the instance's (SC_I64 without index tensors)
  bool zero_pads_fused = false;  // zero_padded_outputs done by fwd_decode_plain itself (else
                                 // zero_padded_y after the forward's kernel, pads.cu)
  int overlap = SC_OVERLAP_NONE;  // decode: the instance's sc_exec.overlap mode, launched to overlap the
                            // previous kernel: a plain or speculative step's (none, launch or reads),
                            // or launch for the other steps on vLLM rows with raw taps
                            // (fwd_decode_linear's); none
                            // for every other kernel, which launches as usual
  int row_regs = 0;         // decode on [P, D, S] rows: S (W-1 or W; speculative (W-1) + K), the
                            // row's entries held in registers (a linear step with raw taps,
                            // wide or narrow instance); 0: staged
  Count part_bytes = 0, dpre_bytes = 0;
};

// The paths a problem's shapes and dtypes allow, most specialised first
// (strides and pointer alignment then decide among them: choose_path).
int candidate_paths(const Problem& p, Path out[kMaxPaths]);
Path choose_path(const Problem& p);

// Plan for `path` (any candidate can be planned; run() uses choose_path's).
Plan plan_for(const Problem& p, Path path, int sms);

// The most any candidate path's plan can need at `sms` multiprocessors.
Count workspace_need(const Problem& p, int sms);
// The workspace the C ABI reports: workspace_need at kPlanMaxSms, which no
// device's plan exceeds (a function of shapes, dtypes and forced tiles only).
inline Count workspace_bytes(const Problem& p) { return workspace_need(p, kPlanMaxSms); }

// Workspace sub-buffer alignment (partials, then dpre).
constexpr size_t kWorkspaceAlign = 256;
inline Count align_workspace(Count v) { return round_up(v, int64_t(kWorkspaceAlign)); }

}  // namespace shortconv::cuda
