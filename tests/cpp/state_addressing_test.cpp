// State addressing (docs/semantics.md section 5) checked by paths that must
// agree with each other, on every backend, independently of the oracle:
//  - ring rows: a run whose state rows are rings with offsets c_n equals the
//    run on dense rows holding the same logical state (h0 rotated by c_n),
//    and its final state is the dense final state rotated by c_n + L_n;
//  - has_initial_state: a false flag equals a zero initial-state row;
//  - the pad index equals -1 in both index tensors, and means nothing
//    without them.
// Forward and backward outputs are compared bitwise: the logical problems are
// identical, so only the addressing differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "backend_param.hpp"
#include "harness/harness.hpp"

namespace {

using namespace shortconv::harness;

class StateAddressing : public BackendTest {};

// A random case with states (dense rows, one per sequence), packed or dense.
Case random_state_case(std::mt19937_64& rng, int i) {
  Case c;
  c.W = 1 + int(rng() % 9);
  c.S = c.W - 1 + int(rng() % 4);
  c.act = rng() % 4 ? SC_ACT_SILU : SC_ACT_NONE;
  c.act_dtype = c.param_dtype = c.state_dtype = i % 3 == 2 ? SC_F64 : SC_F32;
  if (i % 4 == 1) c.act_dtype = SC_BF16;
  c.D = 1 + int64_t(rng() % 20);
  c.h0 = c.ht = true;
  c.dht = rng() % 2;
  c.want_dh0 = true;
  c.in_place = rng() % 3 == 0;
  c.state_transposed = rng() % 4 == 0;
  c.layout = Layout(rng() % 3);
  if (rng() % 3 == 0) c.tile_t = 1 + int64_t(rng() % uint64_t(c.W + 3));
  c.seed = rng();
  if (i % 2) {
    c.packed = true;
    const int n = 1 + int(rng() % 7);
    for (int k = 0; k < n; ++k) c.lengths.push_back(int64_t(rng() % uint64_t(2 * c.W + 6)));
  } else {
    c.B = 1 + int64_t(rng() % 3);
    c.T = int64_t(rng() % uint64_t(2 * c.W + 6));
  }
  return c;
}

// Logical entry j of row r (D channels, S entries) <- slot (off + j) mod S.
std::vector<double> rotate_rows(const std::vector<double>& v, int64_t D, int64_t S,
                                const std::vector<int64_t>& off, bool to_slots) {
  std::vector<double> out(v.size());
  const int64_t rows = D * S > 0 ? int64_t(v.size()) / (D * S) : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < S; ++j) {
        const int64_t slot = (off[size_t(r)] + j) % S;
        const size_t logical = size_t((r * D + d) * S + j), stored = size_t((r * D + d) * S + slot);
        if (to_slots) out[stored] = v[logical];
        else out[logical] = v[stored];
      }
  return out;
}

std::string same(const Outputs& a, const Outputs& b, bool ht_too) {
  std::string why;
  if (!a.ok()) why += "run: " + a.problems() + "; ";
  if (!b.ok()) why += "reference run: " + b.problems() + "; ";
  if (!bit_equal(a.y, b.y)) why += "y differs; ";
  if (ht_too && !bit_equal(a.ht, b.ht)) why += "ht differs; ";
  if (!bit_equal(a.dx, b.dx)) why += "dx differs; ";
  if (!bit_equal(a.dweight, b.dweight)) why += "dweight differs; ";
  if (!bit_equal(a.dbias, b.dbias)) why += "dbias differs; ";
  if (!bit_equal(a.dh0, b.dh0)) why += "dh0 differs; ";
  return why;
}

TEST_P(StateAddressing, RingRowsEqualRotatedDenseRows) {
  std::mt19937_64 rng(3001);
  int bad = 0;
  for (int i = 0; i < 60 && bad < 5; ++i) {
    Case c = random_state_case(rng, i);
    const int64_t N = c.num_seqs(), S = c.state_len();
    if (S == 0) continue;
    const Inputs in = make_inputs(c);
    const Outputs dense = run(c, in, GetParam());

    Case cr = c;
    for (int64_t n = 0; n < N; ++n) cr.ring.push_back(int64_t(rng() % uint64_t(3 * S + 1)));
    Inputs ir = in;
    ir.h0 = rotate_rows(in.h0, c.D, S, cr.ring, true);
    Outputs ring = run(cr, ir, GetParam());
    std::vector<int64_t> end(static_cast<size_t>(N), 0);  // ht[j] sits at slot (c_n + L_n + j) mod S
    for (int64_t n = 0; n < N; ++n)
      end[size_t(n)] = cr.ring[size_t(n)] + (c.packed ? c.lengths[size_t(n)] : c.T);
    ring.ht = rotate_rows(ring.ht, c.D, S, end, false);
    std::string why = same(ring, dense, true);
    EXPECT_EQ(why, "") << cr.describe();
    if (!why.empty()) ++bad;
  }
}

TEST_P(StateAddressing, FalseFlagEqualsZeroRow) {
  std::mt19937_64 rng(3002);
  int bad = 0;
  for (int i = 0; i < 60 && bad < 5; ++i) {
    Case c = random_state_case(rng, i);
    c.in_place = false;  // the zeroed rows below are the reference's own input
    const int64_t N = c.num_seqs(), per_row = c.D * c.state_len();
    const Inputs in = make_inputs(c);
    Case cf = c;
    cf.flag_dtype = i % 3 == 0 ? SC_BOOL : i % 3 == 1 ? SC_I32 : SC_I64;
    Inputs iz = in;
    for (int64_t n = 0; n < N; ++n) {
      cf.has_h0.push_back(rng() % 2 ? 1 : 0);
      if (!cf.has_h0.back())
        std::fill(iz.h0.begin() + n * per_row, iz.h0.begin() + (n + 1) * per_row, 0.0);
    }
    const std::string why = same(run(cf, in, GetParam()), run(c, iz, GetParam()), true);
    EXPECT_EQ(why, "") << cf.describe();
    if (!why.empty()) ++bad;
  }
}

TEST_P(StateAddressing, PadIndexEqualsMinusOne) {
  std::mt19937_64 rng(3003);
  int bad = 0;
  for (int i = 0; i < 60 && bad < 5; ++i) {
    Case c = random_state_case(rng, i);
    const int64_t N = c.num_seqs();
    c.pool = N + 2;
    for (int64_t n = 0; n < N; ++n) {  // in place: each sequence reads and writes its own row
      c.h0_index.push_back(n + 1);
      c.ht_index.push_back(c.in_place ? n + 1 : int64_t(N + 1 - n));
    }
    Case cp = c;
    cp.pad_index = i % 2 ? int64_t(rng() % uint64_t(c.pool)) : -2 - int64_t(rng() % 5);
    for (int64_t n = 0; n < N; ++n) {
      if (rng() % 3 == 0) c.h0_index[size_t(n)] = -1, cp.h0_index[size_t(n)] = cp.pad_index;
      if (rng() % 3 == 0) c.ht_index[size_t(n)] = -1, cp.ht_index[size_t(n)] = cp.pad_index;
      // a real row equal to the pad index means "no row" too
      if (c.h0_index[size_t(n)] == cp.pad_index) c.h0_index[size_t(n)] = -1;
      if (c.ht_index[size_t(n)] == cp.pad_index) c.ht_index[size_t(n)] = -1;
    }
    const Inputs in = make_inputs(c);
    const std::string why = same(run(cp, in, GetParam()), run(c, in, GetParam()), true);
    EXPECT_EQ(why, "") << cp.describe();
    if (!why.empty()) ++bad;
  }
}

// The pad index names entries of index tensors only: without them sequence n
// keeps row n even when n equals the pad index.
TEST_P(StateAddressing, PadIndexLeavesRowsWithoutIndicesAlone) {
  std::mt19937_64 rng(3004);
  int bad = 0;
  for (int i = 0; i < 30 && bad < 5; ++i) {
    const Case c = random_state_case(rng, i);
    Case cp = c;
    cp.pad_index = int64_t(rng() % uint64_t(c.num_seqs() + 1));
    const Inputs in = make_inputs(c);
    const std::string why = same(run(cp, in, GetParam()), run(c, in, GetParam()), true);
    EXPECT_EQ(why, "") << cp.describe();
    if (!why.empty()) ++bad;
  }
}

// A pool whose first element lies 1, 2 or 4 elements past an aligned address
// (so aligned to its element size, or to 4 or 8 bytes, only) gives the aligned
// pool's outputs bit for bit, and nothing before it is written (the harness's
// stray check).  The forms are those whose CUDA instances move [P, D, S] rows
// in 4- or 16-byte units chosen by the rows' alignment: one token on rows of
// W-1 and W entries, 1+3 speculative tokens, at a small batch and at one that
// takes the wide instance when aligned; and a prefill chunk reading and
// writing the pool (forward and backward).
TEST_P(StateAddressing, UnalignedPoolEqualsAlignedPool) {
  std::mt19937_64 rng(3005);
  struct Form {
    const char* what;
    sc_dtype dt;
    int S;
    int64_t T;
    bool spec;
  };
  const Form forms[] = {
      {"one token, S = W-1", SC_BF16, 3, 1, false},
      {"one token, S = W", SC_BF16, 4, 1, false},
      {"one token, fp16, S = W", SC_F16, 4, 1, false},
      {"one token, fp32, S = W-1", SC_F32, 3, 1, false},
      {"two tokens", SC_BF16, 3, 2, false},
      {"1+3 tokens", SC_BF16, 6, 4, true},
      {"1+3 tokens, fp32", SC_F32, 6, 4, true},
      {"prefill of 37 tokens", SC_BF16, 3, 37, false},
  };
  // (the CUDA sizes: narrow and, aligned, wide instances; the other backends
  // do not choose by alignment: a small size, the same forms)
  using Size = std::pair<int64_t, int64_t>;
  const std::vector<Size> sizes =
      GetParam() == SC_BACKEND_CUDA ? std::vector<Size>{{8, 1024}, {64, 4096}} : std::vector<Size>{{8, 64}};
  int bad = 0;
  for (const Form& f : forms)
    for (const auto& [B, D] : sizes) {
      if (f.T > 4 && B > 8) continue;
      Case c;
      c.W = 4;
      c.S = f.S;
      c.act_dtype = c.param_dtype = c.state_dtype = f.dt;
      c.B = B;
      c.T = f.T;
      c.D = D;
      c.h0 = c.ht = c.in_place = true;
      c.pool = B + 8;
      std::vector<int64_t> rows(static_cast<size_t>(c.pool));
      for (int64_t i = 0; i < c.pool; ++i) rows[size_t(i)] = i;
      std::shuffle(rows.begin(), rows.end(), rng);
      c.h0_index.assign(rows.begin(), rows.begin() + B);
      for (int64_t n = 3; n < B; n += 7) c.h0_index[size_t(n)] = -1;
      c.ht_index = c.h0_index;
      if (f.spec)
        for (int64_t n = 0; n < B; ++n) c.accepted.push_back(1 + int64_t(rng() % uint64_t(f.T)));
      c.seed = rng();
      const Inputs in = make_inputs(c);
      const int pass = f.T > 4 ? kBoth : kForward;
      const Outputs aligned = run(c, in, GetParam(), pass);
      for (int64_t base : {1, 2, 4}) {
        Case cu = c;
        cu.state_base = base;
        const std::string why = same(run(cu, in, GetParam(), pass), aligned, true);
        EXPECT_EQ(why, "") << f.what << ": " << cu.describe();
        if (!why.empty() && ++bad >= 5) return;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, StateAddressing,
                         ::testing::Values(SC_BACKEND_REF, SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
