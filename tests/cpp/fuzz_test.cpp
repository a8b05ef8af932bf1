// Property-based fuzzing of the C ABI (docs/semantics.md §7 and "Threat model").
//
// Each iteration draws a random description -- shapes (0 included), layouts
// (any dim order, padding, broadcast inputs), dtypes, optional tensors, state
// pools, in-place updates, packed batches, tiles, threads, values from normal
// to huge, tiny, subnormal, infinite and NaN -- then applies up to three
// hostile mutations: negative / huge / mismatched shapes and strides, bad
// dtype codes and ranks, NULL pointers, outputs aliasing inputs or each other
// or themselves, invalid cu_seqlens and index contents, out-of-range scalars
// (width, state_len, activation, backend, threads, tiles, struct_size),
// seq_idx (runs, padding, ids past the rows, second runs), missing or short
// workspaces, and consistent but enormous broadcast inputs
// (2^40 sequences, whose scratch overflows).  Exactly two outcomes are
// allowed for sc_forward / sc_backward on the CPU backend:
//   * an error status with a message, and not one byte of any buffer changed;
//   * SC_OK, every output equal to the float64 oracle run on the same
//     description (same NaN / infinity classes, finite parts within the
//     tolerance of the output dtype), and no byte outside the outputs' elements
//     changed.
// The oracle must agree on the status.  Descriptions whose work is too large
// to run are only validated and sized (no crash, consistent statuses).
//
// Time-bounded: SHORTCONV_FUZZ_SECONDS (default 4) and SHORTCONV_FUZZ_SEED
// (default fixed, so a failure reproduces); CI runs it longer under
// ASan + UBSan (scripts/sanitize.sh).  A failure prints the seed and the
// iteration's description; SHORTCONV_FUZZ_DUMP=<iteration> also prints that
// iteration's input values and both backends' outputs, SHORTCONV_FUZZ_VERBOSE
// every description before it runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "harness/harness.hpp"
#include "shortconv/shortconv.h"

namespace {

using shortconv::dtype_size;
using shortconv::load_f64;
using shortconv::store_f64;

constexpr uint8_t kSentinel = 0x5A;  // output bytes before a call
constexpr int kTensors = 24;         // sc_conv_args tensor fields, in header order

// The tensor fields of sc_conv_args in header order, with their roles.
struct Field {
  const char* name;
  sc_tensor sc_conv_args::*member;
  bool output_fwd, output_bwd;
};
const Field kFields[kTensors] = {
    {"x", &sc_conv_args::x, false, false},
    {"weight", &sc_conv_args::weight, false, false},
    {"bias", &sc_conv_args::bias, false, false},
    {"residual", &sc_conv_args::residual, false, false},
    {"cu_seqlens", &sc_conv_args::cu_seqlens, false, false},
    {"initial_state", &sc_conv_args::initial_state, false, false},
    {"initial_state_indices", &sc_conv_args::initial_state_indices, false, false},
    {"y", &sc_conv_args::y, true, false},
    {"final_state", &sc_conv_args::final_state, true, false},
    {"final_state_indices", &sc_conv_args::final_state_indices, false, false},
    {"dy", &sc_conv_args::dy, false, false},
    {"dfinal_state", &sc_conv_args::dfinal_state, false, false},
    {"dx", &sc_conv_args::dx, false, true},
    {"dweight", &sc_conv_args::dweight, false, true},
    {"dbias", &sc_conv_args::dbias, false, true},
    {"dinitial_state", &sc_conv_args::dinitial_state, false, true},
    {"seq_idx", &sc_conv_args::seq_idx, false, false},
    {"num_accepted", &sc_conv_args::num_accepted, false, false},
    {"parent_tokens", &sc_conv_args::parent_tokens, false, false},
    {"block_table", &sc_conv_args::block_table, false, false},
    {"initial_block", &sc_conv_args::initial_block, false, false},
    {"final_block", &sc_conv_args::final_block, false, false},
    {"first_block", &sc_conv_args::first_block, false, false},
    {"computed_tokens", &sc_conv_args::computed_tokens, false, false},
};
enum FieldId { X, WEIGHT, BIAS, RES, CU, H0, H0I, Y, HT, HTI, DY, DHT, DX, DW, DB, DH0, SID, ACC,
               PAR, TBL, IBLK, FBLK, FSTB, CMPT };
// 1-D index tensors (contiguous or stride 2) and the 2-D ones (row-major, padded rows).
bool index_1d(int f) { return f == CU || f == H0I || f == HTI || f == ACC || f == IBLK ||
                              f == FBLK || f == FSTB || f == CMPT; }
bool index_2d(int f) { return f == PAR || f == TBL; }

// One iteration's memory: an arena per tensor (aliasing mutations may point a
// tensor into another's arena), large enough for any tensor of the iteration.
struct World {
  sc_conv_args a{};
  bool fwd = true;
  std::vector<std::vector<uint8_t>> arena;  // [kTensors]
  int home[kTensors] = {};                  // arena a tensor's data lies in (-1: none / NULL)
  int64_t offset[kTensors] = {};            // its byte offset there
  std::string log;                          // the description, for failure messages

  sc_tensor& t(int f) { return a.*kFields[f].member; }
  const sc_tensor& t(int f) const { return a.*kFields[f].member; }
  bool is_output(int f) const { return fwd ? kFields[f].output_fwd : kFields[f].output_bwd; }
};

int64_t extent_elems(const sc_tensor& t) {  // max element offset + 1, 0 when empty
  if (t.ndim <= 0) return 0;
  const int nd = t.ndim < SC_MAX_DIMS ? t.ndim : SC_MAX_DIMS;
  for (int i = 0; i < nd; ++i)  // empty first: an empty tensor's other strides may be huge
    if (t.shape[i] <= 0) return 0;
  int64_t e = 0;  // saturates at INT64_MAX: a mutated view's strides may be enormous
  for (int i = 0; i < nd; ++i) {
    int64_t step = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &step) ||
        __builtin_add_overflow(e, step, &e))
      return INT64_MAX;
  }
  return e < INT64_MAX ? e + 1 : e;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  int64_t uni(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(g_) < p; }
  template <class T>
  T pick(std::initializer_list<T> v) { return *(v.begin() + uni(0, int64_t(v.size()) - 1)); }
  double normal() { return std::normal_distribution<double>(0, 1)(g_); }
  std::mt19937_64& gen() { return g_; }

 private:
  std::mt19937_64 g_;
};

// A value for a float input: mostly normal, sometimes extreme.  Finite
// magnitudes stay <= 1e15 so that no fp32 partial sum of products overflows
// (fp32 accumulation is the contract; the oracle accumulates in fp64).
// Infinities only where a factor that fp32 may round to 0 cannot meet them:
// an infinite dy times silu'(pre) is inf in fp64 but inf * 0 = NaN once the
// fp32 silu'(pre) underflows (pre in (-750, -88)), a legitimate difference.
// (fp16 storage turns magnitudes above 65504 into infinities too.)
double draw_value(Rng& r, bool extremes, bool allow_inf, sc_dtype dt) {
  if (!extremes || !r.chance(0.15)) return r.normal();
  const double inf = std::numeric_limits<double>::infinity();
  double v = r.pick<double>({0.0, 1e-40, 1e-30, 3e-8, 1e-3, 1e4, 6e4, 1e10, 1e15, inf,
                             std::nan("")});
  if (!allow_inf && std::isinf(v)) v = 1e15;
  if (!allow_inf && dt == SC_F16 && v > 6e4) v = 6e4;
  // A random mantissa: two extremes of one magnitude class must not cancel
  // exactly, which would leave a sum of small terms that fp32 accumulation
  // absorbed earlier into the large partial sum (legitimately far from fp64).
  if (std::isfinite(v) && v > 1.0) v *= std::uniform_real_distribution<double>(0.5, 1.0)(r.gen());
  return r.chance(0.5) ? -v : v;
}

// Strides for `shape` with the dims laid out in a random order, random padding.
void layout(Rng& r, sc_tensor& t, bool allow_broadcast) {
  int order[SC_MAX_DIMS] = {0, 1, 2, 3};
  std::shuffle(order, order + t.ndim, r.gen());
  int64_t s = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    const int d = order[k];
    t.stride[d] = s;
    s *= std::max<int64_t>(t.shape[d], 1) + (r.chance(0.2) ? r.uni(1, 2) : 0);
  }
  if (allow_broadcast && r.chance(0.1)) t.stride[r.uni(0, t.ndim - 1)] = 0;  // (ndim 1..3 here)
}

sc_tensor desc(sc_dtype dt, std::initializer_list<int64_t> shape) {
  sc_tensor t{};
  t.dtype = dt;
  t.ndim = int32_t(shape.size());
  int i = 0;
  for (int64_t v : shape) t.shape[i++] = v;
  return t;
}

// Sequence ids for the dense batch [B, T] of w (docs/semantics.md section 3):
// runs of 1..5 tokens, padding runs, ids below the rows of every state tensor
// (each reshaped to a pool [rows, D, S] by id; no state indices), each id in
// one run when a final state or a state gradient is present.
void draw_ids(Rng& r, World& w, int64_t B, int64_t T, int64_t D, sc_dtype Z, int Sv, sc_dtype I,
              std::vector<int64_t>* ids) {
  sc_conv_args& a = w.a;
  const int64_t rows = r.uni(0, 4);
  for (sc_tensor* t : {&a.initial_state, &a.final_state, &a.dfinal_state, &a.dinitial_state})
    if (t->ndim) *t = desc(Z, {rows, D, Sv});
  a.initial_state_indices.ndim = a.final_state_indices.ndim = 0;
  const bool any_state = a.initial_state.ndim || a.final_state.ndim || a.dfinal_state.ndim ||
                         a.dinitial_state.ndim;
  const bool unique =
      w.fwd ? a.final_state.ndim != 0 : a.dfinal_state.ndim || a.dinitial_state.ndim;
  const int64_t limit = any_state ? rows : 1000;  // ids must name rows of every state tensor
  int64_t next = 0;
  ids->clear();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T;) {
      int64_t id = -r.uni(1, 3);
      if (!r.chance(0.25) && (unique ? next < limit : limit > 0))
        id = unique ? next++ : r.uni(0, std::min<int64_t>(limit, 6) - 1);
      for (int64_t k = r.uni(1, 5); k > 0 && t < T; --k, ++t) ids->push_back(id);
    }
  a.seq_idx = desc(I, {B, T});
}

// A random valid description (layouts and contents), before mutations.
void draw_valid(Rng& r, World& w) {
  sc_conv_args& a = w.a;
  sc_conv_args_init(&a);
  w.fwd = r.chance(0.5);
  const int W = r.chance(0.9) ? int(r.uni(1, 6)) : int(r.uni(7, 40));
  int S = r.chance(0.3) ? -1 : int(std::max<int64_t>(0, W - 1 + r.uni(0, 3)));
  int Sv = S < 0 ? W - 1 : S;
  const sc_dtype all[4] = {SC_F32, SC_F16, SC_BF16, SC_F64};
  const sc_dtype A = all[r.uni(0, 3)], P = all[r.uni(0, 3)], Z = all[r.uni(0, 3)];
  const sc_dtype I = r.chance(0.5) ? SC_I32 : SC_I64;
  const int64_t D = r.chance(0.05) ? 0 : r.uni(1, 9);
  const bool packed = r.chance(0.4);
  std::vector<int64_t> cu = {0};
  int64_t B, T, N;
  if (packed) {
    N = r.uni(0, 5);
    for (int64_t n = 0; n < N; ++n) cu.push_back(cu.back() + (r.chance(0.2) ? 0 : r.uni(1, 9)));
    B = 1;
    T = cu.back();
  } else {
    B = r.chance(0.05) ? 0 : r.uni(1, 3);
    T = r.chance(0.05) ? 0 : r.uni(1, 12);
    N = B;
  }
  // Serving steps (forward and backward: the backward refuses them): rows long
  // enough for the longest sequence mostly, counts and parents mostly valid.
  int64_t longest = packed ? 0 : T;
  for (size_t n = 1; n < cu.size(); ++n) longest = std::max(longest, cu[n] - cu[n - 1]);
  const bool spec = r.chance(0.12), tree = r.chance(0.12);
  if (spec && r.chance(0.8)) {
    Sv = int(std::max<int64_t>(Sv, W - 2 + longest));
    S = S < 0 && Sv == W - 1 ? -1 : Sv;
  }
  std::vector<int64_t> acc, par;
  const int64_t M = longest + (r.chance(0.2) ? r.uni(-1, 2) : 0);
  for (int64_t n = 0; n < N; ++n) {
    acc.push_back(r.chance(0.9) ? r.uni(1, std::max<int64_t>(1, Sv - W + 2)) : r.uni(-1, Sv + 2));
    for (int64_t t = 0; t < std::max<int64_t>(M, 0); ++t)
      par.push_back(t == 0 ? -1 : r.chance(0.95) ? r.uni(0, t - 1) : r.uni(t, t + 2));
  }
  a.width = W;
  a.state_len = S;
  a.activation = r.chance(0.6) ? SC_ACT_SILU : SC_ACT_NONE;
  a.exec.backend = SC_BACKEND_CPU;
  a.exec.num_threads = int32_t(r.uni(0, 3));
  if (r.chance(0.3)) a.exec.tile_t = r.pick<int64_t>({1, 2, 3, 5, 17, INT64_MAX});
  if (r.chance(0.3)) a.exec.tile_d = r.pick<int64_t>({1, 16, 17, 33, INT64_MAX});

  auto act = [&] {
    return packed && r.chance(0.5) ? desc(A, {T, D}) : desc(A, {B, T, D});
  };
  a.x = act();
  auto like_x = [&] { return a.x; };
  a.weight = desc(P, {D, W});
  if (r.chance(0.6)) a.bias = desc(P, {D});
  if (packed) a.cu_seqlens = desc(I, {N + 1});
  const bool pool = r.chance(0.3);
  const int64_t rows = pool ? N + r.uni(0, 3) : N;
  if (r.chance(0.5)) a.initial_state = desc(Z, {rows, D, Sv});
  if (w.fwd) {
    if (r.chance(0.4)) a.residual = like_x();
    if (r.chance(0.9)) a.y = like_x();
    if (r.chance(0.5)) a.final_state = desc(Z, {rows, D, Sv});
  } else {
    if (r.chance(0.9)) a.dy = like_x();
    if (r.chance(0.4)) a.dfinal_state = desc(Z, {N, D, Sv});
    if (r.chance(0.8)) a.dx = like_x();
    if (r.chance(0.7)) a.dweight = desc(P, {D, W});
    if (r.chance(0.5) && a.bias.ndim) a.dbias = desc(P, {D});
    if (r.chance(0.5)) a.dinitial_state = desc(Z, {N, D, Sv});
  }
  // Pools: indices whenever the row count is not N (or sometimes anyway).
  std::vector<int64_t> h0i, hti;
  const bool h0_pool = a.initial_state.ndim && (pool || r.chance(0.2));
  const bool ht_pool = w.fwd && a.final_state.ndim && (pool || r.chance(0.2));
  if (h0_pool || ht_pool) {
    std::vector<int64_t> perm(size_t(std::max<int64_t>(rows, 0)));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
    std::shuffle(perm.begin(), perm.end(), r.gen());
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = n < int64_t(perm.size()) ? perm[size_t(n)] : -1;
      h0i.push_back(r.chance(0.2) || rows == 0 ? -1 : int64_t(r.uni(0, rows - 1)));
      hti.push_back(r.chance(0.2) ? -1 : row);
    }
  }
  if (h0_pool) a.initial_state_indices = desc(I, {N});
  if (ht_pool) a.final_state_indices = desc(I, {N});
  const bool in_place = w.fwd && a.initial_state.ndim && a.final_state.ndim &&
                        (h0_pool == ht_pool) && r.chance(0.4);
  if (in_place) h0i = hti;
  // Block tables instead of the pool indices (forward, pools), sometimes with prefix
  // caching: rows mostly distinct per (sequence, block), vLLM-like block indices.
  const int64_t MB = r.uni(1, 4), BS = r.uni(1, 4);
  std::vector<int64_t> tbl, iblk, fblk, fstb, cmpt;
  const bool table = w.fwd && (h0_pool || ht_pool) && r.chance(0.15);
  if (table) {
    std::vector<int64_t> rows2(static_cast<size_t>(std::max<int64_t>(rows, 0)));
    for (size_t i = 0; i < rows2.size(); ++i) rows2[i] = int64_t(i);
    std::shuffle(rows2.begin(), rows2.end(), r.gen());
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < MB; ++j) {
        const size_t at = size_t(n * MB + j);
        tbl.push_back(at < rows2.size() && r.chance(0.9) ? rows2[at] : -1);
      }
      const int64_t cn = r.uni(0, 2 * BS), L = packed ? cu[size_t(n + 1)] - cu[size_t(n)] : T;
      iblk.push_back(r.uni(0, MB - 1));
      fblk.push_back(r.chance(0.9) ? std::min<int64_t>(MB - 1, (cn + std::max<int64_t>(L, 1) - 1) / BS)
                                   : r.uni(-1, MB));
      fstb.push_back(cn / BS);
      cmpt.push_back(r.chance(0.95) ? cn : -1);
    }
    a.initial_state_indices.ndim = a.final_state_indices.ndim = 0;
    a.block_table = desc(I, {N, MB});
    a.initial_block = desc(I, {N});
    a.final_block = desc(I, {N});
    if (r.chance(0.5)) {
      a.first_block = desc(I, {N});
      a.computed_tokens = desc(I, {N});
      a.block_size = BS;
    }
  }
  if (spec && (a.initial_state.ndim || a.final_state.ndim || r.chance(0.1)))
    a.num_accepted = desc(I, {N});
  if (tree && M >= 0) a.parent_tokens = desc(I, {N, M});
  // Sequence ids for some dense batches: the states become pools by id (rarely
  // with serving steps, which refuse them).
  std::vector<int64_t> sid;
  if (!packed && r.chance(table || a.num_accepted.ndim || a.parent_tokens.ndim ? 0.03 : 0.3)) draw_ids(r, w, B, T, D, Z, Sv, I, &sid);

  // Layouts (inputs may broadcast), then arenas sized for any tensor.
  for (int f = 0; f < kTensors; ++f) {
    sc_tensor& t = w.t(f);
    if (!t.ndim) continue;
    if (index_1d(f)) {
      t.stride[0] = r.chance(0.2) ? 2 : 1;
      continue;
    }
    if (index_2d(f)) {  // row-major, sometimes padded rows
      t.stride[1] = 1;
      t.stride[0] = std::max<int64_t>(t.shape[1], 1) + (r.chance(0.2) ? 1 : 0);
      continue;
    }
    if (f == SID) {  // row- or column-major, sometimes padded; contents below
      const bool cm = r.chance(0.3);
      const int64_t pad = r.chance(0.2) ? 1 : 0;
      t.stride[cm ? 0 : 1] = 1;
      t.stride[cm ? 1 : 0] = (cm ? t.shape[0] : t.shape[1]) + pad;
      continue;
    }
    layout(r, t, !w.is_output(f));
  }
  if (in_place) a.final_state = a.initial_state;
  int64_t most = 64;
  for (int f = 0; f < kTensors; ++f)
    most = std::max(most, extent_elems(w.t(f)) * 8 + 64);
  w.arena.assign(kTensors, {});
  for (int f = 0; f < kTensors; ++f) {
    sc_tensor& t = w.t(f);
    w.home[f] = -1;
    if (!t.ndim) continue;
    w.arena[size_t(f)].assign(size_t(2 * most), w.is_output(f) ? kSentinel : 0);
    uint8_t* base = w.arena[size_t(f)].data();
    w.home[f] = f;
    w.offset[f] = 0;
    t.data = base;
    if (w.is_output(f) || index_1d(f) || index_2d(f) || f == SID) continue;
    for (int64_t i = 0, n = extent_elems(t); i < n; ++i)
      store_f64(base, t.dtype, i,
                draw_value(r, true, f != DY && f != DHT, sc_dtype(t.dtype)) *
                    (f == WEIGHT || f == BIAS ? 0.5 : 1.0));
  }
  if (in_place) {  // one arena: final_state is exactly initial_state
    w.t(HT).data = w.t(H0).data;
    w.home[HT] = H0;
    w.arena[HT].clear();
  }
  auto fill_index = [&](int f, const std::vector<int64_t>& v) {
    const sc_tensor& t = w.t(f);
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t off = int64_t(i) * t.stride[0];
      if (t.dtype == SC_I32) reinterpret_cast<int32_t*>(t.data)[off] = int32_t(v[i]);
      else reinterpret_cast<int64_t*>(t.data)[off] = v[i];
    }
  };
  if (a.cu_seqlens.ndim) fill_index(CU, cu);
  if (a.initial_state_indices.ndim) fill_index(H0I, h0i);
  if (a.final_state_indices.ndim) fill_index(HTI, hti);
  if (a.num_accepted.ndim) fill_index(ACC, acc);
  auto fill_2d = [&](int f, const std::vector<int64_t>& v, int64_t cols) {
    const sc_tensor& t = w.t(f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < cols; ++k) {
        const int64_t off = n * t.stride[0] + k, x = v[size_t(n * cols + k)];
        if (t.dtype == SC_I32) reinterpret_cast<int32_t*>(t.data)[off] = int32_t(x);
        else reinterpret_cast<int64_t*>(t.data)[off] = x;
      }
  };
  if (a.parent_tokens.ndim) fill_2d(PAR, par, M);
  if (a.block_table.ndim) {
    fill_2d(TBL, tbl, MB);
    fill_index(IBLK, iblk);
    fill_index(FBLK, fblk);
  }
  if (a.first_block.ndim) {
    fill_index(FSTB, fstb);
    fill_index(CMPT, cmpt);
  }
  if (a.seq_idx.ndim) {
    const sc_tensor& t = w.t(SID);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t off = b * t.stride[0] + i * t.stride[1], v = sid[size_t(b * T + i)];
        if (t.dtype == SC_I32) reinterpret_cast<int32_t*>(t.data)[off] = int32_t(v);
        else reinterpret_cast<int64_t*>(t.data)[off] = v;
      }
  }
  std::ostringstream os;
  os << (w.fwd ? "forward" : "backward") << " W=" << W << " S=" << S << " D=" << D
     << (packed ? " packed N=" : " dense B=") << (packed ? N : B) << " T=" << T << " dtypes "
     << A << P << Z << " pool=" << pool << " in_place=" << in_place
     << " seq_idx=" << (a.seq_idx.ndim != 0) << " tiles "
     << a.exec.tile_t << "x" << a.exec.tile_d << " threads " << a.exec.num_threads
     << (a.num_accepted.ndim ? " num_accepted" : "") << (a.parent_tokens.ndim ? " parent_tokens" : "")
     << (a.block_table.ndim ? " block_table" : "") << (a.block_size ? " block_size" : "");
  w.log = os.str();
}

// Every present tensor's description, for failure messages.
std::string describe_tensors(const World& w) {
  std::ostringstream os;
  for (int f = 0; f < kTensors; ++f) {
    const sc_tensor& t = w.t(f);
    if (!t.ndim) continue;
    os << "\n    " << kFields[f].name << " dtype " << t.dtype << " shape [";
    for (int i = 0; i < t.ndim && i < SC_MAX_DIMS; ++i) os << (i ? "," : "") << t.shape[i];
    os << "] stride [";
    for (int i = 0; i < t.ndim && i < SC_MAX_DIMS; ++i) os << (i ? "," : "") << t.stride[i];
    os << "] arena " << w.home[f] << " +" << w.offset[f] << (t.data ? "" : " NULL");
  }
  return os.str();
}

// Whether index tensor f (1-D, int32/int64) lies inside its arena as described
// (earlier mutations may have made it NULL, huge or strided past the arena).
bool in_arena(const World& w, int f) {
  const sc_tensor& t = w.t(f);
  if (!t.data || t.ndim != 1 || (t.dtype != SC_I32 && t.dtype != SC_I64) || t.stride[0] < 0 ||
      w.home[f] < 0 || t.shape[0] > (int64_t(1) << 20) || t.stride[0] > 4)
    return false;
  const int64_t end = w.offset[f] + (t.shape[0] * t.stride[0] + 1) * dtype_size(t.dtype);
  return end <= int64_t(w.arena[size_t(w.home[f])].size());
}

// One hostile change; appends what it did to the log.
void mutate(Rng& r, World& w) {
  sc_conv_args& a = w.a;
  std::vector<int> present;
  for (int f = 0; f < kTensors; ++f)
    if (w.t(f).ndim) present.push_back(f);
  const int f = present.empty() ? X : present[size_t(r.uni(0, int64_t(present.size()) - 1))];
  sc_tensor& t = w.t(f);
  const int k = int(r.uni(0, 20));
  const int dim = t.ndim > 0 ? int(r.uni(0, std::min(t.ndim, SC_MAX_DIMS) - 1)) : 0;
  std::ostringstream os;
  os << " | ";
  switch (k) {
    case 0: t.shape[dim] = -r.uni(1, 3); os << kFields[f].name << ".shape[" << dim << "]<0"; break;
    case 1: t.stride[dim] = -r.uni(1, 3); os << kFields[f].name << ".stride[" << dim << "]<0"; break;
    case 2:  // huge shape: broadcast it (memory stays in the arena) unless an output
      t.shape[dim] = r.pick<int64_t>({int64_t(1) << 40, int64_t(1) << 62, INT64_MAX});
      if (!w.is_output(f)) t.stride[dim] = 0; else t.stride[dim] = 0;
      os << kFields[f].name << ".shape[" << dim << "] huge, stride 0";
      break;
    case 3:  // huge stride: always overflows the extent (or is unused at size 1)
      t.stride[dim] = r.pick<int64_t>({int64_t(1) << 62, INT64_MAX});
      if (t.shape[dim] == 1) t.shape[dim] = 2;
      os << kFields[f].name << ".stride[" << dim << "] huge";
      break;
    case 4: t.dtype = int32_t(r.pick<int>({-1, 6, 42, SC_I32, SC_F64, SC_BF16})); os << kFields[f].name << ".dtype=" << t.dtype; break;
    case 5: t.ndim = int32_t(r.pick<int>({-1, 1, 4, 5, 99})); os << kFields[f].name << ".ndim=" << t.ndim; break;
    case 6: t.data = nullptr; os << kFields[f].name << ".data=NULL"; break;
    case 7:  // an output aliasing another tensor's memory (its arena, some offset)
      if (w.is_output(f)) {
        const int g = present[size_t(r.uni(0, int64_t(present.size()) - 1))];
        const int h = w.home[g];
        if (h >= 0 && !w.arena[size_t(h)].empty()) {
          const int64_t off = r.uni(0, 3) * dtype_size(t.dtype);
          t.data = w.arena[size_t(h)].data() + w.offset[g] + off;
          w.home[f] = h;
          w.offset[f] = w.offset[g] + off;
          os << kFields[f].name << " aliases " << kFields[g].name << " +" << off << "B";
        }
      }
      break;
    case 8:  // output self-overlap
      if (t.ndim > 0) {
        t.stride[dim] = 0;
        if (t.shape[dim] < 2) t.shape[dim] = 2;  // may also mismatch: either error is fine
        os << kFields[f].name << ".stride[" << dim << "]=0";
      }
      break;
    case 9:
      if (a.cu_seqlens.ndim && a.cu_seqlens.shape[0] > 0 && in_arena(w, CU)) {
        const int64_t i = r.uni(0, a.cu_seqlens.shape[0] - 1);
        const int64_t v = r.pick<int64_t>({-1, 1000, INT32_MAX, -INT32_MAX});
        const int64_t off = i * a.cu_seqlens.stride[0];
        if (a.cu_seqlens.dtype == SC_I32) reinterpret_cast<int32_t*>(a.cu_seqlens.data)[off] = int32_t(v);
        else if (a.cu_seqlens.dtype == SC_I64) reinterpret_cast<int64_t*>(a.cu_seqlens.data)[off] = v;
        os << "cu_seqlens[" << i << "]=" << v;
      }
      break;
    case 10:
      for (int g : {H0I, HTI, ACC, IBLK, FBLK, FSTB, CMPT}) {
        sc_tensor& ix = w.t(g);
        if (ix.ndim != 1 || ix.shape[0] <= 0 || !in_arena(w, g)) continue;
        const int64_t i = r.uni(0, ix.shape[0] - 1);
        const int64_t v = r.pick<int64_t>({-2, 100, INT64_MIN, 0});
        if (ix.dtype == SC_I32) reinterpret_cast<int32_t*>(ix.data)[i * ix.stride[0]] = int32_t(v);
        else reinterpret_cast<int64_t*>(ix.data)[i * ix.stride[0]] = v;
        os << kFields[g].name << "[" << i << "]=" << v;
        break;
      }
      break;
    case 19:  // a seq_idx entry: an id past the state rows, a second run, padding
      if (a.seq_idx.ndim == 2 && a.seq_idx.data && w.home[SID] == SID &&
          (a.seq_idx.dtype == SC_I32 || a.seq_idx.dtype == SC_I64) && a.seq_idx.shape[0] > 0 &&
          a.seq_idx.shape[1] > 0 && a.seq_idx.shape[0] < 4096 && a.seq_idx.shape[1] < 4096 &&
          a.seq_idx.stride[0] >= 0 && a.seq_idx.stride[1] >= 0 &&
          extent_elems(a.seq_idx) <= int64_t(w.arena[SID].size()) / 8) {
        const int64_t b = r.uni(0, a.seq_idx.shape[0] - 1), i = r.uni(0, a.seq_idx.shape[1] - 1);
        const int64_t v = r.pick<int64_t>({-1, 0, 1, 1000, INT32_MAX});
        const int64_t off = b * a.seq_idx.stride[0] + i * a.seq_idx.stride[1];
        if (a.seq_idx.dtype == SC_I32) reinterpret_cast<int32_t*>(a.seq_idx.data)[off] = int32_t(v);
        else reinterpret_cast<int64_t*>(a.seq_idx.data)[off] = v;
        os << "seq_idx[" << b << ", " << i << "]=" << v;
      }
      break;
    case 11: a.width = int32_t(r.pick<int64_t>({0, -1, SC_MAX_WIDTH + 1, INT32_MAX, INT32_MIN})); os << "width=" << a.width; break;
    case 12: a.state_len = int32_t(r.pick<int64_t>({-2, INT32_MAX, INT32_MIN, 0})); os << "state_len=" << a.state_len; break;
    case 13: a.activation = int32_t(r.pick<int>({2, -1, 1000})); os << "activation=" << a.activation; break;
    case 14: a.exec.backend = int32_t(r.pick<int>({-1, 3, 1000})); os << "backend=" << a.exec.backend; break;
    case 15: a.exec.num_threads = r.pick<int32_t>({-1, INT32_MIN}); os << "threads=" << a.exec.num_threads; break;
    case 16:
      a.exec.tile_t = r.pick<int64_t>({-1, INT64_MIN, INT64_MAX, int64_t(1) << 62});
      a.exec.tile_d = r.pick<int64_t>({0, -5, INT64_MAX, int64_t(1) << 40});
      os << "tiles " << a.exec.tile_t << "x" << a.exec.tile_d;
      break;
    case 17:
      if (r.chance(0.3)) {
        a.block_size = r.pick<int64_t>({-1, 0, 1, 3, INT64_MAX});
        os << "block_size=" << a.block_size;
      } else if (r.chance(0.3)) {
        a.zero_padded_outputs = int32_t(r.pick<int64_t>({1, 2, -1, INT32_MAX}));
        os << "zero_padded_outputs=" << a.zero_padded_outputs;
      } else {
        a.struct_size = uint32_t(r.pick<int64_t>({0, 8, sizeof(sc_conv_args) + 8}));
        os << "struct_size";
      }
      break;
    case 18: t.ndim = 0; os << kFields[f].name << " absent"; break;
    default: {  // enormous but consistent broadcast inputs: 2^40 or 2^58 sequences of 1 token
      const int64_t N = int64_t(1) << r.pick<int>({40, 58});
      auto big = [&](sc_tensor& u, std::initializer_list<int64_t> shape) {
        const sc_tensor keep = u;
        u = desc(sc_dtype(keep.dtype), shape);
        u.data = keep.data;
      };
      if (!a.cu_seqlens.ndim && a.x.ndim == 3) {
        const int64_t D = a.x.shape[2], S = a.state_len < 0 ? int64_t(a.width) - 1 : a.state_len;
        big(a.x, {N, 1, D});
        if (a.dy.ndim) big(a.dy, {N, 1, D});
        if (a.residual.ndim) big(a.residual, {N, 1, D});
        if (a.initial_state.ndim && !a.initial_state_indices.ndim) big(a.initial_state, {N, D, S});
        if (a.dfinal_state.ndim) big(a.dfinal_state, {N, D, S});
        if (a.seq_idx.ndim) big(a.seq_idx, {N, 1});
        for (sc_tensor* o : {&a.y, &a.dx, &a.final_state, &a.dinitial_state}) o->ndim = 0;
        a.initial_state_indices.ndim = a.final_state_indices.ndim = 0;
        os << N << " broadcast sequences";
      }
    }
  }
  w.log += os.str();
}

// Calls fn(element offset) for every element of tensor t in logical order;
// with `distinct`, broadcast (stride-0) dims are visited once (an input may
// be 2^62 elements of one value).
template <class F>
void for_each_element(const sc_tensor& t, F&& fn, bool distinct = false) {
  if (extent_elems(t) == 0) return;
  int64_t idx[SC_MAX_DIMS] = {}, shape[SC_MAX_DIMS] = {};
  for (int i = 0; i < t.ndim; ++i) shape[i] = distinct && t.stride[i] == 0 ? 1 : t.shape[i];
  while (true) {
    int64_t off = 0;
    for (int i = 0; i < t.ndim; ++i) off += idx[i] * t.stride[i];
    fn(off);
    int i = t.ndim - 1;
    for (; i >= 0; --i) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
    if (i < 0) break;
  }
}

// Decoded output element values of tensor f (logical order) from arena set m.
std::vector<double> read_output(const World& w, int f,
                                const std::vector<std::vector<uint8_t>>& m) {
  const sc_tensor& t = w.t(f);
  std::vector<double> v;
  if (extent_elems(t) == 0) return v;
  const uint8_t* base = m[size_t(w.home[f])].data() + w.offset[f];
  for_each_element(t, [&](int64_t off) { v.push_back(load_f64(base, t.dtype, off)); });
  return v;
}

// Marks the bytes of tensor f's elements in its arena.
void mark(const World& w, int f, std::vector<std::vector<uint8_t>>& marks) {
  const sc_tensor& t = w.t(f);
  const int es = dtype_size(t.dtype);
  uint8_t* m = marks[size_t(w.home[f])].data() + w.offset[f];
  for_each_element(t, [&](int64_t off) { std::memset(m + off * es, 1, size_t(es)); });
}

// Whether an f64 input holds a finite value float cannot represent.
bool outside_float_range(const World& w, const std::vector<std::vector<uint8_t>>& m) {
  for (int f : {X, WEIGHT, BIAS, RES, H0, DY, DHT}) {
    const sc_tensor& t = w.t(f);
    if (!t.ndim || !t.data || t.dtype != SC_F64 || w.is_output(f)) continue;
    const uint8_t* base = m[size_t(w.home[f])].data() + w.offset[f];
    bool outside = false;
    for_each_element(t, [&](int64_t off) {
      const double a = std::fabs(load_f64(base, t.dtype, off));
      outside |= std::isfinite(a) && (a > 3.4e38 || (a > 0 && a < 1.2e-38));
    }, true);
    if (outside) return true;
  }
  return false;
}

// The magnitude problem: every float input replaced by its absolute value,
// identity activation.  Its oracle result bounds the sum of |terms| behind
// each output element, so an fp32-accumulated result may differ from the
// fp64 oracle by a few eps times that (cancellation), and by no more.
void make_magnitudes(World& m) {
  m.a.activation = SC_ACT_NONE;
  for (int f : {X, WEIGHT, BIAS, RES, H0, DY, DHT}) {
    const sc_tensor& t = m.t(f);
    if (!t.ndim || !t.data || m.is_output(f)) continue;
    uint8_t* base = static_cast<uint8_t*>(t.data);
    for_each_element(t, [&](int64_t off) {
      store_f64(base, t.dtype, off, std::fabs(load_f64(base, t.dtype, off)));
    }, true);
  }
}

sc_status call(World& w, bool run, size_t* need, std::string* msg);

// A dense [B, T, D] tensor like x in a fresh arena of w, for field f.
void dense_like_x(World& w, int f) {
  sc_tensor& t = w.t(f);
  t = w.t(X);
  int64_t n = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.stride[i] = n;
    n *= t.shape[i];
  }
  w.arena.emplace_back(size_t(std::max<int64_t>(n, 1)) * 8, 0);
  t.data = w.arena.back().data();
  w.home[f] = int(w.arena.size()) - 1;
  w.offset[f] = 0;
}

// |pre| bounds per token ([B, T, D] logical order) from the magnitude
// problem's forward, run on a copy with y in a scratch arena; false when it
// cannot run.
bool pre_bounds(const World& mag, std::vector<double>* pre) {
  if (mag.t(X).ndim != 3 && mag.t(X).ndim != 2) return false;
  World f = mag;
  f.fwd = true;
  f.a.residual.ndim = 0;
  f.a.final_state.ndim = 0;
  dense_like_x(f, Y);
  size_t need = 0;
  std::string msg;
  if (call(f, true, &need, &msg) != SC_OK) return false;
  *pre = read_output(f, Y, f.arena);
  return true;
}

// The backward's magnitude dy: |dpre| <= 1.1 |dy| (|silu'| <= 1.0998), and an
// fp32 pre off by (W+1) eps |pre|bound moves silu' by at most 0.5 times that
// (|silu''| <= 0.5): with the comparison's tol = 1e-5 ~ 168 eps, a dy of
// |dy| (1.1 + (W+1) pre_bound / 300) makes tol * bound cover both.  Identity:
// dpre = dy exactly.
void magnitude_dy(World& mag, const std::vector<double>& pre, int act) {
  const std::vector<double> dy = read_output(mag, DY, mag.arena);  // already |dy|
  dense_like_x(mag, DY);
  const sc_tensor& t = mag.t(DY);
  uint8_t* base = static_cast<uint8_t*>(t.data);
  const double wp1 = double(std::max(1, mag.a.width) + 1);
  for (size_t i = 0; i < dy.size(); ++i) {
    const double v = act == SC_ACT_SILU ? dy[i] * (1.1 + wp1 * pre[i] / 300.0) : dy[i];
    store_f64(base, t.dtype, int64_t(i), v * 1.01);  // (1.01: the storage dtype's rounding)
  }
}

// Compares decoded outputs element by element: the same NaN / infinity class
// as the oracle, and finite values within tol * bound (the magnitude problem's
// result) + atol (results below ~1e-30 may flush to zero).  A 16-bit output
// at the edge of its range may round to inf on one side only.
//
// fp32 accumulation (any activation dtype but f64): where the magnitude bound
// exceeds kFp32Exempt, an intermediate product or partial sum may overflow
// fp32 while fp64 does not (inf - inf = NaN against a finite oracle value):
// such elements are only checked for having been written (and nothing else
// changed).
constexpr double kFp32Exempt = 1e37;
// fp64 the same near its own range (fma keeps w * u exact where a separate
// product overflows: finite against inf, then NaN against -inf).
constexpr double kFp64Exempt = 1e306;

std::string compare_values(const std::vector<double>& got, const std::vector<double>& ref,
                           const std::vector<double>& bound, double tol, sc_dtype od,
                           bool fp32) {
  if (got.size() != ref.size() || bound.size() != ref.size()) return "sizes differ";
  const double edge = od == SC_F16 ? 65000.0 : od == SC_F64 ? 1e308 : 3.3e38;
  for (size_t i = 0; i < ref.size(); ++i) {
    // (|bound|: a pool row nobody writes holds whatever memory was there)
    const double g = got[i], r = ref[i], m = std::fabs(bound[i]);
    if (!(m <= (fp32 ? kFp32Exempt : kFp64Exempt))) continue;
    bool ok;
    if (std::isnan(r) || std::isnan(g)) ok = std::isnan(r) && std::isnan(g);
    else if (std::isinf(r) || std::isinf(g)) {  // overflow of the output dtype on one side only
      const double v = std::isinf(r) ? g : r;
      ok = g == r || (std::fabs(v) + tol * m >= edge &&
                      (std::signbit(g) == std::signbit(r) || tol * m >= edge));
    }
    else ok = !(std::fabs(g - r) > tol * m + 1e-30);
    if (!ok)
      return "element " + std::to_string(i) + ": " + std::to_string(g) + " vs oracle " +
             std::to_string(r) + " (bound " + std::to_string(m) + ")";
  }
  return "";
}

// The oracle's work for a description, saturating (no run when it is large):
// per (sequence, channel) it builds S + L entries and sums W taps per token.
double work(const sc_conv_args& a) {
  if (a.x.ndim < 2 || a.x.ndim > 3) return 0;  // refused before any work
  double tokens = 1;
  for (int i = 0; i < a.x.ndim - 1; ++i) tokens *= double(std::max<int64_t>(a.x.shape[i], 0));
  const double D = double(std::max<int64_t>(a.x.shape[a.x.ndim - 1], 1));
  const double N = a.cu_seqlens.ndim == 1 ? double(std::max<int64_t>(a.cu_seqlens.shape[0], 1))
                                          : double(std::max<int64_t>(a.x.shape[0], 1));
  double S = a.state_len;
  for (const sc_tensor* t : {&a.initial_state, &a.final_state, &a.dfinal_state, &a.dinitial_state})
    if (t->ndim == 3) S = std::max(S, double(t->shape[2]));
  return D * (N * (std::max(S, 0.0) + 1) + tokens * std::max(1, a.width));
}

sc_status call(World& w, bool run, size_t* need, std::string* msg) {
  sc_error err;
  std::memset(err.message, 'Z', sizeof err.message);
  err.message[sizeof err.message - 1] = 0;
  sc_status st;
  if (!run) {
    st = w.fwd ? sc_forward_workspace_size(&w.a, need, &err)
               : sc_backward_workspace_size(&w.a, need, &err);
  } else {
    st = w.fwd ? sc_forward(&w.a, &err) : sc_backward(&w.a, &err);
  }
  *msg = err.message;
  return st;
}

TEST(Fuzz, CleanErrorOrOracleResult) {
  const char* secs_env = std::getenv("SHORTCONV_FUZZ_SECONDS");
  const char* seed_env = std::getenv("SHORTCONV_FUZZ_SEED");
  const double seconds = secs_env ? std::atof(secs_env) : 4.0;
  const uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : 20261201;
  const bool verbose = std::getenv("SHORTCONV_FUZZ_VERBOSE") != nullptr;
  const char* dump_env = std::getenv("SHORTCONV_FUZZ_DUMP");
  const int dump_iter = dump_env ? std::atoi(dump_env) : -1;
  Rng r(seed);
  const auto t0 = std::chrono::steady_clock::now();
  int iters = 0, ok_runs = 0, errors = 0, failures = 0;
  while (failures < 3) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed > seconds && iters >= 200) break;
    ++iters;
    World w;
    draw_valid(r, w);
    // Now and then a lower instruction set (the library reads this per call).
    const char* isa = r.chance(0.8) ? nullptr : r.pick<const char*>({"v128", "avx2"});
    if (isa) setenv("SHORTCONV_CPU_ISA", isa, 1);
    else unsetenv("SHORTCONV_CPU_ISA");
    const int muts = r.chance(0.25) ? 0 : int(r.uni(1, 3));
    for (int m = 0; m < muts; ++m) mutate(r, w);
    const std::string where = "seed " + std::to_string(seed) + " iteration " +
                              std::to_string(iters) + ": " + w.log;
    const auto before = w.arena;
    if (verbose) std::fprintf(stderr, "%s\n", where.c_str());
    const bool dump = dump_iter == iters;
    if (dump) {
      for (int f : {X, WEIGHT, BIAS, RES, H0, DY, DHT}) {
        if (!w.t(f).ndim || w.is_output(f) || work(w.a) > 1e6) continue;
        std::fprintf(stderr, "%s:", kFields[f].name);
        for (double d : read_output(w, f, w.arena)) std::fprintf(stderr, " %g", d);
        std::fprintf(stderr, "\n");
      }
    }

    // Workspace: the size query, then sometimes less (or none) than it said.
    size_t need = 0;
    std::string msg;
    const sc_status q = call(w, false, &need, &msg);
    std::vector<uint8_t> ws;
    const bool short_ws = r.chance(0.1);
    if (q == SC_OK && need < (size_t(1) << 28)) {
      ws.assign(short_ws && need > 0 ? need - 1 : need, 0);
      w.a.exec.workspace = ws.empty() ? nullptr : ws.data();
      w.a.exec.workspace_bytes = ws.size();
    }
    const bool can_run = q == SC_OK && need < (size_t(1) << 28) && work(w.a) < 2e5;
    if (!can_run) {  // only validated and sized: statuses agree, nothing written
      sc_error e;
      const sc_status v = sc_validate(&w.a, w.fwd ? 0 : 1, &e);
      if (q != SC_OK && q != SC_ERR_UNSUPPORTED) EXPECT_EQ(v, q) << where;
      if (q != SC_OK) EXPECT_FALSE(msg.empty()) << where;
      EXPECT_TRUE(w.arena == before) << "a buffer changed during validation: " << where;
      errors += q != SC_OK;
      continue;
    }
    const sc_status st = call(w, true, &need, &msg);
    if (st != SC_OK) {
      ++errors;
      bool same = w.arena == before;
      if (!same || msg.empty() || msg[0] == 'Z' ||
          (short_ws && need > 0 && st != SC_ERR_WORKSPACE)) {
        ++failures;
        ADD_FAILURE() << "error " << st << " (" << msg << ") but "
                      << (same ? "status/message wrong" : "a buffer was written") << ": "
                      << where;
      }
      continue;
    }
    if (short_ws && need > 0) {
      ++failures;
      ADD_FAILURE() << "ran with a short workspace: " << where;
      continue;
    }
    ++ok_runs;
    // The oracle on the same description over copies of the original arenas.
    World ref = w;
    ref.arena = before;
    for (int f = 0; f < kTensors; ++f) {
      sc_tensor& t = ref.t(f);
      if (t.ndim && w.home[f] >= 0 && t.data)
        t.data = ref.arena[size_t(w.home[f])].data() + w.offset[f];
    }
    ref.a.exec.backend = SC_BACKEND_REF;
    ref.a.exec.workspace = nullptr;
    ref.a.exec.workspace_bytes = 0;
    std::string rmsg;
    size_t rneed = 0;
    const sc_status rs = call(ref, true, &rneed, &rmsg);
    if (rs != SC_OK) {
      ++failures;
      ADD_FAILURE() << "cpu accepted, oracle refused (" << rmsg << "): " << where;
      continue;
    }
    World mag = ref;  // the magnitude problem on its own copy of the inputs
    mag.arena = before;
    for (int f = 0; f < kTensors; ++f) {
      sc_tensor& t = mag.t(f);
      if (t.ndim && w.home[f] >= 0 && t.data)
        t.data = mag.arena[size_t(w.home[f])].data() + w.offset[f];
    }
    make_magnitudes(mag);
    double pre_most = 0;  // backward: the largest |pre| the kernels recompute
    if (!w.fwd) {
      std::vector<double> pre;
      if (!pre_bounds(mag, &pre)) {
        pre_most = INFINITY;
      } else {
        for (double v : pre) pre_most = std::isnan(v) ? INFINITY : std::max(pre_most, std::fabs(v));
        if (mag.t(DY).ndim && mag.t(DY).data) magnitude_dy(mag, pre, w.a.activation);
      }
    }
    if (call(mag, true, &rneed, &rmsg) != SC_OK) {
      ++failures;
      ADD_FAILURE() << "magnitude oracle refused (" << rmsg << "): " << where;
      continue;
    }
    // fp64 parameters or states outside float's range cannot reach an fp32
    // accumulator unchanged (1e300 -> inf, 1e-310 -> 0), and a backward whose
    // recomputed pre-activations may overflow fp32 (|pre| <= the forward's
    // magnitude) sees act'(inf) = NaN where fp64 sees a finite pre: values
    // not comparable (outputs are still checked for stray writes).
    const bool fp32 = sc_dtype(w.a.x.dtype) != SC_F64;
    const bool comparable =
        !fp32 || (!outside_float_range(ref, before) && pre_most <= kFp32Exempt);
    std::vector<std::vector<uint8_t>> marks(w.arena.size());
    for (size_t i = 0; i < marks.size(); ++i) marks[i].assign(w.arena[i].size(), 0);
    std::string why;
    const sc_dtype A = sc_dtype(w.a.x.dtype);
    for (int f = 0; f < kTensors; ++f) {
      if (!w.is_output(f) || !w.t(f).ndim || !w.t(f).data) continue;
      mark(w, f, marks);
      if (!comparable) continue;
      const sc_dtype od = sc_dtype(w.t(f).dtype);
      const double tol = shortconv::harness::tolerance(od, A);
      const std::string d =
          compare_values(read_output(w, f, w.arena), read_output(ref, f, ref.arena),
                         read_output(mag, f, mag.arena), tol, od, A != SC_F64);
      if (!d.empty()) why += std::string(kFields[f].name) + ": " + d + "; ";
    }
    // Bytes outside every output element (padding, inputs sharing an arena): unchanged.
    for (size_t i = 0; i < w.arena.size(); ++i)
      for (size_t b = 0; b < w.arena[i].size(); ++b)
        if (!marks[i][b] && w.arena[i][b] != before[i][b]) {
          why += "byte " + std::to_string(b) + " of " + kFields[i].name + "'s arena changed; ";
          break;
        }
    if (dump)
      for (int f = 0; f < kTensors; ++f) {
        if (!w.is_output(f) || !w.t(f).ndim) continue;
        const auto g = read_output(w, f, w.arena), o = read_output(ref, f, ref.arena);
        std::fprintf(stderr, "%s cpu/oracle:", kFields[f].name);
        for (size_t i = 0; i < g.size(); ++i) std::fprintf(stderr, " %g/%g", g[i], o[i]);
        std::fprintf(stderr, "\n");
      }
    if (!why.empty()) {
      ++failures;
      ADD_FAILURE() << why << where << describe_tensors(w);
    }
  }
  unsetenv("SHORTCONV_CPU_ISA");
  std::printf("fuzz: %d iterations in %.1f s (seed %llu): %d ran and matched the oracle, %d "
              "refused\n",
              iters,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              (unsigned long long)seed, ok_runs, errors);
  EXPECT_GT(ok_runs, iters / 10) << "the generator produces too few valid calls";
}

}  // namespace
