// CPU backend driver: workspace, phases, threads.
//
// One OpenMP team (exec.num_threads, 0 = all) runs, separated by barriers:
//   0. weights and bias -> A, packed [Dp/L][W+1][L]       (parallel over channels)
//   1. per sequence: the last W-1 initial-state entries -> halo (A), then
//      forward: the final state; backward: dh0 of zero-length sequences.
//      Reading h0 completely before writing ht (within the sequence's task)
//      is what makes the aliased in-place state update correct.  (seq_idx:
//      the runs are tabulated first; halos per state row, a barrier, then
//      final states per run or dh0 zeros: id_states.)
//   2. the tiles (cpu_kernels.hpp), any thread any tile: each output element
//      belongs to exactly one tile, so the schedule cannot change results.
//      Decode-shaped calls (Plan::decode: a few tokens per sequence) run
//      decode tasks instead (cpu_kernels_decode.hpp), which also read the
//      window and write the final states themselves: no phase 1.
//   3. backward: dweight/dbias = sum of the per-tile partials in chunk order
//      (parallel over channels), so results do not depend on the threads.
// The kernels are picked once per call by ISA, dtype, W and activation.  The
// environment variable SHORTCONV_CPU_ISA may lower the ISA (for testing;
// never above what the machine supports): avx512bf16, avx512, avx2, or the 128-bit
// baseline by its name on this architecture (sse2, neon, generic) or as
// `v128`; `scalar`, the baseline's former name, is accepted as an alias.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/backend.hpp"
#include "cpu/cpu_copy.hpp"
#include "cpu/cpu_fpmode.hpp"
#include "cpu/cpu_plan.hpp"

namespace shortconv::cpu {

namespace {

Isa pick_isa() {
  Isa isa = best_isa();
  if (const char* e = std::getenv("SHORTCONV_CPU_ISA")) {
    Isa want = isa;
    if (!std::strcmp(e, v128_name()) || !std::strcmp(e, "v128") || !std::strcmp(e, "scalar"))
      want = Isa::v128;
    else if (!std::strcmp(e, "avx2")) want = Isa::avx2;
    else if (!std::strcmp(e, "avx512")) want = Isa::avx512;
    else if (!std::strcmp(e, "avx512bf16")) want = Isa::avx512bf16;
    isa = std::min(isa, want);  // never above what the machine supports
  }
  return isa;
}

constexpr double kZeros = 0.0;  // the source of a zero row (stride 0)

int dtype_slot(sc_dtype dt) {
  switch (dt) {
    case SC_F32: return 0;
    case SC_F16: return 1;
    case SC_BF16: return 2;
    default: return 3;
  }
}

// The phases below run inside run_impl's one parallel region: each is an
// orphaned `omp for` (its implicit barrier separates it from the next).

// 0: weights and bias -> A, packed [Dp/L][W+1][L] (only the tiles read them),
// one vector block of L channels per task: a block transpose of the taps when they are
// adjacent ([D, W] contiguous), else one typed strided copy per tap.
template <class A>
void pack_params(const Problem& p, const Plan& pl, int64_t L, A* wb) {
  const int W = p.W;
  constexpr int32_t Adt = acc_dtype<A>();
  const bool taps_adjacent = p.weight.stride[1] == 1;  // ([D, W] contiguous: one block transpose)
#pragma omp for schedule(static)
  for (int64_t v = 0; v < (pl.run_tiles ? pl.Dp / L : 0); ++v) {
    const int64_t d0 = v * L, n = std::clamp<int64_t>(p.D - d0, 0, L);
    A* w = wb + v * (W + 1) * L;
    if (taps_adjacent && n > 0)
      transpose_elems(elem_ptr(p.weight.data, p.weight.dtype, p.weight.off(d0, 0)), p.weight.dtype,
                      p.weight.stride[0], w, L, n, W);
    for (int k = 0; k <= W; ++k) {
      A* dst = w + k * L;
      if (k < W) {
        if (!taps_adjacent)
          copy_elems(elem_ptr(p.weight.data, p.weight.dtype, p.weight.off(d0, k)), p.weight.dtype,
                     p.weight.stride[0], dst, Adt, 1, n);
      } else if (p.bias)
        copy_elems(elem_ptr(p.bias.data, p.bias.dtype, p.bias.off(d0)), p.bias.dtype,
                   p.bias.stride[0], dst, Adt, 1, n);
      std::fill(dst + (k < W || p.bias ? n : 0), dst + L, A(0));
    }
  }
}

// u[pos] of sequence n for channels [da, da + nd) into dst (dtype ddt, channel
// stride ds), one typed strided copy (cpu_copy.hpp).  The extended sequence
// has s entries before x_n: S of h0 row r0 from entry 0, or with num_accepted
// W-1 from window_start(n) (semantics section 5); -1: zeros.
struct URow {
  const Problem& p;
  int64_t n, r0, s, base, xb, da, nd;
  void operator()(int64_t pos, void* dst, int32_t ddt, int64_t ds) const {
    if (pos >= s)
      copy_elems(elem_ptr(p.x.data, p.x.dtype, xb + (pos - s) * p.x.stride[1] + da * p.x.stride[2]),
                 p.x.dtype, p.x.stride[2], dst, ddt, ds, nd);
    else if (r0 >= 0)
      copy_elems(elem_ptr(p.h0.data, p.h0.dtype, p.h0.off(r0, da, p.state_slot(n, base + pos))),
                 p.h0.dtype, p.h0.stride[1], dst, ddt, ds, nd);
    else
      copy_elems(&kZeros, SC_F64, 0, dst, ddt, ds, nd);
  }
};
URow u_row(const Problem& p, const Seqs& sq, int64_t n, int64_t r0, int64_t da, int64_t db) {
  const int64_t s = p.accepted ? p.W - 1 : p.S;
  const int64_t base = p.accepted && r0 >= 0 ? p.window_start(n) : 0;  // h0 entry of u[0]
  const int64_t xb = sq.len(n) > 0 ? sq.base(p.x, n) : 0;
  return URow{p, n, r0, s, base, xb, da, db - da};
}

// The W-1 entries of u before x_n into its halo block h ([W-1][Dp]).
template <class A>
void copy_halo(const Problem& p, const Plan& pl, A* h, const URow& u) {
  const int W = p.W;
  const int64_t Dp = pl.Dp;
  for (int i = 0; i < W - 1; ++i) u(u.s - (W - 1) + i, h + i * Dp + u.da, acc_dtype<A>(), 1);
  if (u.da + u.nd == p.D)
    for (int i = 0; i < W - 1; ++i) std::fill(h + i * Dp + p.D, h + (i + 1) * Dp, A(0));
}

// ht[j] = u[from + j], the last E entries of u (E = S at the entries' slots,
// or speculative (W-2) + L from the row's start), into row r1; and (prefix
// caching) snapshot k, the S entries of u from r_k, into its row.  Per
// channel, ascending j reads the h0 entry base + from + j (>= j) before ht[j]
// is written, so ht may be h0's own row; with ring rows ht[j] goes to the slot
// of entry L+j, the one h0[L+j] was read from; later j read others.  A write
// into the row h0 was read from goes last, after every write that still reads
// it (the rows written are distinct: at most one is h0's).
void final_states(const Problem& p, const URow& u, int64_t L, int64_t r1) {
  const int64_t n = u.n, E = p.final_entries(n), from = u.s + L - E, nsnap = p.snapshots(n);
  auto final_state = [&] {
    for (int64_t j = 0; j < E; ++j) {
      const int64_t slot = p.accepted ? j : p.final_slot(n, j);
      u(from + j, elem_ptr(p.ht.data, p.ht.dtype, p.ht.off(r1, u.da, slot)), p.ht.dtype,
        p.ht.stride[1]);
    }
  };
  auto snapshot = [&](int64_t k, int64_t row) {
    for (int64_t j = 0; j < p.S; ++j)
      u(p.snapshot_tokens(n, k) + j, elem_ptr(p.ht.data, p.ht.dtype, p.ht.off(row, u.da, j)),
        p.ht.dtype, p.ht.stride[1]);
  };
  const bool in_place = p.state_in_place && u.r0 >= 0;
  for (int pass = 0; pass < (in_place ? 2 : 1); ++pass) {  // pass 1: the write into r0
    const auto now = [&](int64_t row) { return row >= 0 && (!in_place || (row == u.r0) == (pass == 1)); };
    if (now(r1)) final_state();
    for (int64_t k = 0; k < nsnap; ++k)
      if (const int64_t row = p.snapshot_row(n, k); now(row)) snapshot(k, row);
  }
}

// 1, for sequence n and channels [da, db): the halo, then (forward) the final
// state (and snapshots) or (backward) dh0 of a zero-length sequence.
template <class A>
void sequence_states(const Problem& p, const Plan& pl, const Seqs& sq, A* halo, int64_t n,
                     int64_t da, int64_t db) {
  const int64_t r0 = p.h0_row(n), Ln = sq.len(n), nd = db - da;
  const URow u = u_row(p, sq, n, r0, da, db);
  if (halo) copy_halo(p, pl, halo + n * (p.W - 1) * pl.Dp, u);
  if (p.dir == Dir::fwd) {
    final_states(p, u, Ln, p.ht_row(n));
  } else if (p.dh0 && Ln == 0) {  // dh0 = dht for a zero-length sequence
    for (int j = 0; j < p.S; ++j) {
      void* dst = elem_ptr(p.dh0.data, p.dh0.dtype, p.dh0.off(n, da, j));
      if (p.dht)
        copy_elems(elem_ptr(p.dht.data, p.dht.dtype, p.dht.off(n, da, j)), p.dht.dtype,
                   p.dht.stride[1], dst, p.dh0.dtype, p.dh0.stride[1], nd);
      else
        copy_elems(&kZeros, SC_F64, 0, dst, p.dh0.dtype, p.dh0.stride[1], nd);
    }
  }
}

constexpr int64_t kStateBlock = 64;  // channels per state task

// 1: states, per (sequence, channel block); work only when states are read
// for the tiles or written.
template <class A>
void states(const Problem& p, const Plan& pl, const Seqs& sq, A* halo) {
  const int64_t n_sblocks = ceil_div(p.D, kStateBlock);
  const bool state_work = pl.halo || (p.dir == Dir::fwd ? bool(p.ht) : bool(p.dh0));
#pragma omp for schedule(static)
  for (int64_t task = 0; task < (state_work ? p.N * n_sblocks : 0); ++task) {
    const int64_t n = task / n_sblocks;
    const int64_t da = (task % n_sblocks) * kStateBlock, db = std::min(da + kStateBlock, p.D);
    sequence_states(p, pl, sq, halo, n, da, db);
  }
}

// 1 with seq_idx (semantics section 3), in two steps: the halo of every
// initial-state row (the rows are ids), then, after the barrier, each real
// run's final state into its id's row (forward), or zeros into every dh0 row
// (backward: rows of ids that do not occur; the tiles then write the others).
// The barrier keeps the in-place rule: every halo is read from h0 before a
// final state is written.
template <class A>
void id_states(const Problem& p, const Plan& pl, const Seqs& sq, A* halo) {
  const int64_t n_sblocks = ceil_div(p.D, kStateBlock);
  auto block = [&](int64_t task, int64_t* r, int64_t* da, int64_t* db) {
    *r = task / n_sblocks;
    *da = (task % n_sblocks) * kStateBlock;
    *db = std::min(*da + kStateBlock, p.D);
  };
  int64_t r, da, db;
#pragma omp for schedule(static)
  for (int64_t task = 0; task < (halo ? pl.halo_rows * n_sblocks : 0); ++task) {
    block(task, &r, &da, &db);
    copy_halo(p, pl, halo + r * (p.W - 1) * pl.Dp, URow{p, 0, r, p.S, 0, 0, da, db - da});
  }
  const bool fwd = p.dir == Dir::fwd;
  const int64_t rows = fwd ? (p.ht ? sq.N : 0) : (p.dh0 ? p.dh0.shape[0] : 0);  // runs / dh0 rows
  const int64_t tasks = rows * n_sblocks;
#pragma omp for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    block(task, &r, &da, &db);
    if (!fwd) {
      for (int64_t d = da; d < db; ++d)
        for (int j = 0; j < p.S; ++j) store_f64(p.dh0.data, p.dh0.dtype, p.dh0.off(r, d, j), 0.0);
    } else if (!sq.pad(r)) {  // r: a run
      const int64_t id = sq.id(r);
      final_states(p, u_row(p, sq, r, p.h0 ? id : -1, da, db), sq.len(r), id);
    }
  }
}

// seq_idx: the first token of each run into starts (then the total), row
// after row; returns the number of runs.  A row boundary always starts a run.
int64_t tabulate_runs(const Problem& p, int64_t* starts) {
  int64_t n = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    int64_t prev = 0;
    for (int64_t t = 0; t < p.T; ++t) {
      const int64_t id = p.seq_id(b, t);
      if (t == 0 || id != prev) starts[n++] = b * p.T + t;
      prev = id;
    }
  }
  starts[n] = p.B * p.T;
  return n;
}

// 3 (backward): dweight / dbias = sum of the tile partials in chunk order.
template <class A>
void reduce_partials(const Problem& p, const Plan& pl, int64_t L, const A* part) {
  const int W = p.W;
#pragma omp for schedule(static)
  for (int64_t d = 0; d < p.D; ++d) {
    const int64_t dt = d / pl.tile_d, dd = d - dt * pl.tile_d;
    const int64_t in_tile = (dd / L) * (W + 1) * L + dd % L;  // [tile_d/L][W+1][L]
    for (int k = 0; k <= W; ++k) {
      if (k < W ? !p.dweight : !p.dbias) continue;
      A s = 0;
      for (int64_t ch = 0; ch < pl.n_chunks; ++ch)
        s += part[(ch * pl.n_dtiles + dt) * (W + 1) * pl.tile_d + in_tile + k * L];
      if (k < W) store_f64(p.dweight.data, p.dweight.dtype, p.dweight.off(d, k), double(s));
      else store_f64(p.dbias.data, p.dbias.dtype, p.dbias.off(d), double(s));
    }
  }
}

template <class A>
void run_impl(const Problem& p, const Plan& pl, char* ws) {
  Ctx c;
  c.p = &p;
  c.plan = &pl;
  c.seqs = Seqs{&p, p.N, nullptr};
  if (pl.runs) {  // seq_idx: the runs, once per call (the phases below read them)
    int64_t* starts = reinterpret_cast<int64_t*>(ws + pl.off_runs);
    c.seqs.starts = starts;
    c.seqs.N = p.D > 0 ? tabulate_runs(p, starts) : 0;
    if (p.D == 0) starts[0] = 0;
  }
  const Kernels& K = kernels(pick_isa());
  const int slot = dtype_slot(p.act_dtype);
  const int64_t L = K.lanes[slot];                  // vector width of the packed layouts
  A* wb = reinterpret_cast<A*>(ws + pl.off_w);      // [Dp/L][W+1][L]: taps, then bias
  A* halo = pl.halo ? reinterpret_cast<A*>(ws + pl.off_halo) : nullptr;  // [N][W-1][Dp]
  A* part = pl.part ? reinterpret_cast<A*>(ws + pl.off_part) : nullptr;  // [tiles][W+1][tile_d]
  c.wT = wb;
  c.halo = halo;
  c.part = part;
  c.scr = pl.ws_scratch ? ws + pl.off_scr : nullptr;
  c.chains = pl.tree ? reinterpret_cast<int64_t*>(ws + pl.off_tree) : nullptr;

  const int wclass = p.W <= kMaxWClass ? p.W : 0;
  const int act = int(p.act);  // a listed activation id (validated)
  const TileFn tile_fn = pl.tree     ? K.tree[slot][act]
                         : pl.decode ? K.decode[slot][act][wclass]
                         : p.dir == Dir::fwd ? K.fwd[slot][act][wclass] : K.bwd[slot][act][wclass];

  // Waking a team costs more than a tiny call's work (decode steps): below
  // kMinElemsPerThread elements per thread, use fewer threads.  Safe because
  // the decomposition, and so every result, is independent of the team size.
  constexpr int64_t kMinElemsPerThread = int64_t(1) << 15;
  const int64_t elems = ((Count(pl.total) + Count(p.N) * p.S) * std::max<int64_t>(p.D, 1)).value();
  const int want = p.exec.num_threads > 0 ? p.exec.num_threads : omp_get_max_threads();
  const int nt = int(std::clamp<int64_t>(elems / kMinElemsPerThread, 1, std::max(want, 1)));
  const FpMode caller_mode = FpMode::current();  // every worker computes in the caller's modes

#pragma omp parallel num_threads(nt)
  {
    const FpMode::Scope fp_scope(caller_mode);
    pack_params(p, pl, L, wb);  // 0
    if (pl.runs) id_states(p, pl, c.seqs, halo);  // 1
    else if (!pl.decode) states(p, pl, c.seqs, halo);  // (decode tasks do their own states)
    if (pl.run_tiles) {         // 2: the tiles (cpu_kernels.hpp), or decode tasks
#pragma omp for schedule(static)
      for (int64_t t = 0; t < pl.n_tasks; ++t) tile_fn(c, t);
    }
    if (p.dir == Dir::bwd && (p.dweight || p.dbias)) reduce_partials(p, pl, L, part);  // 3
  }
}

}  // namespace

sc_status workspace(const Problem& p, size_t* bytes, sc_error* err) {
  const Plan pl = make_plan(p);
  if (pl.too_large) return workspace_too_large(p, err);
  *bytes = pl.bytes;
  return SC_OK;
}

sc_status run(const Problem& p, sc_error* err) {
  const Plan pl = make_run_plan(p);
  if (pl.too_large) return workspace_too_large(p, err);
  if (!p.exec.workspace || p.exec.workspace_bytes < pl.bytes)
    return fail(err, SC_ERR_WORKSPACE, "exec.workspace: expected at least %zu bytes, got %zu",
                pl.bytes, p.exec.workspace_bytes);
  char* ws = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p.exec.workspace) + 63) &
                                     ~uintptr_t(63));
  if (p.act_dtype == SC_F64)
    run_impl<double>(p, pl, ws);
  else
    run_impl<float>(p, pl, ws);
  return SC_OK;
}

}  // namespace shortconv::cpu
