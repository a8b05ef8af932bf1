// Sequence ids (seq_idx, docs/semantics.md section 3) on every backend (ref,
// cpu; cuda when a device is present):
//  - against the oracle at every forced time tile (1 .. W+3), with states,
//    in place, padding at row starts and ends, runs of 1 token;
//  - paths agree: a seq_idx batch equals its equivalent cu_seqlens packed
//    batch (one sequence per run, pool rows = ids) bitwise -- outputs, final
//    states and every gradient -- and padding tokens' values (NaN, inf, huge)
//    change nothing else;
//  - chunked prefill: the batch cut in time, each chunk updating the state
//    pool (rows by id) in place, equals the whole call bitwise;
//  - bitwise across thread counts, runs and tiles; the shapes of the CUDA
//    backend's full-window instances.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend_param.hpp"
#include "harness/harness.hpp"
#include "harness/sweep.hpp"

namespace {

using namespace shortconv::harness;

class SeqIdx : public BackendTest {};

// A random case drawn until it is described by seq_idx.
Case random_ids_case(std::mt19937_64& rng, const Space& sp) {
  while (true) {
    Case c = random_case(rng, sp);
    if (c.by_ids()) return c;
  }
}

// Ids for rows of T tokens: runs of the given lengths (cycled) with ids
// 0, 1, 2, ... and every `pad_every`-th run padding (-1).
std::vector<int64_t> cycled_ids(int64_t B, int64_t T, const std::vector<int64_t>& lens,
                                int pad_every, int64_t* rows) {
  std::vector<int64_t> ids;
  int64_t next = 0, k = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++k) {
      const int64_t id = pad_every && k % pad_every == 0 ? -1 : next++;
      for (int64_t i = 0; i < lens[size_t(k) % lens.size()] && t < T; ++i, ++t) ids.push_back(id);
    }
  *rows = next;
  return ids;
}

TEST_P(SeqIdx, EveryForcedTileAgainstTheOracle) {
  std::mt19937_64 rng(5001);
  for (int W : {1, 2, 4, 5, 9, 17})
    for (int64_t tile = 1; tile <= W + 3; ++tile) {
      Case c;
      c.W = W;
      c.S = tile % 2 ? W - 1 : W + 2;
      c.B = 2;
      c.T = 3 * W + 7;
      c.D = 5;
      c.tile_t = tile;
      c.tile_d = tile % 3 == 0 ? 3 : 0;
      // padding first and last, runs of 1, W-1, W and longer
      c.seq_idx = cycled_ids(c.B, c.T, {1, int64_t(W), 2, int64_t(W) - 1, 2 * int64_t(W) + 1}, 3,
                             &c.id_rows);
      c.id_rows += 2;  // rows of ids that never occur
      c.h0 = c.ht = c.dht = c.want_dh0 = true;
      c.in_place = tile % 4 == 1;
      c.residual = tile % 2 == 0;
      c.seq_idx_cm = tile % 3 == 1;
      c.layout = Layout(tile % 3);
      c.act_dtype = tile % 5 == 4 ? SC_BF16 : SC_F32;
      c.seed = rng();
      const Inputs in = make_inputs(c);
      const Outputs ref = run(c, in, SC_BACKEND_REF);
      ASSERT_TRUE(ref.ok()) << ref.problems();
      EXPECT_EQ(compare(c, run(c, in, GetParam()), ref), "") << c.describe();
    }
}

// The shapes the CUDA backend's full-window instances take (16-bit, W == WMAX,
// SiLU, token-major vectors; the backward's from 64-token tiles), with long
// runs crossing tiles, padding between them and states by id.
TEST_P(SeqIdx, FullWindowShapesAgainstTheOracle) {
  std::mt19937_64 rng(5005);
  for (int W : {4, 8})
    for (int64_t tile : {int64_t(0), int64_t(64), int64_t(128)}) {
      Case c;
      c.W = W;
      c.S = W - 1;
      c.B = 2;
      c.T = 301;
      c.D = 16;
      c.tile_t = tile;
      c.act_dtype = W == 4 ? SC_BF16 : SC_F16;
      c.param_dtype = SC_F32;
      c.seq_idx = cycled_ids(c.B, c.T, {150, 3, 97, 1, 64}, 4, &c.id_rows);
      c.h0 = c.ht = c.dht = c.want_dh0 = true;
      c.residual = tile == 64;
      c.seed = rng();
      const Inputs in = make_inputs(c);
      const Outputs ref = run(c, in, SC_BACKEND_REF);
      ASSERT_TRUE(ref.ok()) << ref.problems();
      EXPECT_EQ(compare(c, run(c, in, GetParam()), ref), "") << c.describe();
    }
}

// Element i of a [B*T, D] vector belongs to a padding token of c.
bool padding(const Case& c, size_t i) { return c.seq_idx[i / size_t(c.D)] < 0; }

// dinitial_state of the packed equivalent ([runs, D, S]) scattered into rows
// by id ([id_rows, D, S]; rows of no run: 0).
std::vector<double> by_id(const Case& c, const std::vector<double>& dense) {
  const int64_t DS = c.D * c.state_len();
  std::vector<double> out(size_t(c.id_rows * DS), 0.0);
  const std::vector<Case::Run> runs = c.runs();
  for (size_t k = 0; k < runs.size(); ++k)
    if (runs[k].id >= 0)
      for (int64_t e = 0; e < DS; ++e)
        out[size_t(runs[k].id * DS + e)] = dense[k * size_t(DS) + size_t(e)];
  return out;
}

TEST_P(SeqIdx, EqualsThePackedBatchBitwise) {
  Space sp;
  sp.W_max = 9;
  std::mt19937_64 rng(5002);
  int bad = 0;
  for (int i = 0; i < 40 && bad < 3; ++i) {
    Case c = random_ids_case(rng, sp);
    c.dy_broadcast = false;  // (the equivalent batch expands it: another layout)
    const Inputs in = make_inputs(c);
    Case pc;
    Inputs pin;
    packed_equivalent(c, in, &pc, &pin);
    const Outputs a = run(c, in, GetParam()), b = run(pc, pin, GetParam());
    ASSERT_TRUE(a.ok() && b.ok()) << a.problems() << b.problems() << c.describe();
    std::string why;
    for (size_t e = 0; e < a.y.size(); ++e) {
      const bool pad = padding(c, e);
      if (pad ? a.y[e] != 0.0 : !bit_equal({a.y[e]}, {b.y[e]})) why += "y ";
      if (!a.dx.empty() && (pad ? a.dx[e] != 0.0 : !bit_equal({a.dx[e]}, {b.dx[e]}))) why += "dx ";
      if (!why.empty()) break;
    }
    if (!bit_equal(a.ht, b.ht)) why += "final_state ";
    if (!bit_equal(a.dweight, b.dweight)) why += "dweight ";
    if (!bit_equal(a.dbias, b.dbias)) why += "dbias ";
    if (c.want_dh0 && !bit_equal(a.dh0, by_id(c, b.dh0))) why += "dinitial_state ";
    if (!why.empty()) ++bad;
    EXPECT_EQ(why, "") << c.describe();
  }
}

TEST_P(SeqIdx, PaddingValuesChangeNothing) {
  Space sp;
  sp.W_max = 9;
  std::mt19937_64 rng(5003);
  const double odd[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(), -1e30, 7.5};
  for (int i = 0; i < 25; ++i) {
    Case c = random_ids_case(rng, sp);
    c.dy_broadcast = false;
    const Inputs in = make_inputs(c);
    Inputs other = in;  // x, residual, dy of padding tokens replaced
    for (std::vector<double>* v : {&other.x, &other.residual, &other.dy})
      for (size_t e = 0; e < v->size(); ++e)
        if (padding(c, e)) (*v)[e] = odd[(e + size_t(i)) % 4];
    const Outputs a = run(c, in, GetParam()), b = run(c, other, GetParam());
    ASSERT_TRUE(a.ok() && b.ok()) << a.problems() << b.problems() << c.describe();
    EXPECT_TRUE(bit_equal(a.y, b.y)) << "y " << c.describe();
    EXPECT_TRUE(bit_equal(a.ht, b.ht)) << "final_state " << c.describe();
    EXPECT_TRUE(bit_equal(a.dx, b.dx)) << "dx " << c.describe();
    EXPECT_TRUE(bit_equal(a.dweight, b.dweight)) << "dweight " << c.describe();
    EXPECT_TRUE(bit_equal(a.dbias, b.dbias)) << "dbias " << c.describe();
    EXPECT_TRUE(bit_equal(a.dh0, b.dh0)) << "dinitial_state " << c.describe();
  }
}

// Results independent of the thread count and repeated runs (every output
// bitwise), and of the tiling (y, final states, dx, dinitial_state bitwise:
// each is one fixed-order sum whatever tile computes it).
TEST_P(SeqIdx, BitwiseAcrossThreadsRunsAndTiles) {
  std::mt19937_64 rng(5006);
  for (int trial = 0; trial < 2; ++trial) {
    Case c;
    c.W = trial % 2 ? 4 : 6;
    c.S = c.W;
    c.B = 3;
    c.T = 150;
    c.D = 37;
    c.seq_idx = cycled_ids(c.B, c.T, {60, 1, 3, 45, int64_t(c.W)}, 3, &c.id_rows);
    c.h0 = c.ht = c.dht = c.want_dh0 = c.residual = true;
    c.act_dtype = trial == 0 ? SC_F32 : SC_BF16;
    c.seed = rng();
    const Inputs in = make_inputs(c);
    const Outputs first = run(c, in, GetParam());
    ASSERT_TRUE(first.ok()) << first.problems();
    for (int threads : {1, 2, 3, 0}) {
      c.num_threads = threads;
      const Outputs o = run(c, in, GetParam());
      ASSERT_TRUE(o.ok()) << o.problems();
      EXPECT_TRUE(bit_equal(o.y, first.y) && bit_equal(o.ht, first.ht) &&
                  bit_equal(o.dx, first.dx) && bit_equal(o.dweight, first.dweight) &&
                  bit_equal(o.dbias, first.dbias) && bit_equal(o.dh0, first.dh0))
          << "threads=" << threads << " " << c.describe();
    }
    for (int64_t tile : {1, 7, 64}) {
      c.tile_t = tile;
      c.tile_d = tile == 7 ? 5 : 0;
      const Outputs o = run(c, in, GetParam());
      ASSERT_TRUE(o.ok()) << o.problems();
      EXPECT_TRUE(bit_equal(o.y, first.y) && bit_equal(o.ht, first.ht) &&
                  bit_equal(o.dx, first.dx) && bit_equal(o.dh0, first.dh0))
          << "tile_t=" << tile << " " << c.describe();
    }
  }
}

// Chunked prefill by ids: tokens [t0, t1) of every row per call, the pool
// (rows by id) updated in place; a run crossing a cut continues from the row
// the previous chunk wrote.  y and the final pool equal the whole call's.
TEST_P(SeqIdx, ChunkedPrefillInPlaceEqualsWhole) {
  std::mt19937_64 rng(5004);
  for (int trial = 0; trial < 10; ++trial) {
    Case w;
    w.W = 1 + int(rng() % 6);
    w.S = trial % 2 ? w.W : w.W - 1;
    w.B = 1 + int64_t(rng() % 3);
    w.T = 10 + int64_t(rng() % 30);
    w.D = 6;
    w.seq_idx = cycled_ids(w.B, w.T, {int64_t(1 + rng() % 9), 1, int64_t(w.W), 13}, 4, &w.id_rows);
    w.id_rows += 1;
    w.h0 = w.ht = w.in_place = true;
    w.act_dtype = trial % 3 == 0 ? SC_BF16 : SC_F32;
    w.seed = rng();
    const Inputs wi = make_inputs(w);
    const Outputs whole = run(w, wi, GetParam(), kForward);
    ASSERT_TRUE(whole.ok()) << whole.problems();
    std::vector<double> pool = wi.h0, y(whole.y.size(), NAN);
    for (int64_t t0 = 0; t0 < w.T;) {
      const int64_t t1 = std::min<int64_t>(w.T, t0 + 1 + int64_t(rng() % 7));
      Case s = w;
      s.T = t1 - t0;
      s.tile_t = rng() % 2 ? 1 + int64_t(rng() % 4) : 0;
      s.seq_idx.clear();
      Inputs si;
      si.weight = wi.weight;
      si.bias = wi.bias;
      si.h0 = pool;
      for (int64_t b = 0; b < w.B; ++b)
        for (int64_t t = t0; t < t1; ++t) {
          s.seq_idx.push_back(w.seq_idx[size_t(b * w.T + t)]);
          for (int64_t d = 0; d < w.D; ++d) si.x.push_back(wi.x[size_t((b * w.T + t) * w.D + d)]);
        }
      const Outputs o = run(s, si, GetParam(), kForward);
      ASSERT_TRUE(o.ok()) << s.describe() << ": " << o.problems();
      for (int64_t b = 0; b < w.B; ++b)
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t d = 0; d < w.D; ++d)
            y[size_t((b * w.T + t) * w.D + d)] = o.y[size_t((b * s.T + t - t0) * w.D + d)];
      pool = o.ht;
      t0 = t1;
    }
    EXPECT_TRUE(bit_equal(y, whole.y)) << "y " << w.describe();
    EXPECT_TRUE(bit_equal(pool, whole.ht)) << "pool " << w.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SeqIdx,
                         ::testing::Values(SC_BACKEND_REF, SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
