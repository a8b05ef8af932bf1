// Cross-backend property sweep: every backend compiled in (cpu always; cuda
// when compiled and a device is present, else skipped) against the float64
// oracle on randomly sampled cases (fixed seeds) over W 1..16, S in
// {W-1, W, W+3}, lengths 0, 1, W-2, W-1, W and long, dense and packed batches
// of many tiny segments, token-/channel-major and strided views (stride-0 dy),
// every activation x parameter dtype pair plus another state dtype, forced
// tile sizes and thread counts, states, pools with -1 indices, in-place
// updates.  Each case runs forward and backward into NaN-poisoned outputs:
// every requested element must be written, nothing outside the outputs may
// change, and every output must match the oracle run on the same (rounded)
// inputs within ||out-ref||/||ref|| <= fp64 1e-12, fp32 1e-5, fp16/bf16 1e-2.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "backend_param.hpp"
#include "harness/harness.hpp"
#include "harness/sweep.hpp"

namespace {

using namespace shortconv::harness;

class Sweep : public BackendTest {
 protected:
  // Runs c on the backend under test and on the oracle; returns "" or why not equal.
  static std::string check_case(const Case& c, sc_backend b) {
    const Inputs in = make_inputs(c);
    const Outputs ref = run(c, in, SC_BACKEND_REF);
    const Outputs got = run(c, in, b);
    std::string why = compare(c, got, ref);
    if (!ref.ok()) why += "oracle: " + ref.problems();
    return why;
  }

  void sweep(const Space& sp, uint64_t seed, int count) {
    std::mt19937_64 rng(seed);
    int failures = 0;
    for (int i = 0; i < count && failures < 5; ++i) {
      const Case c = random_case(rng, sp);
      const std::string why = check_case(c, GetParam());
      if (!why.empty()) {
        ++failures;
        ADD_FAILURE() << "case " << i << ": " << c.describe() << "\n  " << why;
      }
    }
  }
};

TEST_P(Sweep, EverythingRandom) {
  Space sp;
  sweep(sp, 1001, 250);
}

TEST_P(Sweep, DenseFp32EdgeLengths) {
  // deterministic: every W 1..16, every S choice, every edge length
  std::mt19937_64 rng(1002);
  for (int W = 1; W <= 16; ++W)
    for (int S : {W - 1, W, W + 3})
      for (int64_t L : edge_lengths(W, 67)) {
        Case c;
        c.W = W;
        c.S = S;
        c.B = 2;
        c.T = L;
        c.D = 5;
        c.h0 = c.ht = c.dht = c.want_dh0 = true;
        c.residual = (W + L) % 2 == 0;
        c.layout = Layout(rng() % 3);
        c.seed = rng();
        const std::string why = check_case(c, GetParam());
        EXPECT_EQ(why, "") << c.describe();
      }
}

TEST_P(Sweep, PackedTinySegments) {
  Space sp;
  sp.seq_ids = false;  // (the batch becomes packed below)
  sp.dtypes = false;
  sp.serving = false;  // (the lengths and rows are redrawn below)
  sp.W_max = 8;
  std::mt19937_64 rng(1003);
  int bad = 0;
  for (int i = 0; i < 60 && bad < 5; ++i) {
    Case c = random_case(rng, sp);
    c.packed = true;
    c.lengths.clear();
    const int64_t n = 20 + int64_t(rng() % 40);  // many segments of 0..W+1 tokens
    for (int64_t k = 0; k < n; ++k) c.lengths.push_back(int64_t(rng() % uint64_t(c.W + 2)));
    if (c.pool > 0 || c.in_place) {  // re-derive the per-sequence state layout for the new N
      c.pool = 0;
      c.h0_index.clear();
      c.ht_index.clear();
      c.in_place = false;
      c.pad_index = -1;
    }
    // per-sequence flags and ring offsets for the new N (flags alternate, offsets cycle)
    for (std::vector<int64_t>* v : {&c.has_h0, &c.ring})
      if (!v->empty()) {
        v->resize(size_t(n));
        for (int64_t k = 0; k < n; ++k) (*v)[size_t(k)] = v == &c.has_h0 ? k % 2 : k % 7;
      }
    const std::string why = check_case(c, GetParam());
    if (!why.empty()) ++bad;
    EXPECT_EQ(why, "") << c.describe();
  }
}

TEST_P(Sweep, DtypePairs) {
  // every activation x parameter dtype pair, with a different state dtype
  const sc_dtype all[4] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  std::mt19937_64 rng(1004);
  for (sc_dtype a : all)
    for (sc_dtype p : all) {
      Case c;
      c.W = 1 + int(rng() % 8);
      c.act_dtype = a;
      c.param_dtype = p;
      c.state_dtype = all[(int(a) + 1 + int(rng() % 3)) % 4];
      c.packed = true;
      c.lengths = {0, 3, 1, 17, int64_t(c.W), 40};
      c.D = 7;
      c.h0 = c.ht = c.dht = c.want_dh0 = true;
      c.residual = true;
      c.seed = rng();
      EXPECT_EQ(check_case(c, GetParam()), "") << c.describe();
    }
}

TEST_P(Sweep, ForcedTiles) {
  // every forced time tile 1 .. W+3 (and some channel tiles), dense and packed
  std::mt19937_64 rng(1005);
  for (int W : {1, 2, 3, 4, 5, 8, 13, 16})
    for (int64_t tile = 1; tile <= W + 3; ++tile) {
      Case c;
      c.W = W;
      c.S = (tile % 2) ? W - 1 : W;
      c.tile_t = tile;
      c.tile_d = (tile % 3 == 0) ? int64_t(1 + rng() % 16) : 0;
      c.D = 9;
      if (tile % 2) {
        c.packed = true;
        c.lengths = {int64_t(W + 5), 1, 0, int64_t(W - 1), 50};
      } else {
        c.B = 2;
        c.T = 61;
      }
      c.h0 = c.ht = c.dht = c.want_dh0 = true;
      c.act_dtype = tile % 4 == 0 ? SC_BF16 : SC_F32;
      c.seed = rng();
      EXPECT_EQ(check_case(c, GetParam()), "") << c.describe();
    }
}

TEST_P(Sweep, ExtremeForcedTiles) {
  // Forced tiles longer / wider than their axis mean the whole axis, up to
  // INT64_MAX (round-ups and chunk counts must not overflow into a no-op).
  std::mt19937_64 rng(1008);
  const int64_t huge[] = {INT64_MAX, INT64_MAX - 1, int64_t(1) << 62, 1000};
  for (int64_t tt : huge)
    for (int64_t td : {int64_t(0), INT64_MAX, int64_t(1) << 40}) {
      Case c;
      c.W = 4;
      c.tile_t = tt;
      c.tile_d = td;
      c.D = 20;
      c.packed = tt % 2 == 0;
      c.lengths = {9, 0, 3, 30};
      c.B = 2;
      c.T = 25;
      c.h0 = c.ht = c.dht = c.want_dh0 = true;
      c.act_dtype = td == 0 ? SC_BF16 : SC_F32;
      c.seed = rng();
      EXPECT_EQ(check_case(c, GetParam()), "") << c.describe();
    }
}

TEST_P(Sweep, LayoutsAndViews) {
  // channel-major, q/k/v slices of a fused [B, T, 3D] projection, stride-0 dy
  std::mt19937_64 rng(1006);
  for (Layout l : {Layout::token_major, Layout::channel_major, Layout::strided})
    for (int64_t slot = 0; slot < 3; ++slot)
      for (bool broadcast : {false, true}) {
        Case c;
        c.W = 4;
        c.B = 2;
        c.T = 33;
        c.D = 12;
        c.layout = l;
        c.view_mult = 3;
        c.view_slot = slot;
        c.dy_broadcast = broadcast;
        c.residual = true;
        c.h0 = c.ht = c.want_dh0 = true;
        c.act_dtype = slot == 2 ? SC_BF16 : SC_F32;
        c.seed = rng();
        EXPECT_EQ(check_case(c, GetParam()), "") << c.describe();
        c.packed = true;  // the same views on a packed [total, D] / [1, total, D] batch
        c.lengths = {5, 0, 20, 1, 7};
        c.packed_2d = slot == 1;
        EXPECT_EQ(check_case(c, GetParam()), "") << c.describe();
      }
}

TEST_P(Sweep, StatesAndPools) {
  Space sp;
  sp.seq_ids = false;  // (pools addressed by indices below)
  sp.W_max = 10;
  sp.serving = false;  // (the rows are redrawn below; serving steps: Sweep.Serving*)
  std::mt19937_64 rng(1007);
  int bad = 0;
  for (int i = 0; i < 80 && bad < 5; ++i) {
    Case c = random_case(rng, sp);
    if (c.pool == 0) {  // force a pool with -1 entries on both sides
      const int64_t N = c.num_seqs();
      c.h0 = c.ht = true;
      c.pool = N + 2;
      c.in_place = i % 2 == 0;
      c.h0_index.clear();
      c.ht_index.clear();
      for (int64_t n = 0; n < N; ++n) {
        const int64_t own = (n * 5 + 1) % c.pool;  // distinct: 5 and pool coprime or N small
        c.h0_index.push_back(n % 3 == 0 ? -1 : c.in_place ? own : int64_t(rng() % uint64_t(c.pool)));
        c.ht_index.push_back(n % 4 == 1 ? -1 : own);
      }
      // keep rows distinct when 5 shares a factor with the pool size
      if (c.pool % 5 == 0) {
        for (int64_t n = 0; n < N; ++n) {
          if (c.ht_index[size_t(n)] >= 0) c.ht_index[size_t(n)] = n;
          if (c.in_place && c.h0_index[size_t(n)] >= 0) c.h0_index[size_t(n)] = n;
        }
      }
    }
    const std::string why = check_case(c, GetParam());
    if (!why.empty()) ++bad;
    EXPECT_EQ(why, "") << c.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Sweep, ::testing::Values(SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
