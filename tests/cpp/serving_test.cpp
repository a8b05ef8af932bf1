// Serving steps (docs/semantics.md section 5: speculative decoding, tree
// drafts) on every backend, checked against the oracle and by paths that must
// agree with each other, bitwise on one backend:
//  - a tree whose parents are the chain t-1 is the linear step;
//  - a star (every draft a child of token 0): draft t is the second token of
//    the two-token step [x_0, x_t];
//  - one token and one accepted token on rows of W-1 entries is the plain
//    decode step;
//  - speculative steps with random acceptance == replaying only the accepted
//    tokens one at a time (their outputs and the final state);
//  - a prefill and then decode steps == one whole forward;
//  - block tables == the index tensors they name; a prefix-cached restart from
//    any block snapshot == the whole prefill;
//  - the oracle at accepted counts 1 and K+1 (all accepted), pad slots
//    anywhere, chains, stars and random trees, every forced time tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "backend_param.hpp"
#include "harness/harness.hpp"
#include "harness/sweep.hpp"

namespace {

using namespace shortconv::harness;

class Serving : public BackendTest {};

int64_t pick(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + int64_t(rng() % uint64_t(hi - lo + 1));
}

// Forward on the backend under test; fails the test on a run problem.
Outputs forward(const Case& c, const Inputs& in, sc_backend b) {
  Outputs o = run(c, in, b, kForward);
  EXPECT_TRUE(o.ok()) << c.describe() << ": " << o.problems();
  return o;
}

// A dense decode-like case: B sequences of T tokens, a pool of B+2 rows
// (sequence n in row perm[n]) updated in place.
Case step_case(std::mt19937_64& rng, int W, int S, int64_t B, int64_t T, int64_t D) {
  Case c;
  c.W = W;
  c.S = S;
  c.B = B;
  c.T = T;
  c.D = D;
  c.act = rng() % 3 ? SC_ACT_SILU : SC_ACT_NONE;
  c.act_dtype = c.param_dtype = c.state_dtype = rng() % 3 == 0 ? SC_BF16 : SC_F32;
  c.bias = rng() % 2;
  c.residual = rng() % 4 == 0;
  c.h0 = c.ht = c.in_place = true;
  c.pool = B + 2;
  std::vector<int64_t> rows(size_t(c.pool));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  c.h0_index.assign(rows.begin(), rows.begin() + B);
  c.ht_index = c.h0_index;
  c.want_dx = c.want_dweight = c.want_dbias = c.want_dh0 = false;
  c.seed = rng();
  return c;
}

TEST_P(Serving, ChainTreesAreLinearDrafts) {
  std::mt19937_64 rng(4001);
  Space sp;
  sp.serving = false;
  sp.seq_ids = false;  // (serving steps take no seq_idx)
  sp.W_max = 10;
  int bad = 0;
  for (int i = 0; i < 60 && bad < 5; ++i) {
    Case c = random_case(rng, sp);
    c.want_dx = c.want_dweight = c.want_dbias = c.want_dh0 = false;
    Case ct = c;
    int64_t M = 0;
    for (int64_t n = 0; n < c.num_seqs(); ++n) M = std::max(M, c.seq_len(n));
    ct.parent_cols = M + int64_t(rng() % 2);
    for (int64_t n = 0; n < c.num_seqs(); ++n)
      for (int64_t t = 0; t < ct.parent_cols; ++t) ct.parents.push_back(t - 1);
    const Inputs in = make_inputs(c);
    const Outputs lin = forward(c, in, GetParam()), tree = forward(ct, in, GetParam());
    const bool same = bit_equal(lin.y, tree.y) && bit_equal(lin.ht, tree.ht);
    EXPECT_TRUE(same) << ct.describe();
    bad += !same;
  }
}

TEST_P(Serving, StarDraftsAreTwoTokenSteps) {
  std::mt19937_64 rng(4002);
  for (int i = 0; i < 12; ++i) {
    const int W = int(pick(rng, 2, 7));
    const int64_t B = pick(rng, 1, 3), T = pick(rng, 2, 6), D = pick(rng, 1, 20);
    Case c = step_case(rng, W, W - 1 + int(rng() % 2), B, T, D);
    c.residual = false;
    c.parent_cols = T;
    for (int64_t n = 0; n < B; ++n)
      for (int64_t t = 0; t < T; ++t) c.parents.push_back(t == 0 ? -1 : 0);
    const Inputs in = make_inputs(c);
    const Outputs star = forward(c, in, GetParam());
    Case c2 = c;  // [x_0, x_t] from the same state, without parents
    c2.T = 2;
    c2.parents.clear();
    c2.parent_cols = 0;
    for (int64_t t = 1; t < T; ++t) {
      Inputs in2 = make_inputs(c2);
      in2.weight = in.weight;
      in2.bias = in.bias;
      in2.h0 = in.h0;
      for (int64_t n = 0; n < B; ++n)
        for (int64_t k = 0; k < 2; ++k)
          for (int64_t d = 0; d < D; ++d)
            in2.x[size_t((n * 2 + k) * D + d)] = in.x[size_t((n * T + (k ? t : 0)) * D + d)];
      const Outputs two = forward(c2, in2, GetParam());
      for (int64_t n = 0; n < B; ++n)
        for (int64_t d = 0; d < D; ++d) {
          const double a = star.y[size_t((n * T + t) * D + d)], b = two.y[size_t((n * 2 + 1) * D + d)];
          ASSERT_TRUE(bit_equal({a}, {b})) << c.describe() << " draft " << t << ": " << a << " vs " << b;
        }
    }
  }
}

TEST_P(Serving, OneAcceptedTokenIsThePlainStep) {
  std::mt19937_64 rng(4003);
  for (int i = 0; i < 20; ++i) {
    const int W = int(pick(rng, 1, 9));
    Case c = step_case(rng, W, W - 1, pick(rng, 1, 4), 1, pick(rng, 1, 24));
    if (i % 3 == 0) {  // pad slots anywhere, reading and writing nothing
      c.pad_index = c.pool + 3;
      c.h0_index[size_t(i / 3) % c.h0_index.size()] = c.pad_index;
      c.ht_index = c.h0_index;
    }
    Case cs = c;
    for (int64_t n = 0; n < c.B; ++n) cs.accepted.push_back(c.h0_row(n) >= 0 ? 1 : 1000);
    const Inputs in = make_inputs(c);
    const Outputs plain = forward(c, in, GetParam()), spec = forward(cs, in, GetParam());
    EXPECT_TRUE(bit_equal(plain.y, spec.y)) << cs.describe();
    EXPECT_TRUE(bit_equal(plain.ht, spec.ht)) << cs.describe();
  }
}

// Rows of (W-1) + (T-1) entries, T = K+1 tokens per step, acceptance drawn at
// random (1 .. T, all accepted included): the outputs of accepted tokens and
// the state after the last step equal the plain decode of the accepted tokens
// one at a time on rows of W-1 entries.
TEST_P(Serving, SpeculativeStepsEqualReplayingTheAcceptedTokens) {
  std::mt19937_64 rng(4004);
  for (int i = 0; i < 8; ++i) {
    const int W = int(pick(rng, 2, 6));
    const int64_t T = pick(rng, 1, 5), B = pick(rng, 1, 4), D = pick(rng, 1, 17);
    const int S = W - 2 + int(T) + int(i % 2);  // vLLM's rows, and one entry longer
    Case spec = step_case(rng, W, S, B, T, D);
    Case plain = spec;
    plain.S = W - 1;
    plain.T = 1;
    Inputs in_spec = make_inputs(spec);
    Inputs in_plain = make_inputs(plain);
    in_plain.weight = in_spec.weight;
    in_plain.bias = in_spec.bias;
    in_plain.residual.clear();
    spec.residual = plain.residual = false;
    in_spec.residual.clear();
    // the plain state is the spec row's first W-1 entries (the window of a = 1)
    for (int64_t r = 0; r < spec.pool; ++r)
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < W - 1; ++j)
          in_plain.h0[size_t((r * D + d) * (W - 1) + j)] = in_spec.h0[size_t((r * D + d) * S + j)];
    std::vector<int64_t> accepted(size_t(B), 1);
    for (int step = 0; step < 4; ++step) {
      Case cs = spec;
      cs.accepted = accepted;
      cs.seed = rng();
      Inputs is = in_spec;
      is.x = make_inputs(cs).x;  // this step's drafts
      const Outputs got = forward(cs, is, GetParam());
      in_spec.h0 = got.ht;
      for (int64_t n = 0; n < B; ++n)  // all accepted, one, or anything between
        accepted[size_t(n)] = step % 3 == 0 ? T : step % 3 == 1 ? 1 : pick(rng, 1, T);
      for (int64_t t = 0; t < T; ++t) {  // replay draft t of the sequences that accepted it
        Case cp = plain;
        for (int64_t n = 0; n < B; ++n)
          if (t >= accepted[size_t(n)]) cp.h0_index[size_t(n)] = cp.ht_index[size_t(n)] = -1;
        Inputs ip = in_plain;
        ip.x.assign(size_t(B * D), 0.0);
        for (int64_t n = 0; n < B; ++n)
          for (int64_t d = 0; d < D; ++d) ip.x[size_t(n * D + d)] = is.x[size_t((n * T + t) * D + d)];
        const Outputs ref = forward(cp, ip, GetParam());
        in_plain.h0 = ref.ht;
        for (int64_t n = 0; n < B; ++n) {
          if (t >= accepted[size_t(n)]) continue;
          for (int64_t d = 0; d < D; ++d)
            ASSERT_TRUE(bit_equal({got.y[size_t((n * T + t) * D + d)]}, {ref.y[size_t(n * D + d)]}))
                << cs.describe() << " step " << step << " sequence " << n << " draft " << t;
        }
      }
    }
    // the state: the window of the last acceptance equals the replayed state
    for (int64_t n = 0; n < B; ++n) {
      const int64_t r = spec.h0_index[size_t(n)], a = accepted[size_t(n)];
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < W - 1; ++j)
          ASSERT_TRUE(bit_equal({in_spec.h0[size_t((r * D + d) * S + a - 1 + j)]},
                                {in_plain.h0[size_t((r * D + d) * (W - 1) + j)]}))
              << spec.describe() << " sequence " << n << " entry " << j;
    }
  }
}

TEST_P(Serving, PrefillThenDecodeStepsIsOneWholeForward) {
  std::mt19937_64 rng(4005);
  for (int i = 0; i < 10; ++i) {
    const int W = int(pick(rng, 1, 8));
    const int S = W - 1 + int(rng() % 3);
    const int64_t B = pick(rng, 1, 3), L = pick(rng, 0, 40), steps = pick(rng, 1, 5);
    const int64_t D = i % 2 ? pick(rng, 1, 20) : 16 * pick(rng, 1, 3);
    Case whole = step_case(rng, W, S, B, L + steps, D);
    whole.residual = false;
    const Inputs in = make_inputs(whole);
    const Outputs ref = forward(whole, in, GetParam());
    Inputs ic = in;  // the prefill of L tokens, then `steps` decode steps of one token, in place
    std::vector<double> y(size_t(B * (L + steps) * D), 0.0);
    for (int64_t k = -1; k < steps; ++k) {
      Case c = whole;
      c.T = k < 0 ? L : 1;
      const int64_t t0 = k < 0 ? 0 : L + k;
      ic.x.assign(size_t(B * c.T * D), 0.0);
      for (int64_t n = 0; n < B; ++n)
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t d = 0; d < D; ++d)
            ic.x[size_t((n * c.T + t) * D + d)] = in.x[size_t((n * (L + steps) + t0 + t) * D + d)];
      const Outputs o = forward(c, ic, GetParam());
      ic.h0 = o.ht;
      for (int64_t n = 0; n < B; ++n)
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t d = 0; d < D; ++d)
            y[size_t((n * (L + steps) + t0 + t) * D + d)] = o.y[size_t((n * c.T + t) * D + d)];
    }
    EXPECT_TRUE(bit_equal(y, ref.y)) << whole.describe() << " prefill " << L;
    EXPECT_TRUE(bit_equal(ic.h0, ref.ht)) << whole.describe() << " prefill " << L;
  }
}

// The oracle: speculative and tree steps over random cases (states, pools with
// -1 and pad entries, flags, packed batches) at every forced time tile.
TEST_P(Serving, MatchesTheOracleAtEveryTile) {
  std::mt19937_64 rng(4006);
  Space sp;
  sp.W_max = 12;
  int bad = 0, ran = 0;
  for (int i = 0; i < 400 && bad < 5 && ran < 120; ++i) {
    Case c = random_case(rng, sp);
    if (!c.serving()) continue;
    ++ran;
    c.tile_t = 1 + ran % (c.W + 3);
    const Inputs in = make_inputs(c);
    const Outputs ref = run(c, in, SC_BACKEND_REF, kForward);
    const Outputs got = run(c, in, GetParam(), kForward);
    std::string why = compare(c, got, ref);
    if (!ref.ok()) why += "oracle: " + ref.problems();
    EXPECT_EQ(why, "") << c.describe();
    bad += !why.empty();
  }
  EXPECT_GE(ran, 100);
}

// Decode-shaped steps (at most 16 tokens per sequence, W <= 4, states of x's
// dtype): automatic tiles give the bits of every forced time tile (semantics
// section 6).  On the CPU that is its decode kernel (cpu_kernels_decode.hpp)
// against the tile path, over each rule the kernel implements: vLLM and [P, D,
// S] rows, in place or into other rows, rings, accepted counts, flags, -1 and
// pad slots, packed batches with zero-length sequences, channel-major and
// strided x, every dtype, S from W-1 to W+4, channels past the last full vector.
TEST_P(Serving, DecodeStepsEqualTheTiledForward) {
  std::mt19937_64 rng(4017);
  const sc_dtype dtypes[] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  const Layout layouts[] = {Layout::token_major, Layout::channel_major, Layout::strided};
  for (int i = 0; i < 160; ++i) {
    const int W = int(pick(rng, 1, 4));
    const int64_t T = pick(rng, 1, 6), B = pick(rng, 1, 7);
    const bool spec = i % 3 == 1;  // rows of (W-2) + T entries at least
    const int S = spec ? std::max(W - 2 + int(T), 0) + int(pick(rng, 0, 1)) : W - 1 + int(pick(rng, 0, 4));
    Case c = step_case(rng, W, S, B, T, pick(rng, 1, 40));
    c.act_dtype = c.state_dtype = dtypes[rng() % 4];
    c.param_dtype = dtypes[rng() % 4];
    c.layout = layouts[rng() % 3];
    c.state_transposed = rng() % 2;  // vLLM's rows: the channel axis contiguous
    c.bias = rng() % 2;
    c.residual = rng() % 3 == 0;
    c.act = rng() % 2 ? SC_ACT_SILU : SC_ACT_NONE;
    if (rng() % 3 == 0) {  // into other rows of the pool
      c.in_place = false;
      c.pool = 2 * B + 2;
      for (int64_t n = 0; n < B; ++n) c.ht_index[size_t(n)] = B + 2 + n;
    }
    if (rng() % 4 == 0) {  // packed, zero-length sequences among them
      c.packed = true;
      for (int64_t n = 0; n < B; ++n) c.lengths.push_back(spec ? T : pick(rng, 0, T));
    }
    c.pad_index = c.pool + 5;
    for (int64_t n = 0; n < B; ++n)
      if (rng() % 4 == 0) c.h0_index[size_t(n)] = c.ht_index[size_t(n)] = rng() % 2 ? -1 : c.pad_index;
    if (spec) {
      for (int64_t n = 0; n < B; ++n) c.accepted.push_back(pick(rng, 1, std::min<int64_t>(T, S - W + 2)));
    } else if (rng() % 3 == 0 && S > 0) {
      for (int64_t n = 0; n < B; ++n) c.ring.push_back(pick(rng, 0, 3 * S));
    }
    if (rng() % 4 == 0)
      for (int64_t n = 0; n < B; ++n) c.has_h0.push_back(rng() % 3 != 0);
    const Inputs in = make_inputs(c);
    const Outputs whole = forward(c, in, GetParam());
    const Outputs ref = run(c, in, SC_BACKEND_REF, kForward);
    EXPECT_EQ(compare(c, whole, ref), "") << c.describe();
    for (int64_t tile_t : {int64_t(1), pick(rng, 2, W + 3)}) {
      Case ct = c;
      ct.tile_t = tile_t;
      const Outputs tiled = forward(ct, in, GetParam());
      EXPECT_TRUE(bit_equal(whole.y, tiled.y)) << ct.describe();
      EXPECT_TRUE(bit_equal(whole.ht, tiled.ht)) << ct.describe();
    }
  }
}

// Accepted counts at both ends (1 and T: all accepted) with pad slots and -1
// rows anywhere; counts of sequences that read no row are garbage.
TEST_P(Serving, AcceptedCountsAtBothEndsAndPadSlots) {
  std::mt19937_64 rng(4007);
  for (int i = 0; i < 24; ++i) {
    const int W = int(pick(rng, 2, 6));
    const int64_t T = pick(rng, 1, 5), B = pick(rng, 2, 6);
    Case c = step_case(rng, W, W - 2 + int(T), B, T, pick(rng, 1, 20));
    c.pad_index = i % 2 ? -7 : c.pool + 1;
    for (int64_t n = 0; n < B; ++n) {
      if (rng() % 3 == 0) c.h0_index[size_t(n)] = c.ht_index[size_t(n)] = rng() % 2 ? -1 : c.pad_index;
      c.accepted.push_back(c.h0_row(n) < 0 ? int64_t(rng() % 50) - 25 : (n + i) % 2 ? 1 : T);
    }
    if (i % 4 == 0) {  // with a tree
      c.parent_cols = T;
      for (int64_t n = 0; n < B; ++n)
        for (int64_t t = 0; t < T; ++t) c.parents.push_back(t ? pick(rng, 0, t - 1) : -1);
    }
    const Inputs in = make_inputs(c);
    const Outputs ref = run(c, in, SC_BACKEND_REF, kForward);
    const Outputs got = run(c, in, GetParam(), kForward);
    EXPECT_EQ(compare(c, got, ref), "") << c.describe();
  }
}

// zero_padded_outputs (semantics section 5, causal-conv1d's padded rows): every
// output of a padded sequence (its indices -1 or the pad index) is +0, every
// other output and the pool are bitwise those of the call without it, and the
// oracle agrees.  Dense steps of 1..4 tokens on [P, D, S] and vLLM rows (the
// CUDA plain step's shape, W = 4, S = 3, one token, among them: it zeroes them
// itself; the others take a second kernel) and packed prefills.
TEST_P(Serving, ZeroPaddedOutputs) {
  std::mt19937_64 rng(4013);
  for (int i = 0; i < 30; ++i) {
    const bool plain = i % 3 == 0;
    const int W = plain ? 4 : int(pick(rng, 2, 6));
    const int64_t T = plain ? 1 : pick(rng, 1, 4), B = pick(rng, 2, 9);
    const int S = plain ? 3 : W - 1 + int(pick(rng, 0, 2));
    Case c = step_case(rng, W, S, B, T, plain ? 8 * pick(rng, 1, 4) : pick(rng, 1, 20));
    c.state_transposed = i % 2;
    c.pad_index = i % 4 < 2 ? -1 : c.pool + 1;
    for (int64_t n = 0; n < B; ++n)
      if (rng() % 3 == 0) c.h0_index[size_t(n)] = c.ht_index[size_t(n)] = rng() % 2 ? -1 : c.pad_index;
    if (i % 5 == 4) {  // a packed prefill of B sequences
      c.packed = true;
      c.lengths.clear();
      for (int64_t n = 0; n < B; ++n) c.lengths.push_back(pick(rng, 0, 6));
      c.B = 1;
    }
    Case z = c;
    z.zero_pads = true;
    const Inputs in = make_inputs(c);
    const Outputs computed = forward(c, in, GetParam());
    const Outputs zeroed = forward(z, in, GetParam());
    const Outputs ref = run(z, in, SC_BACKEND_REF, kForward);
    EXPECT_EQ(compare(z, zeroed, ref), "") << z.describe();
    EXPECT_TRUE(bit_equal(zeroed.ht, computed.ht)) << z.describe();
    ASSERT_EQ(zeroed.y.size(), computed.y.size());
    const int64_t D = c.D;
    int64_t t0 = 0;
    for (int64_t n = 0; n < B; ++n) {
      const int64_t L = c.packed ? c.lengths[size_t(n)] : T;
      const int64_t first = c.packed ? t0 : n * T;  // the sequence's first token row of y
      const bool padded = c.h0_row(n) < 0 && c.ht_row(n) < 0;
      for (int64_t e = first * D; e < (first + L) * D; ++e) {
        const double v = zeroed.y[size_t(e)], u = computed.y[size_t(e)];
        if (padded)
          EXPECT_TRUE(v == 0.0 && !std::signbit(v)) << z.describe() << " n=" << n << " y=" << v;
        else
          EXPECT_TRUE(std::memcmp(&v, &u, sizeof v) == 0) << z.describe() << " n=" << n;
      }
      t0 += L;
    }
  }
}

// zero_padded_outputs is forward-only, 0 or 1, and needs state indices: clear
// errors naming it on every backend, nothing written.
TEST_P(Serving, ZeroPaddedOutputsArgumentsAreChecked) {
  std::mt19937_64 rng(4014);
  Case c = step_case(rng, 4, 3, 3, 1, 8);
  c.zero_pads = true;
  const Inputs in = make_inputs(c);
  Case bwd = c;
  bwd.want_dx = true;
  const Outputs b = run(bwd, in, GetParam(), kBackward);
  EXPECT_EQ(b.status, SC_ERR_UNSUPPORTED) << b.error;
  EXPECT_NE(b.error.find("zero_padded_outputs"), std::string::npos) << b.error;
  Case dense = c;  // no pool: no indices to say which sequences are padded
  dense.pool = 0;
  dense.h0_index.clear();
  dense.ht_index.clear();
  const Outputs d = run(dense, make_inputs(dense), GetParam(), kForward);
  EXPECT_EQ(d.status, SC_ERR_INVALID_ARGUMENT) << d.error;
  EXPECT_NE(d.error.find("zero_padded_outputs"), std::string::npos) << d.error;
  EXPECT_EQ(d.stray, 0);
}

// A dense step's lengths are its shape (T each): rows too short for its tokens
// are refused on every backend, device memory included (only a packed step's
// lengths are device contents, which the CUDA kernels clamp: section 7).
TEST_P(Serving, RowsTooShortForADenseStepAreRefused) {
  std::mt19937_64 rng(4010);
  Case c = step_case(rng, 4, 3, 3, 2, 8);  // W = 4, S = 3 < (W-2) + T = 4
  c.accepted = {1, 1, 1};
  const Outputs o = run(c, make_inputs(c), GetParam(), kForward);
  EXPECT_EQ(o.status, SC_ERR_INVALID_ARGUMENT) << o.error;
  EXPECT_NE(o.error.find("(W-2) + T = 4 entries, but S = 3"), std::string::npos) << o.error;
}

// A block table is the index tensors it names: rows block_table[n, initial_block[n]]
// and block_table[n, final_block[n]] (speculative and tree steps too), bitwise.
TEST_P(Serving, BlockTablesAreTheIndicesTheyName) {
  std::mt19937_64 rng(4008);
  for (int i = 0; i < 20; ++i) {
    const int W = int(pick(rng, 1, 6));
    const int64_t T = pick(rng, 1, 5), B = pick(rng, 1, 4), M = pick(rng, 1, 4);
    Case c = step_case(rng, W, W - 2 + int(T) + int(rng() % 2), B, T, pick(rng, 1, 20));
    c.pool = B * M + 1;
    std::vector<int64_t> rows(static_cast<size_t>(c.pool));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    Case ct = c;
    ct.table_cols = M;
    ct.block_table.assign(rows.begin(), rows.begin() + B * M);
    for (int64_t n = 0; n < B; ++n) {
      if (rng() % 5 == 0) ct.block_table[size_t(n * M + rng() % uint64_t(M))] = -1;
      ct.initial_block.push_back(int64_t(rng() % uint64_t(M)));
      ct.final_block.push_back(ct.initial_block.back());  // in place: its own row
      c.h0_index[size_t(n)] = ct.block_table[size_t(n * M + ct.initial_block.back())];
      c.ht_index[size_t(n)] = c.h0_index[size_t(n)];
    }
    if (i % 3 == 1)
      for (int64_t n = 0; n < B; ++n) c.accepted.push_back(1 + int64_t(rng() % uint64_t(T)));
    if (i % 3 == 2) {
      c.parent_cols = T;
      for (int64_t n = 0; n < B; ++n)
        for (int64_t t = 0; t < T; ++t) c.parents.push_back(t ? int64_t(rng() % uint64_t(t)) : -1);
    }
    ct.accepted = c.accepted;
    ct.parents = c.parents;
    ct.parent_cols = c.parent_cols;
    const Inputs in = make_inputs(c);
    const Outputs a = forward(c, in, GetParam()), b = forward(ct, in, GetParam());
    EXPECT_TRUE(bit_equal(a.y, b.y) && bit_equal(a.ht, b.ht)) << ct.describe();
  }
}

// Prefix caching: a prefill of T tokens with a snapshot at every block boundary,
// then a restart from each snapshot (the chunk starting at that boundary, from
// the row of the block before it): its outputs, its final state and the later
// snapshots equal the whole run's, bitwise.
TEST_P(Serving, PrefixCachedRestartsEqualTheWholeRun) {
  std::mt19937_64 rng(4009);
  for (int i = 0; i < 8; ++i) {
    const int W = int(pick(rng, 1, 6));
    const int S = W - 1 + int(rng() % 3);
    const int64_t Bk = pick(rng, 1, 5), N = pick(rng, 1, 3), D = pick(rng, 1, 20);
    const int64_t T = pick(rng, Bk + 1, 5 * Bk + 3), M = T / Bk + 2;
    Case whole = step_case(rng, W, S, N, T, D);
    whole.h0 = whole.in_place = false;  // a fresh prefill: no initial state
    whole.residual = false;
    whole.pool = N * M;
    std::vector<int64_t> rows(static_cast<size_t>(whole.pool));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    whole.table_cols = M;
    whole.block_table = rows;
    whole.block_size = Bk;
    for (int64_t n = 0; n < N; ++n) {
      whole.initial_block.push_back(0);
      whole.final_block.push_back((T - 1) / Bk);
      whole.first_block.push_back(0);
      whole.computed.push_back(0);
    }
    const Inputs in = make_inputs(whole);
    const Outputs ref = forward(whole, in, GetParam());
    for (int64_t m = 1; m * Bk < T; ++m) {
      Case rest = whole;  // from the snapshot of block m-1, in place on the whole run's pool
      rest.h0 = rest.in_place = true;
      rest.T = T - m * Bk;
      for (int64_t n = 0; n < N; ++n) {
        rest.initial_block[size_t(n)] = m - 1;
        rest.first_block[size_t(n)] = m;
        rest.computed[size_t(n)] = m * Bk;
      }
      Inputs ir = make_inputs(rest);
      ir.weight = in.weight;
      ir.bias = in.bias;
      ir.h0 = ref.ht;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < rest.T; ++t)
          for (int64_t d = 0; d < D; ++d)
            ir.x[size_t((n * rest.T + t) * D + d)] = in.x[size_t((n * T + m * Bk + t) * D + d)];
      const Outputs got = forward(rest, ir, GetParam());
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = 0; t < rest.T; ++t)
          for (int64_t d = 0; d < D; ++d)
            ASSERT_TRUE(bit_equal({got.y[size_t((n * rest.T + t) * D + d)]},
                                  {ref.y[size_t((n * T + m * Bk + t) * D + d)]}))
                << rest.describe() << " restart at block " << m;
      EXPECT_TRUE(bit_equal(got.ht, ref.ht)) << rest.describe() << " restart at block " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Serving,
                         ::testing::Values(SC_BACKEND_REF, SC_BACKEND_CPU, SC_BACKEND_CUDA),
                         backend_param_name);

}  // namespace
