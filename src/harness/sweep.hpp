// Random sampling of the case space for property sweeps (tests/cpp/*_test.cpp).
//
// A sweep draws cases from fixed-seed generators instead of walking the full
// Cartesian product: each knob below says which part of the space may vary.
// Sizes stay small (the oracle is slow and the suite runs under sanitizers).
#pragma once

#include <random>
#include <vector>

#include "harness/harness.hpp"

namespace shortconv::harness {

struct Space {
  int W_min = 1, W_max = 16;     // widths drawn uniformly in [W_min, W_max]
  int64_t D_max = 24;            // channels in [1, D_max]
  int64_t long_len = 70;         // the "long" sequence length (plus a random few)
  bool packed = true;            // packed batches (many tiny segments) as well as dense
  bool layouts = true;           // channel-major and strided views, stride-0 dy
  bool dtypes = true;            // every activation x parameter dtype pair, other state dtype
  bool states = true;            // h0 / ht / dht / pools with -1 indices / in-place
  bool tiles = true;             // forced tile_t (1 .. W+3) and tile_d, thread counts
  bool optionals = true;         // bias, residual, absent dy
  bool serving = true;           // forward-only serving steps: accepted counts, tree drafts
  bool seq_ids = true;           // dense batches described by seq_idx (runs, padding, id rows)
  std::vector<sc_dtype> act_dtypes = {SC_F32, SC_F16, SC_BF16, SC_F64};
};

// One case from `space`; inputs come from make_inputs(case) (its seed is drawn too).
Case random_case(std::mt19937_64& rng, const Space& space);

// Sequence lengths that matter for width W: 0, 1, W-2, W-1, W and long.
std::vector<int64_t> edge_lengths(int W, int64_t long_len);

}  // namespace shortconv::harness
