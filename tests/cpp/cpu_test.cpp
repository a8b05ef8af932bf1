// The fast CPU backend against the float64 oracle (SC_BACKEND_REF), through
// the C ABI, on small random problems chosen to hit every code path of
// src/cpu: register-window W (1..4) and generic W (5, 8, 16, 17), S in
// {W-1, W, W+3}, dense and packed batches (tiny and zero-length sequences),
// token-major / channel-major / strided layouts, every activation dtype with
// independent parameter and state dtypes, forced tile_t from 1 to W+2 (tiles
// narrower than the halo) and automatic, forced tile_d, in-place state pools
// with -1 indices, broadcast dy, every ISA the machine has.  Then: backward
// results bitwise identical across num_threads 1, 2, 3 and repeated runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "shortconv/shortconv.h"

namespace {

using shortconv::dtype_size;
using shortconv::load_f64;
using shortconv::store_f64;

enum Layout { TOKEN_MAJOR, CHANNEL_MAJOR, STRIDED };

struct Buf {
  std::vector<uint8_t> mem;
  sc_tensor t{};
};

// A tensor of `shape` in `dtype`, dense row-major unless strides are given;
// the buffer holds `span` elements.
Buf make(sc_dtype dt, std::vector<int64_t> shape, std::vector<int64_t> stride, int64_t span) {
  Buf b;
  b.mem.assign(size_t(std::max<int64_t>(span, 1) * dtype_size(dt)), 0);
  b.t.data = b.mem.data();
  b.t.dtype = dt;
  b.t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    b.t.shape[i] = shape[i];
    b.t.stride[i] = stride[i];
  }
  return b;
}

Buf dense(sc_dtype dt, std::vector<int64_t> shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return make(dt, shape, st, s);
}

// Activation [B, T, D] (or packed [total, D] when b == 0) in a layout.
Buf act(sc_dtype dt, int64_t B, int64_t T, int64_t D, Layout l, bool packed) {
  std::vector<int64_t> shape = packed ? std::vector<int64_t>{T, D} : std::vector<int64_t>{B, T, D};
  std::vector<int64_t> st;
  int64_t span;
  if (l == TOKEN_MAJOR) return dense(dt, shape);
  if (l == CHANNEL_MAJOR) {  // storage [B, D, T]
    st = packed ? std::vector<int64_t>{1, T} : std::vector<int64_t>{D * T, 1, T};
    span = B * D * T;
  } else {  // a slice of a fused [B, T, 3, D+1] projection with channel stride 2
    const int64_t row = 3 * 2 * (D + 1);
    st = packed ? std::vector<int64_t>{row, 2} : std::vector<int64_t>{T * row + 5, row, 2};
    span = B * (T * row + 5) + 8;
  }
  return make(dt, shape, st, span);
}

void fill(Buf& b, std::mt19937& rng, double scale = 1.0) {
  std::uniform_real_distribution<double> u(-scale, scale);
  const int64_t n = int64_t(b.mem.size()) / dtype_size(b.t.dtype);
  for (int64_t i = 0; i < n; ++i) store_f64(b.t.data, b.t.dtype, i, u(rng));
}

// Relative L2 distance over the elements a tensor describes.
double rel_l2(const sc_tensor& a, const sc_tensor& r) {
  double num = 0, den = 0;
  int64_t idx[4] = {0, 0, 0, 0};
  int64_t n = 1;
  for (int i = 0; i < a.ndim; ++i) n *= a.shape[i];
  for (int64_t e = 0; e < n; ++e) {
    int64_t rem = e, oa = 0, orr = 0;
    for (int i = a.ndim - 1; i >= 0; --i) {
      idx[i] = rem % a.shape[i];
      rem /= a.shape[i];
      oa += idx[i] * a.stride[i];
      orr += idx[i] * r.stride[i];
    }
    const double x = load_f64(a.data, a.dtype, oa), y = load_f64(r.data, r.dtype, orr);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double tol(sc_dtype dt) {
  switch (dt) {
    case SC_F64: return 1e-12;
    case SC_F32: return 1e-5;
    default: return 1e-2;
  }
}

struct Config {
  int W = 4, S = 3;
  sc_dtype adt = SC_F32, pdt = SC_F32, sdt = SC_F32;
  Layout layout = TOKEN_MAJOR;
  bool packed = false, silu = true, bias = true, residual = true, h0 = true, ht = true;
  bool dht = true, dy = true, dy_broadcast = false, pools = false, in_place = false;
  int64_t B = 2, T = 13, D = 37;
  std::vector<int64_t> seqlens;  // packed
  int64_t tile_t = 0, tile_d = 0;
  int threads = 2;
};

std::string describe(const Config& c) {
  char s[400];
  std::snprintf(s, sizeof s,
                "W=%d S=%d adt=%d pdt=%d sdt=%d layout=%d packed=%d silu=%d bias=%d res=%d h0=%d "
                "ht=%d dht=%d dy=%d bcast=%d pools=%d inplace=%d B=%lld T=%lld D=%lld tile_t=%lld "
                "tile_d=%lld",
                c.W, c.S, c.adt, c.pdt, c.sdt, c.layout, c.packed, c.silu, c.bias, c.residual, c.h0,
                c.ht, c.dht, c.dy, c.dy_broadcast, c.pools, c.in_place, (long long)c.B,
                (long long)c.T, (long long)c.D, (long long)c.tile_t, (long long)c.tile_d);
  return s;
}

// All tensors of one problem; outputs are allocated per backend.
struct Problem {
  Config c;
  int64_t N = 0, total = 0, P = 0;
  Buf x, w, bias, res, cu, h0, h0i, hti, dy, dht;
  std::vector<int64_t> rows_in, rows_out;

  explicit Problem(const Config& cfg, uint32_t seed) : c(cfg) {
    std::mt19937 rng(seed);
    if (c.packed) {
      N = int64_t(c.seqlens.size());
      total = 0;
      for (int64_t l : c.seqlens) total += l;
      cu = dense(SC_I64, {N + 1});
      int64_t acc = 0;
      static_cast<int64_t*>(cu.t.data)[0] = 0;
      for (int64_t n = 0; n < N; ++n) static_cast<int64_t*>(cu.t.data)[n + 1] = acc += c.seqlens[size_t(n)];
    } else {
      N = c.B;
    }
    const int64_t B = c.packed ? 1 : c.B, T = c.packed ? total : c.T, D = c.D;
    x = act(c.adt, B, T, D, c.layout, c.packed);
    fill(x, rng, 2.0);
    w = dense(c.pdt, {D, c.W});
    fill(w, rng, 1.0 / std::sqrt(double(c.W)));
    if (c.bias) { bias = dense(c.pdt, {D}); fill(bias, rng); }
    if (c.residual) { res = act(c.adt, B, T, D, c.layout == STRIDED ? TOKEN_MAJOR : c.layout, c.packed); fill(res, rng); }
    P = c.pools ? N + 2 : N;
    if (c.h0 || c.in_place) {
      h0 = make(c.sdt, {P, D, c.S}, {D * (c.S + 1), 1, D}, P * D * (c.S + 1));  // [P, S+1, D] storage
      fill(h0, rng);
    }
    if (c.pools) {  // a permutation of rows, with -1 entries
      h0i = dense(SC_I32, {N});
      hti = dense(SC_I64, {N});
      for (int64_t n = 0; n < N; ++n) {
        // distinct rows: a row written for n is never read for another sequence
        int32_t ri = (n % 3 == 1) ? -1 : int32_t(n + 1);
        int64_t ro = (n % 4 == 2) ? -1 : (c.in_place ? (ri >= 0 ? ri : n + 1) : (n + 2) % P);
        static_cast<int32_t*>(h0i.t.data)[n] = ri;
        static_cast<int64_t*>(hti.t.data)[n] = ro;
      }
    }
    dy = c.dy_broadcast ? make(c.adt, c.packed ? std::vector<int64_t>{T, D} : std::vector<int64_t>{B, T, D},
                               c.packed ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0, 0, 1}, D)
                        : act(c.adt, B, T, D, c.layout, c.packed);
    fill(dy, rng);
    if (c.dht) { dht = dense(c.sdt, {N, D, c.S}); fill(dht, rng); }
  }

  void args(sc_conv_args* a, int backend) const {
    sc_conv_args_init(a);
    a->width = c.W;
    a->state_len = c.S;
    a->activation = c.silu ? SC_ACT_SILU : SC_ACT_NONE;
    a->x = x.t;
    a->weight = w.t;
    if (c.bias) a->bias = bias.t;
    if (c.residual) a->residual = res.t;
    if (c.packed) a->cu_seqlens = cu.t;
    if (c.h0) a->initial_state = h0.t;
    if (c.pools) a->initial_state_indices = h0i.t;
    if (c.dy) a->dy = dy.t;
    if (c.dht) a->dfinal_state = dht.t;
    a->exec.backend = backend;
    a->exec.num_threads = c.threads;
    a->exec.tile_t = backend == SC_BACKEND_CPU ? c.tile_t : 0;
    a->exec.tile_d = backend == SC_BACKEND_CPU ? c.tile_d : 0;
  }
};

struct Outputs {
  Buf y, ht, dx, dw, db, dh0;
  std::vector<uint8_t> ws;
};

// Runs forward and backward of `pr` on `backend`.
void run(const Problem& pr, int backend, Outputs* o) {
  const Config& c = pr.c;
  const int64_t B = c.packed ? 1 : c.B, T = c.packed ? pr.total : c.T, D = c.D;
  o->y = act(c.adt, B, T, D, c.layout, c.packed);
  if (c.in_place) {
    o->ht = pr.h0;  // a copy of the pool, updated in place
    o->ht.t.data = o->ht.mem.data();
  } else if (c.ht) {
    o->ht = dense(c.sdt, {pr.P, D, c.S});
  }
  o->dx = act(c.adt, B, T, D, c.layout, c.packed);
  o->dw = dense(c.pdt, {D, c.W});
  o->db = dense(c.pdt, {D});
  o->dh0 = dense(c.sdt, {pr.N, D, c.S});
  // poison outputs: every element must be written
  for (Buf* b : {&o->y, &o->dx, &o->dw, &o->db, &o->dh0})
    for (int64_t i = 0; i < int64_t(b->mem.size()) / dtype_size(b->t.dtype); ++i)
      store_f64(b->t.data, b->t.dtype, i, 777.0);

  sc_conv_args a;
  pr.args(&a, backend);
  if (c.in_place) {
    a.initial_state = o->ht.t;
    a.final_state = o->ht.t;
    if (c.pools) a.final_state_indices = pr.hti.t;
  } else if (c.ht) {
    a.final_state = o->ht.t;
    if (c.pools) a.final_state_indices = pr.hti.t;
  }
  a.y = o->y.t;
  sc_error err;
  size_t bytes = 0;
  ASSERT_EQ(sc_forward_workspace_size(&a, &bytes, &err), SC_OK) << err.message;
  o->ws.assign(bytes + 1, 0);
  a.exec.workspace = o->ws.data();
  a.exec.workspace_bytes = bytes;
  ASSERT_EQ(sc_forward(&a, &err), SC_OK) << err.message;

  pr.args(&a, backend);
  a.dx = o->dx.t;
  a.dweight = o->dw.t;
  if (c.bias) a.dbias = o->db.t;
  a.dinitial_state = o->dh0.t;
  ASSERT_EQ(sc_backward_workspace_size(&a, &bytes, &err), SC_OK) << err.message;
  o->ws.assign(bytes + 1, 0);
  a.exec.workspace = o->ws.data();
  a.exec.workspace_bytes = bytes;
  ASSERT_EQ(sc_backward(&a, &err), SC_OK) << err.message;
}

void check(const Config& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  Problem pr(c, seed);
  Outputs ref, cpu;
  run(pr, SC_BACKEND_REF, &ref);
  run(pr, SC_BACKEND_CPU, &cpu);
  if (::testing::Test::HasFatalFailure()) return;
  const double ta = tol(c.adt);
  // Parameter / state outputs are sums over activation-precision inputs: the
  // activation dtype's tolerance applies, loosened to the stored dtype's.
  const double tp = std::max(ta, tol(c.pdt)), ts = std::max(ta, tol(c.sdt));
  EXPECT_LE(rel_l2(cpu.y.t, ref.y.t), ta) << "y";
  if (c.ht || c.in_place) EXPECT_LE(rel_l2(cpu.ht.t, ref.ht.t), ts) << "final_state";
  EXPECT_LE(rel_l2(cpu.dx.t, ref.dx.t), ta) << "dx";
  EXPECT_LE(rel_l2(cpu.dw.t, ref.dw.t), tp) << "dweight";
  if (c.bias) EXPECT_LE(rel_l2(cpu.db.t, ref.db.t), tp) << "dbias";
  EXPECT_LE(rel_l2(cpu.dh0.t, ref.dh0.t), ts) << "dinitial_state";
}

const sc_dtype kDtypes[4] = {SC_F32, SC_BF16, SC_F16, SC_F64};

// W x S x tile_t, cycling dtypes, layouts, batch kinds and optional tensors.
TEST(Cpu, MatchesOracleAcrossWidthsStatesTiles) {
  int i = 0;
  for (int W : {1, 2, 3, 4, 5, 8, 16, 17}) {
    for (int dS : {-1, 0, 3}) {
      std::vector<int64_t> tiles = {0, 1, 2, W - 1, W, W + 2};
      for (int64_t tt : tiles) {
        if (tt < 0 || (tt == 0 && i % 2)) continue;
        Config c;
        c.W = W;
        c.S = dS < 0 ? W - 1 : W + dS;
        c.tile_t = tt;
        c.adt = kDtypes[i % 4];
        c.pdt = kDtypes[(i / 4 + 1) % 4];
        c.sdt = kDtypes[(i / 2 + 2) % 4];
        c.layout = Layout(i % 3);
        c.packed = (i / 3) % 2;
        c.seqlens = {3, 0, 1, 2 * W + 5, W, 0, 7};
        c.silu = (i / 5) % 2 == 0;
        c.bias = i % 7 != 3;
        c.residual = i % 5 != 2;
        c.h0 = i % 6 != 4;
        c.dht = i % 4 != 1;
        c.T = 9 + W;
        c.D = i % 2 ? 37 : 16;
        c.tile_d = (i % 4 == 3) ? 16 : 0;
        c.threads = 1 + i % 3;
        check(c, 1000 + i);
        ++i;
      }
    }
  }
}

TEST(Cpu, InPlaceStatePoolsWithMinusOne) {
  for (int W : {1, 3, 4, 6}) {
    for (bool packed : {false, true}) {
      for (int64_t tt : {1, 2, 0}) {
        Config c;
        c.W = W;
        c.S = W + (W % 2);
        c.pools = true;
        c.in_place = true;
        c.h0 = true;
        c.packed = packed;
        c.B = 5;
        c.T = 2;  // shorter than S: ht shifts part of h0
        c.seqlens = {1, 0, 2 * W, 3, 1};
        c.tile_t = tt;
        c.adt = W == 3 ? SC_BF16 : SC_F32;
        c.sdt = W == 4 ? SC_F16 : SC_F32;
        check(c, 77 + W);
      }
    }
  }
  // fresh pools, separate output pool
  Config c;
  c.pools = true;
  c.packed = true;
  c.seqlens = {5, 0, 2, 9};
  check(c, 5);
}

TEST(Cpu, OptionalAndBroadcastInputs) {
  Config c;
  c.dy_broadcast = true;
  check(c, 1);
  c = Config();
  c.dy = false;  // dy absent = zeros: dx = dht pass-through only
  c.h0 = false;  // dh0 still requested
  check(c, 2);
  c = Config();
  c.h0 = false;
  c.ht = false;
  c.dht = false;
  c.bias = false;
  c.residual = false;
  c.silu = false;
  check(c, 3);
  c = Config();  // every sequence shorter than S
  c.W = 4;
  c.S = 9;
  c.T = 3;
  check(c, 4);
  c = Config();  // channel-major f32 and wide D with auto tiles
  c.layout = CHANNEL_MAJOR;
  c.D = 131;
  c.T = 70;
  check(c, 6);
  c.layout = TOKEN_MAJOR;
  c.T = 600;  // several automatic chunks per sequence
  c.adt = SC_BF16;
  check(c, 7);
  c = Config();  // window rings too big for the stack: they live in the workspace
  c.W = 40;
  c.S = 41;
  c.D = 300;
  c.T = 50;
  c.packed = true;
  c.seqlens = {45, 0, 3, 50};
  check(c, 8);
}

// Every ISA the machine supports (SHORTCONV_CPU_ISA lowers the choice).
TEST(Cpu, EveryIsa) {
  // restored afterwards: scripts/cpu_isa_bench.sh runs the suite under each ISA
  const char* outer = std::getenv("SHORTCONV_CPU_ISA");
  const std::string saved = outer ? outer : "";
  for (const char* isa : {"v128", "avx2", "avx512", "avx512bf16"}) {  // (x86 names: lower or absent elsewhere)
    setenv("SHORTCONV_CPU_ISA", isa, 1);
    int i = 0;
    for (int W : {1, 4, 5}) {
      for (sc_dtype dt : {SC_F32, SC_F16, SC_BF16}) {
        Config c;
        c.W = W;
        c.S = W;
        c.adt = dt;
        c.D = 37;
        c.tile_t = i % 2 ? 3 : 0;
        c.layout = Layout(i % 3);
        check(c, 300 + i);
        ++i;
      }
    }
  }
  if (outer) setenv("SHORTCONV_CPU_ISA", saved.c_str(), 1);
  else unsetenv("SHORTCONV_CPU_ISA");
}

// Backward bitwise identical across thread counts and runs.
TEST(Cpu, BackwardDeterministic) {
  for (int64_t tt : {0, 3}) {
    for (bool packed : {false, true}) {
      Config c;
      c.W = 4;
      c.S = 5;
      c.B = 3;
      c.T = 700;
      c.D = 83;
      c.packed = packed;
      c.seqlens = {400, 0, 3, 900, 1};
      c.tile_t = tt;
      Problem pr(c, 9);
      std::vector<Outputs> outs;
      for (int threads : {1, 2, 3, 2}) {
        pr.c.threads = threads;
        outs.emplace_back();
        run(pr, SC_BACKEND_CPU, &outs.back());
        if (HasFatalFailure()) return;
      }
      for (size_t r = 1; r < outs.size(); ++r) {
        EXPECT_EQ(outs[r].dx.mem, outs[0].dx.mem) << "dx, run " << r;
        EXPECT_EQ(outs[r].dw.mem, outs[0].dw.mem) << "dweight, run " << r;
        EXPECT_EQ(outs[r].db.mem, outs[0].db.mem) << "dbias, run " << r;
        EXPECT_EQ(outs[r].dh0.mem, outs[0].dh0.mem) << "dinitial_state, run " << r;
        EXPECT_EQ(outs[r].y.mem, outs[0].y.mem) << "y, run " << r;
      }
    }
  }
}

}  // namespace
