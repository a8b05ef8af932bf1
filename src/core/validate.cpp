// One validation for every backend, the CLI and the Python package.
// Each rule here is listed in docs/semantics.md ("Validation"); every message
// names the argument and says what was expected and what was given.
//
// validate() runs the stages below in order; each returns SC_OK to go on or
// the status of the first failure (its message in err).  The single-tensor
// checks they use live in checker.hpp.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/activation.hpp"
#include "core/backend.hpp"
#include "core/checker.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"

namespace shortconv {

namespace {

using namespace validation;

// What the stages so far have established about the call.
struct Call {
  Call(const sc_conv_args& args, Dir d, sc_error* e, bool host_memory)
      : a(args), dir(d), err(e), c(e, host_memory), fwd(d == Dir::fwd), W(args.width) {}
  const sc_conv_args& a;
  Dir dir;
  sc_error* err;
  Checker c;
  bool fwd;
  int W;
  int S = 0;
  const char* S_from = "state_len";  // the argument S was taken from
  sc_dtype A = SC_F32;               // activation dtype (x's)
  sc_dtype P = SC_F32;               // parameter dtype (weight's)
  sc_dtype Z = SC_F32;               // state dtype (the first state tensor's)
  bool packed = false;
  bool table = false;                // forward with a block table: pools without indices
  bool ids = false;                  // seq_idx describes the batch (section 3)
  View xv;                           // x as [B, T, D]
  int64_t B = 0, T = 0, D = 0, N = 0;
};

// ---- exec and scalars -------------------------------------------------------
sc_status check_exec(const sc_exec& ex, sc_error* err, const Backend** out) {
  const Backend* be = find_backend(ex.backend);
  if (!be) {
    std::string known;
    for (int32_t id = 0; const Backend* k = find_backend(id); ++id)
      known += (id ? ", " : "") + std::to_string(id) + " (" + k->name + ")";
    return fail(err, SC_ERR_INVALID_ARGUMENT, "exec.backend: expected one of %s, got %d",
                known.c_str(), ex.backend);
  }
  if (!be->compiled)
    return fail(err, SC_ERR_UNSUPPORTED,
                "exec.backend: the %s backend is not compiled into this build of shortconv",
                be->name);
  if (ex.num_threads < 0)
    return fail(err, SC_ERR_INVALID_ARGUMENT, "exec.num_threads: expected >= 0, got %d",
                ex.num_threads);
  if (ex.tile_t < 0 || ex.tile_d < 0)
    return fail(err, SC_ERR_INVALID_ARGUMENT, "exec.tile_t/tile_d: expected >= 0, got %lld/%lld",
                (long long)ex.tile_t, (long long)ex.tile_d);
  if (ex.overlap < SC_OVERLAP_NONE || ex.overlap > SC_OVERLAP_READS)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "exec.overlap: expected 0 (none), 1 (launch) or 2 (reads), got %d", ex.overlap);
  *out = be;
  return SC_OK;
}

sc_status check_scalars(const sc_conv_args& a, sc_error* err) {
  if (a.width < 1 || a.width > SC_MAX_WIDTH)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "width: expected 1 <= W <= %d (SC_MAX_WIDTH), got %d", SC_MAX_WIDTH, a.width);
  if (!activation_name(a.activation)) {
    std::string known;
    for (int id = 0; id < Activations::kCount; ++id)
      known += (id ? ", " : "") + std::to_string(id) + " (" + activation_name(id) + ")";
    return fail(err, SC_ERR_INVALID_ARGUMENT, "activation: expected one of %s, got %d",
                known.c_str(), a.activation);
  }
  return SC_OK;
}

// ---- x and the batch structure ------------------------------------------------
sc_status check_batch(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  k.packed = present(a.cu_seqlens);
  k.ids = present(a.seq_idx);
  if (!present(a.x)) return fail(k.err, SC_ERR_INVALID_ARGUMENT, "x: required, got an absent tensor");
  if (k.ids && k.packed)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "seq_idx: given together with cu_seqlens; describe a packed batch by one of them");
  if (k.ids && a.x.ndim == 2)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "x: with seq_idx expected shape [B, T, D], got %s", shape_str(a.x).c_str());
  if (!c.basic("x", a.x, k.packed ? 2 : 3, 3) || !c.float_dtype("x", a.x)) return c.status;
  if (k.packed && a.x.ndim == 3 && a.x.shape[0] != 1)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "x: a packed batch (cu_seqlens given) expects shape [1, total, D] or [total, D], "
                "got %s", shape_str(a.x).c_str());
  k.A = sc_dtype(a.x.dtype);
  to_act_view(a.x, &k.xv);
  k.B = k.xv.shape[0];
  k.T = k.xv.shape[1];
  k.D = k.xv.shape[2];
  k.N = k.B;
  if (k.packed) {
    if (!c.basic("cu_seqlens", a.cu_seqlens, 1, 1) || !c.index_dtype("cu_seqlens", a.cu_seqlens))
      return c.status;
    if (a.cu_seqlens.shape[0] < 1)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "cu_seqlens: expected N+1 >= 1 entries, got shape [0]");
    k.N = a.cu_seqlens.shape[0] - 1;
  }
  if (k.ids) {
    if (!c.basic("seq_idx", a.seq_idx, 2, 2) || !c.index_dtype("seq_idx", a.seq_idx) ||
        !c.shape_is("seq_idx", a.seq_idx, {k.B, k.T}, "= [B, T] (x's first two dims)"))
      return c.status;
    k.N = k.B * k.T;  // the packed batch of section 3 (fits: seq_idx's count was checked)
  }
  return SC_OK;
}

// ---- weight, bias ---------------------------------------------------------------
// An optional [D] vector in the weight's dtype: bias, dbias.
bool check_param_vec(Call& k, const char* name, const sc_tensor& t) {
  return !present(t) || (k.c.basic(name, t, 1, 1) &&
                         k.c.same_dtype(name, t, k.P, "weight's dtype") &&
                         k.c.shape_is(name, t, {k.D}, "= [D]"));
}

sc_status check_params(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  if (!present(a.weight))
    return fail(k.err, SC_ERR_INVALID_ARGUMENT, "weight: required, got an absent tensor");
  if (!c.basic("weight", a.weight, 2, 2) || !c.float_dtype("weight", a.weight) ||
      !c.shape_is("weight", a.weight, {k.D, k.W}, "= [D, W] (D from x, W = width)"))
    return c.status;
  k.P = sc_dtype(a.weight.dtype);
  return check_param_vec(k, "bias", a.bias) ? SC_OK : c.status;
}

// ---- state length and dtype -------------------------------------------------------
// S comes from args.state_len, or from the first state tensor present.
sc_status check_state_len(Call& k) {
  const sc_conv_args& a = k.a;
  const sc_tensor* states[4] = {&a.initial_state, &a.final_state, &a.dfinal_state,
                                &a.dinitial_state};
  const char* state_names[4] = {"initial_state", "final_state", "dfinal_state", "dinitial_state"};
  const bool state_used[4] = {true, k.fwd, !k.fwd, !k.fwd};
  const int W = k.W;
  int S = a.state_len;
  if (S < -1)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "state_len: expected S >= W-1 = %d (or -1 to infer), got %d", W - 1, S);
  k.Z = k.A;
  bool have_state = false;
  for (int i = 0; i < 4; ++i) {
    if (!state_used[i] || !present(*states[i])) continue;
    if (!k.c.basic(state_names[i], *states[i], 3, 3) ||
        !k.c.float_dtype(state_names[i], *states[i]))
      return k.c.status;
    if (!have_state) {
      k.Z = sc_dtype(states[i]->dtype);
      have_state = true;
      if (S == -1) {
        if (states[i]->shape[2] > INT32_MAX)
          return fail(k.err, SC_ERR_INVALID_ARGUMENT, "%s: state length %lld exceeds int32",
                      state_names[i], (long long)states[i]->shape[2]);
        S = int(states[i]->shape[2]);
        k.S_from = state_names[i];
      }
    }
  }
  if (S == -1) S = W - 1;
  if (S < W - 1)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "%s: state length S must be >= W-1 = %d, got S = %d", k.S_from, W - 1, S);
  k.S = S;
  return SC_OK;
}

// (row, sequence) pairs of a content check, sorted to find repeats: in place
// up to kInline pairs (a decode step's batch: the call allocates nothing), on
// the heap past them.
class RowPairs {
 public:
  using Pair = std::pair<int64_t, int64_t>;
  void push(int64_t row, int64_t n) {
    if (heap_.empty() && m_ < kInline) {
      buf_[m_++] = {row, n};
      return;
    }
    if (heap_.empty()) heap_.assign(buf_, buf_ + m_);
    heap_.push_back({row, n});
  }
  Pair* begin() { return heap_.empty() ? buf_ : heap_.data(); }
  Pair* end() { return begin() + size(); }
  size_t size() const { return heap_.empty() ? m_ : heap_.size(); }
  bool empty() const { return size() == 0; }
  const Pair& front() { return *begin(); }
  void sort() { std::sort(begin(), end()); }

 private:
  static constexpr size_t kInline = 64;
  Pair buf_[kInline];
  size_t m_ = 0;
  std::vector<Pair> heap_;
};

// ---- state tensors and pool indices -------------------------------------------------
// The rows a pool index tensor names (host memory only): in range, and for an
// output pool no row named by two sequences (it would be written twice, an
// order-dependent result: "no element written twice", section 7).
bool check_pool_rows(Call& k, const char* idx_name, const sc_tensor& idx, const sc_tensor& pool,
                     bool output) {
  const int64_t N = k.N;
  View iv;
  to_view(idx, &iv);
  // A broadcast index tensor (stride 0) holds one value N times: check it
  // once (N may be 2^58 with no memory behind it).
  const int64_t distinct = iv.stride[0] == 0 ? std::min<int64_t>(N, 1) : N;
  for (int64_t n = 0; n < distinct; ++n) {
    int64_t r = load_index(iv, n);
    if ((r < -1 || r >= pool.shape[0]) && r != k.a.pad_index)
      return k.c.bad(SC_ERR_INVALID_ARGUMENT,
                     "%s[%lld]: pool row index out of range: expected -1 <= index < P = %lld "
                     "(or pad_index = %lld), got %lld", idx_name, (long long)n,
                     (long long)pool.shape[0], (long long)k.a.pad_index, (long long)r);
  }
  auto writes = [&](int64_t r) { return r >= 0 && r != k.a.pad_index; };
  if (!output || pool.shape[1] == 0 || pool.shape[2] == 0) return true;  // empty rows: nothing written
  if (distinct < N && writes(load_index(iv, 0)))
    return k.c.bad(SC_ERR_INVALID_ARGUMENT,
                   "%s[1]: pool row %lld is also written by sequence 0 (a broadcast index "
                   "tensor names one row for all %lld sequences); an output row may be "
                   "named by one sequence only (or -1)",
                   idx_name, (long long)load_index(iv, 0), (long long)N);
  RowPairs pairs;  // (row, n) for rows >= 0
  for (int64_t n = 0; n < distinct; ++n)
    if (int64_t r = load_index(iv, n); writes(r)) pairs.push(r, n);
  pairs.sort();
  const RowPairs::Pair* rows = pairs.begin();
  for (size_t i = 1; i < pairs.size(); ++i)
    if (rows[i].first == rows[i - 1].first)
      return k.c.bad(SC_ERR_INVALID_ARGUMENT,
                     "%s[%lld]: pool row %lld is also written by sequence %lld; an output "
                     "row may be named by one sequence only (or -1)",
                     idx_name, (long long)rows[i].second, (long long)rows[i].first,
                     (long long)rows[i - 1].second);
  return true;
}

// A present state tensor of a seq_idx call: a pool [P, D, S] whose row i is
// id i's (section 3); no pool indices (the id is the row); dinitial_state has
// initial_state's rows.  Ids against P: check_seq_ids (host memory).
bool check_id_state(Call& k, const char* name, const sc_tensor& t, const char* idx_name,
                    const sc_tensor* idx) {
  Checker& c = k.c;
  if (idx && present(*idx))
    return c.bad(SC_ERR_INVALID_ARGUMENT,
                 "%s: not allowed with seq_idx (state rows are addressed by sequence id)",
                 idx_name);
  const sc_tensor& h0 = k.a.initial_state;
  if (name == std::string("dinitial_state") && present(h0)) {
    if (t.shape[0] != h0.shape[0] || t.shape[1] != k.D || t.shape[2] != k.S)
      return c.bad(SC_ERR_INVALID_ARGUMENT,
                   "dinitial_state: expected shape [P=%lld, D=%lld, S=%d] like initial_state "
                   "(rows by sequence id), got %s",
                   (long long)h0.shape[0], (long long)k.D, k.S, shape_str(t).c_str());
    return true;
  }
  if (t.shape[1] != k.D || t.shape[2] != k.S)
    return c.bad(SC_ERR_INVALID_ARGUMENT,
                 "%s: expected shape [P, D=%lld, S=%d] (rows by sequence id, S from %s), got %s",
                 name, (long long)k.D, k.S, k.S_from, shape_str(t).c_str());
  return true;
}

// One state tensor t (absent allowed), addressed through the pool indices idx
// when those are given (idx == nullptr: a tensor without indices).
bool check_state(Call& k, const char* name, const sc_tensor& t, const char* idx_name,
                 const sc_tensor* idx, bool output) {
  Checker& c = k.c;
  if (!present(t)) {
    if (idx && present(*idx))
      return c.bad(SC_ERR_INVALID_ARGUMENT, "%s: given but %s is absent", idx_name, name);
    return true;
  }
  if (!c.same_dtype(name, t, k.Z, "all state tensors share one dtype")) return false;
  if (k.ids) return check_id_state(k, name, t, idx_name, idx);
  if (idx && present(*idx)) {
    if (!c.basic(idx_name, *idx, 1, 1) || !c.index_dtype(idx_name, *idx) ||
        !c.shape_is(idx_name, *idx, {k.N}, "= [N], one row per sequence"))
      return false;
    if (t.shape[1] != k.D || t.shape[2] != k.S)
      return c.bad(SC_ERR_INVALID_ARGUMENT,
                   "%s: expected a state pool of shape [P, D=%lld, S=%d] (S from %s), got %s",
                   name, (long long)k.D, k.S, k.S_from, shape_str(t).c_str());
    return !c.host() || check_pool_rows(k, idx_name, *idx, t, output);
  }
  if (k.table && idx) {  // a pool whose rows the block table names (checked with it)
    if (t.shape[1] != k.D || t.shape[2] != k.S)
      return c.bad(SC_ERR_INVALID_ARGUMENT,
                   "%s: expected a state pool of shape [P, D=%lld, S=%d] (S from %s; rows named "
                   "by block_table), got %s", name, (long long)k.D, k.S, k.S_from,
                   shape_str(t).c_str());
    return true;
  }
  return c.shape_is(name, t, {k.N, k.D, k.S},
                    k.S_from == std::string("state_len") ? "= [N, D, S] (S from state_len)"
                                                         : "= [N, D, S]");
}

sc_status check_states(Call& k) {
  const sc_conv_args& a = k.a;
  k.table = k.fwd && present(a.block_table);
  if (!check_state(k, "initial_state", a.initial_state, "initial_state_indices",
                   &a.initial_state_indices, false))
    return k.c.status;
  if (k.fwd && !check_state(k, "final_state", a.final_state, "final_state_indices",
                            &a.final_state_indices, true))
    return k.c.status;
  if (!k.fwd && (!check_state(k, "dfinal_state", a.dfinal_state, nullptr, nullptr, false) ||
                 !check_state(k, "dinitial_state", a.dinitial_state, nullptr, nullptr, true)))
    return k.c.status;
  return SC_OK;
}

// ---- state addressing: initial-state flags and ring rows (section 5) ---------------
// An optional [N] tensor: its rank, dtype and length.
bool check_per_sequence(Call& k, const char* name, const sc_tensor& t, bool flags) {
  Checker& c = k.c;
  if (!c.basic(name, t, 1, 1)) return false;
  if (flags ? !is_flag_dtype(t.dtype) : !is_index_dtype(t.dtype))
    return c.bad(SC_ERR_INVALID_ARGUMENT, "%s: expected dtype %s, got %s", name,
                 flags ? "bool, int32 or int64" : "int32 or int64", dtype_name(t.dtype));
  return c.shape_is(name, t, {k.N}, "= [N], one entry per sequence");
}

sc_status check_addressing(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  if (k.ids)
    for (auto [name, t] : {std::pair{"has_initial_state", &a.has_initial_state},
                           std::pair{"ring_offsets", &a.ring_offsets}})
      if (present(*t))
        return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                    "%s: not allowed with seq_idx (it has one entry per sequence of [N], and "
                    "sequence ids do not number the sequences)", name);
  if (present(a.has_initial_state)) {
    if (!present(a.initial_state))
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "has_initial_state: given but initial_state is absent");
    if (!check_per_sequence(k, "has_initial_state", a.has_initial_state, true)) return c.status;
  }
  if (!present(a.ring_offsets)) return SC_OK;
  const bool any_state = present(a.initial_state) || (k.fwd && present(a.final_state));
  if (!any_state)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT, "ring_offsets: given but no state tensor is (%s)",
                k.fwd ? "initial_state and final_state are absent" : "initial_state is absent");
  if (!check_per_sequence(k, "ring_offsets", a.ring_offsets, false)) return c.status;
  if (!c.host()) return SC_OK;  // device memory: the kernels reduce offsets mod S
  View rv;
  to_view(a.ring_offsets, &rv);
  for (int64_t n = 0, last = rv.stride[0] == 0 ? std::min<int64_t>(k.N, 1) : k.N; n < last; ++n)
    if (const int64_t v = load_index(rv, n); v < 0)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT, "ring_offsets[%lld]: expected >= 0, got %lld",
                  (long long)n, (long long)v);
  return SC_OK;
}

// ---- serving steps: speculative decoding and tree drafts (section 5) ---------------
bool state_in_place(const Call& k);  // (below: the overlap stage's)

// Problem-like lookups on the raw arguments, for content checks after the
// shapes are known (host memory only).
struct Rows {
  const Call& k;
  View h0, h0i, ht, hti, flags, cu;
  explicit Rows(const Call& kk) : k(kk) {
    to_view(k.a.initial_state, &h0);
    to_view(k.a.initial_state_indices, &h0i);
    to_view(k.a.final_state, &ht);
    to_view(k.a.final_state_indices, &hti);
    to_view(k.a.has_initial_state, &flags);
    to_view(k.a.cu_seqlens, &cu);
    if (k.table) {  // (contents: checked by the block-table stage before any use here)
      to_view(k.a.block_table, &tbl);
      to_view(k.a.initial_block, &ib);
      to_view(k.a.final_block, &fb);
    }
  }
  View tbl, ib, fb;
  int64_t none(int64_t r) const { return r == k.a.pad_index ? -1 : r; }
  int64_t read(int64_t n) const {  // the row sequence n reads (-1: none)
    if (!h0 || (flags && !load_flag(flags, n))) return -1;
    if (tbl) return none(load_index(tbl, n, load_index(ib, n)));
    return h0i ? none(load_index(h0i, n)) : n;
  }
  int64_t written(int64_t n) const {  // its final-state row
    if (!k.fwd || !ht) return -1;
    if (tbl) return none(load_index(tbl, n, load_index(fb, n)));
    return hti ? none(load_index(hti, n)) : n;
  }
  int64_t len(int64_t n) const {
    return k.packed ? load_index(cu, n + 1) - load_index(cu, n) : k.T;
  }
};

// The rows sequence n writes with a block table: its final state and its
// snapshots, appended to w as (row, n) (contents checked before).
void table_writes(const Call& k, const Rows& r, int64_t n, RowPairs* w) {
  if (const int64_t row = r.written(n); row >= 0) w->push(row, n);
  if (k.a.block_size <= 0) return;
  View fst, cmp;
  to_view(k.a.first_block, &fst);
  to_view(k.a.computed_tokens, &cmp);
  int64_t m0 = 0;
  const int64_t nb = block_boundaries(load_index(cmp, n), r.len(n), k.a.block_size, &m0);
  for (int64_t j = 0; j < nb; ++j)
    if (const int64_t row = r.none(load_index(r.tbl, n, load_index(fst, n) + j)); row >= 0)
      w->push(row, n);
}

// In place: no row written for one sequence and read by another (its value
// would depend on the order of the two).
sc_status check_cross_reads(Call& k) {
  const sc_conv_args& a = k.a;
  if (!k.c.host() || !state_in_place(k)) return SC_OK;
  if (!k.table && (!present(a.final_state_indices) || a.final_state_indices.stride[0] == 0))
    return SC_OK;  // (no indices: each row its own; broadcast: one row for all, refused before)
  const Rows r(k);
  RowPairs w;  // (row written, sequence)
  for (int64_t n = 0; n < k.N; ++n) {
    if (k.table) table_writes(k, r, n, &w);
    else if (const int64_t row = r.written(n); row >= 0) w.push(row, n);
  }
  w.sort();
  for (int64_t m = 0; m < k.N; ++m) {
    const int64_t row = r.read(m);
    if (row < 0) continue;
    const RowPairs::Pair* it = std::lower_bound(w.begin(), w.end(), std::make_pair(row, int64_t(-1)));
    if (it != w.end() && it->first == row && it->second != m)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "%s[%lld]: pool row %lld is read by sequence %lld and written for sequence "
                  "%lld (%s) in this in-place call; a row written for one sequence may not be "
                  "another's initial state", k.table ? "block_table" : "initial_state_indices",
                  (long long)m, (long long)row, (long long)m, (long long)it->second,
                  k.table ? "its final state or a snapshot" : "final_state_indices");
  }
  return SC_OK;
}

// num_accepted: which sequences it is read for, and the window and new
// entries inside the row.
sc_status check_accepted(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  if (!present(a.initial_state) && !present(a.final_state))
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "num_accepted: given but initial_state and final_state are absent");
  if (present(a.ring_offsets))
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "num_accepted: not combinable with ring_offsets (a speculative row is read at "
                "an offset and rewritten from its start, not a ring)");
  if (!check_per_sequence(k, "num_accepted", a.num_accepted, false)) return c.status;
  // a dense batch's lengths are its shape (T each), on any device: checked here
  if (!k.packed && k.N > 0 && k.T > 0 && (k.W - 2) + k.T > k.S)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "num_accepted: every sequence has T = %lld tokens, so its row needs (W-2) + T = "
                "%lld entries, but S = %d (%s)",
                (long long)k.T, (long long)(k.W - 2 + k.T), k.S, k.S_from);
  if (!c.host()) return SC_OK;  // device memory (contents): the kernels clamp
  const Rows r(k);
  View av;
  to_view(a.num_accepted, &av);
  const int64_t hi = int64_t(k.S) - (k.W - 1) + 1;
  const bool one = av.stride[0] == 0 && (!r.h0i || r.h0i.stride[0] == 0) &&
                   (!r.flags || r.flags.stride[0] == 0) && (!k.packed || r.cu.stride[0] == 0);
  for (int64_t n = 0, last = one ? std::min<int64_t>(k.N, 1) : k.N; n < last; ++n) {
    if (const int64_t v = load_index(av, n); r.read(n) >= 0 && (v < 1 || v > hi))
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "num_accepted[%lld]: expected 1 <= count <= S - (W-1) + 1 = %lld (the window "
                  "of W-1 = %d entries inside the row of S = %d), got %lld",
                  (long long)n, (long long)hi, k.W - 1, k.S, (long long)v);
    if (const int64_t L = r.len(n); L > 0 && (k.W - 2) + L > k.S)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "num_accepted: sequence %lld has %lld tokens, so its row needs (W-2) + L = "
                  "%lld entries, but S = %d (%s)",
                  (long long)n, (long long)L, (long long)(k.W - 2 + L), k.S, k.S_from);
  }
  return SC_OK;
}

// parent_tokens: [N, M], M covering every sequence, parents pointing backwards.
sc_status check_parents(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  const sc_tensor& t = a.parent_tokens;
  if (!c.basic("parent_tokens", t, 2, 2) || !c.index_dtype("parent_tokens", t)) return c.status;
  if (t.shape[0] != k.N || (!k.packed && t.shape[1] < k.T))
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "parent_tokens: expected shape [N = %lld, M >= %s], one row of parents per "
                "sequence, got %s", (long long)k.N, k.packed ? "the longest sequence" :
                std::to_string(k.T).c_str(), shape_str(t).c_str());
  if (!c.host()) return SC_OK;  // device memory: the kernels read a bad parent as t - 1
  const Rows r(k);
  View pv;
  to_view(t, &pv);
  const bool one_row = pv.stride[0] == 0 && (!k.packed || r.cu.stride[0] == 0);
  for (int64_t n = 0, last = one_row ? std::min<int64_t>(k.N, 1) : k.N; n < last; ++n) {
    const int64_t L = r.len(n);
    if (L > t.shape[1])
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "parent_tokens: sequence %lld has %lld tokens but rows of M = %lld parents",
                  (long long)n, (long long)L, (long long)t.shape[1]);
    // a stride-0 token axis holds one parent for every token: checked at t = 1
    for (int64_t tok = 1, end = pv.stride[1] == 0 ? std::min<int64_t>(L, 2) : L; tok < end; ++tok)
      if (const int64_t p = load_index(pv, n, tok); p < 0 || p >= tok)
        return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                    "parent_tokens[%lld, %lld]: expected a parent in [0, %lld) (an earlier token "
                    "of the step), got %lld", (long long)n, (long long)tok, (long long)tok,
                    (long long)p);
  }
  return SC_OK;
}

// The serving arguments are forward-only: the backward refuses them first.
sc_status check_forward_only(Call& k) {
  const sc_conv_args& a = k.a;
  if (k.fwd) return SC_OK;
  const char* given = present(a.num_accepted)      ? "num_accepted"
                      : present(a.parent_tokens)   ? "parent_tokens"
                      : present(a.block_table)     ? "block_table"
                      : present(a.initial_block)   ? "initial_block"
                      : present(a.final_block)     ? "final_block"
                      : present(a.first_block)     ? "first_block"
                      : present(a.computed_tokens) ? "computed_tokens"
                      : a.block_size != 0          ? "block_size"
                                                   : nullptr;
  if (!given) return SC_OK;
  return fail(k.err, SC_ERR_UNSUPPORTED,
              "%s: serving steps are forward-only (the backward of a speculative, tree or "
              "prefix-cached step is not defined); the backward takes none of num_accepted, "
              "parent_tokens, block_table, initial_block, final_block, first_block, "
              "computed_tokens, block_size", given);
}

// Padded slots' outputs set to 0 (semantics section 5): a flag, forward only, and
// "padded" is said by state indices.
sc_status check_zero_pads(Call& k) {
  const sc_conv_args& a = k.a;
  if (a.zero_padded_outputs == 0) return SC_OK;
  if (a.zero_padded_outputs != 1)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT, "zero_padded_outputs: expected 0 or 1, got %d",
                int(a.zero_padded_outputs));
  if (!k.fwd)
    return fail(k.err, SC_ERR_UNSUPPORTED,
                "zero_padded_outputs: forward only (padded outputs set to 0 have no backward "
                "here); the backward takes 0");
  if (!present(a.initial_state_indices) && !present(a.final_state_indices))
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "zero_padded_outputs: a padded sequence is one whose state indices name no row; "
                "expected initial_state_indices or final_state_indices");
  return SC_OK;
}

sc_status check_serving(Call& k) {
  const sc_conv_args& a = k.a;
  const bool spec = present(a.num_accepted), tree = present(a.parent_tokens);
  if (!spec && !tree) return SC_OK;
  if (k.ids)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "%s: not combinable with seq_idx (a serving step names its sequences by offsets "
                "or dense rows)", spec ? "num_accepted" : "parent_tokens");
  sc_status st = SC_OK;
  if (spec) st = check_accepted(k);
  if (st == SC_OK && tree) st = check_parents(k);
  return st;
}

// ---- block tables and prefix caching (section 5) -----------------------------------
// All of a group's arguments, or none: the first one given and the first absent.
sc_status check_together(Call& k, const char* group,
                         std::initializer_list<std::pair<const char*, bool>> members) {
  const char* given = nullptr;
  const char* absent = nullptr;
  for (const auto& [name, here] : members) {
    if (here && !given) given = name;
    if (!here && !absent) absent = name;
  }
  if (!given || !absent) return SC_OK;
  return fail(k.err, SC_ERR_INVALID_ARGUMENT, "%s: %s go together; %s is given but %s is absent",
              absent, group, given, absent);
}

sc_status check_table_shapes(Call& k, bool snapshots) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  const sc_tensor& t = a.block_table;
  if (!c.basic("block_table", t, 2, 2) || !c.index_dtype("block_table", t)) return c.status;
  if (t.shape[0] != k.N)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "block_table: expected shape [N = %lld, M], one row of pool rows per sequence, "
                "got %s", (long long)k.N, shape_str(t).c_str());
  if (!check_per_sequence(k, "initial_block", a.initial_block, false) ||
      !check_per_sequence(k, "final_block", a.final_block, false))
    return c.status;
  if (snapshots && (!check_per_sequence(k, "first_block", a.first_block, false) ||
                    !check_per_sequence(k, "computed_tokens", a.computed_tokens, false)))
    return c.status;
  return SC_OK;
}

// Host contents: block indices inside the table, table entries inside the
// pools, computed_tokens >= 0, no row written twice.
sc_status check_table_contents(Call& k, bool snapshots) {
  const sc_conv_args& a = k.a;
  const Rows r(k);
  const int64_t M = a.block_table.shape[1];
  View fst, cmp;
  to_view(a.first_block, &fst);
  to_view(a.computed_tokens, &cmp);
  auto entry = [&](int64_t n, int64_t b, const sc_tensor& pool, const char* blk) -> sc_status {
    if (b < 0 || b >= M)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "%s[%lld]: expected a block index in [0, M = %lld) of block_table, got %lld",
                  blk, (long long)n, (long long)M, (long long)b);
    const int64_t row = load_index(r.tbl, n, b);
    if ((row < -1 || row >= pool.shape[0]) && row != a.pad_index)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "block_table[%lld, %lld]: pool row index out of range: expected -1 <= index < "
                  "P = %lld (or pad_index = %lld), got %lld", (long long)n, (long long)b,
                  (long long)pool.shape[0], (long long)a.pad_index, (long long)row);
    return SC_OK;
  };
  // Every per-sequence argument broadcast (stride 0): one sequence stands for all
  // (N may be 2^58 with no memory behind it).
  bool one = r.tbl.stride[0] == 0 && r.ib.stride[0] == 0 && r.fb.stride[0] == 0 &&
             (!k.packed || r.cu.stride[0] == 0) && (!r.flags || r.flags.stride[0] == 0);
  if (snapshots) one = one && fst.stride[0] == 0 && cmp.stride[0] == 0;
  const int64_t distinct = one ? std::min<int64_t>(k.N, 1) : k.N;
  RowPairs w;
  for (int64_t n = 0; n < distinct; ++n) {
    sc_status st = SC_OK;
    if (present(a.initial_state)) st = entry(n, load_index(r.ib, n), a.initial_state, "initial_block");
    if (st == SC_OK && present(a.final_state))
      st = entry(n, load_index(r.fb, n), a.final_state, "final_block");
    if (st != SC_OK) return st;
    if (!snapshots) continue;
    const int64_t cn = load_index(cmp, n);
    if (cn < 0)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT, "computed_tokens[%lld]: expected >= 0, got %lld",
                  (long long)n, (long long)cn);
    int64_t m0 = 0;
    const int64_t nb = block_boundaries(cn, r.len(n), a.block_size, &m0), f = load_index(fst, n);
    if (nb > 0 && (f < 0 || f > M - nb))
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "first_block[%lld]: the chunk holds %lld block boundaries, so it needs 0 <= "
                  "first_block and first_block + %lld < M = %lld, got %lld", (long long)n,
                  (long long)nb, (long long)(nb - 1), (long long)M, (long long)f);
    for (int64_t j = 0; j < nb && st == SC_OK; ++j) st = entry(n, f + j, a.final_state, "first_block");
    if (st != SC_OK) return st;
  }
  if (!present(a.final_state) || a.final_state.shape[1] == 0 || a.final_state.shape[2] == 0)
    return SC_OK;  // empty rows: nothing is written
  for (int64_t n = 0; n < distinct; ++n) table_writes(k, r, n, &w);
  if (distinct < k.N && !w.empty())
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "block_table: pool row %lld is written for every one of %lld sequences (the "
                "block-table arguments are broadcast); every row written may be named once",
                (long long)w.front().first, (long long)k.N);
  w.sort();
  const RowPairs::Pair* p = w.begin();
  for (size_t i = 1; i < w.size(); ++i)
    if (p[i].first == p[i - 1].first)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "block_table: pool row %lld is written twice (for sequences %lld and %lld: "
                  "final states and snapshots); every row written may be named once",
                  (long long)p[i].first, (long long)p[i - 1].second, (long long)p[i].second);
  return SC_OK;
}

// The groups first (before the state shapes, which depend on the table).
sc_status check_table_groups(Call& k) {
  const sc_conv_args& a = k.a;
  sc_status st = check_together(k, "the block-table arguments (block_table, initial_block, "
                                "final_block)", {{"block_table", present(a.block_table)},
                                {"initial_block", present(a.initial_block)},
                                {"final_block", present(a.final_block)}});
  if (st == SC_OK && a.block_size < 0)
    st = fail(k.err, SC_ERR_INVALID_ARGUMENT,
              "block_size: expected >= 1 (or 0: no prefix caching), got %lld", (long long)a.block_size);
  if (st == SC_OK)
    st = check_together(k, "the prefix-caching arguments (block_size, computed_tokens, "
                        "first_block)", {{"block_size", a.block_size > 0},
                        {"computed_tokens", present(a.computed_tokens)},
                        {"first_block", present(a.first_block)}});
  if (st == SC_OK && a.block_size > 0 && !present(a.block_table))
    st = fail(k.err, SC_ERR_INVALID_ARGUMENT,
              "block_size: prefix caching writes its snapshots to rows named by block_table, "
              "which is absent");
  return st;
}

sc_status check_block_tables(Call& k) {
  const sc_conv_args& a = k.a;
  const bool snapshots = a.block_size > 0;
  if (!k.table) return SC_OK;
  if (k.ids)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "block_table: not combinable with seq_idx (with seq_idx row i is id i's)");
  const char* bad =
      present(a.initial_state_indices) || present(a.final_state_indices)
          ? "not combinable with initial_state_indices / final_state_indices (the table names the rows)"
      : !present(a.initial_state) && !present(a.final_state)
          ? "given but initial_state and final_state are absent"
      : present(a.ring_offsets) ? "not combinable with ring_offsets"
      : snapshots && !present(a.final_state) ? "prefix caching writes into final_state, which is absent"
      : snapshots && (present(a.num_accepted) || present(a.parent_tokens))
          ? "prefix caching (block_size) is for prefill chunks: not combinable with num_accepted or "
            "parent_tokens"
          : nullptr;
  if (bad) return fail(k.err, SC_ERR_INVALID_ARGUMENT, "block_table: %s", bad);
  if (const sc_status st = check_table_shapes(k, snapshots); st != SC_OK || !k.c.host()) return st;
  return check_table_contents(k, snapshots);
}

// ---- activation-like tensors and the parameter gradients ----------------------------
bool check_act(Call& k, const char* name, const sc_tensor& t) {
  const sc_tensor& x = k.a.x;
  if (!present(t)) return true;
  if (!k.c.basic(name, t, x.ndim, x.ndim) || !k.c.same_dtype(name, t, k.A, "x's dtype"))
    return false;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] != x.shape[i])
      return k.c.bad(SC_ERR_INVALID_ARGUMENT, "%s: expected shape like x %s, got %s", name,
                     shape_str(x).c_str(), shape_str(t).c_str());
  return true;
}

sc_status check_act_like(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  if (k.fwd) return check_act(k, "residual", a.residual) && check_act(k, "y", a.y) ? SC_OK : c.status;
  if (!check_act(k, "dy", a.dy) || !check_act(k, "dx", a.dx)) return c.status;
  if (present(a.dweight) &&
      (!c.basic("dweight", a.dweight, 2, 2) ||
       !c.same_dtype("dweight", a.dweight, k.P, "weight's dtype") ||
       !c.shape_is("dweight", a.dweight, {k.D, k.W}, "= [D, W] like weight")))
    return c.status;
  return check_param_vec(k, "dbias", a.dbias) ? SC_OK : c.status;
}

// ---- cu_seqlens contents (host memory only; the CUDA backend clamps) ------------------
sc_status check_cu_seqlens(Call& k) {
  if (!k.packed || !k.c.host()) return SC_OK;
  View cv;
  to_view(k.a.cu_seqlens, &cv);
  int64_t prev = load_index(cv, 0);
  if (prev != 0)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT, "cu_seqlens[0]: expected 0, got %lld",
                (long long)prev);
  // Broadcast (stride 0): every entry is cu_seqlens[0] == 0, checked above.
  for (int64_t n = 1, last = cv.stride[0] == 0 ? 0 : k.N; n <= last; ++n) {
    int64_t v = load_index(cv, n);
    if (v < prev)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "cu_seqlens[%lld]: expected non-decreasing offsets, got %lld after %lld",
                  (long long)n, (long long)v, (long long)prev);
    prev = v;
  }
  if (prev != k.T)
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "cu_seqlens[%lld]: expected the token count %lld (x.shape[%d]), got %lld",
                (long long)k.N, (long long)k.T, k.a.x.ndim == 2 ? 0 : 1, (long long)prev);
  return SC_OK;
}

// ---- seq_idx contents (host memory only; the CUDA backend clamps) ---------------------
// Each run's id against the rows of every state tensor the direction uses and,
// with a final state or a state gradient, each id >= 0 in one run only (section
// 3).  Read once per distinct element: a broadcast (stride-0) time axis makes a
// row one run, a broadcast batch axis repeats row 0.
sc_status check_seq_ids(Call& k) {
  if (!k.ids || !k.c.host() || k.B == 0 || k.T == 0) return SC_OK;
  const sc_conv_args& a = k.a;
  std::vector<std::pair<const char*, int64_t>> states;  // (name, rows)
  auto use = [&](const char* name, const sc_tensor& t) {
    if (present(t)) states.push_back({name, t.shape[0]});
  };
  use("initial_state", a.initial_state);
  if (k.fwd) use("final_state", a.final_state);
  if (!k.fwd) use("dfinal_state", a.dfinal_state);
  if (!k.fwd) use("dinitial_state", a.dinitial_state);
  const char* one_run = k.fwd ? (present(a.final_state) ? "final_state" : nullptr)
                        : present(a.dfinal_state)   ? "dfinal_state"
                        : present(a.dinitial_state) ? "dinitial_state"
                                                    : nullptr;
  View v;
  to_view(a.seq_idx, &v);
  auto id_at = [&](int64_t b, int64_t t) {
    return load_index_at(v, b * v.stride[0] + t * v.stride[1]);
  };
  const int64_t rows = v.stride[0] == 0 ? 1 : k.B, len = v.stride[1] == 0 ? 1 : k.T;
  std::vector<std::pair<int64_t, int64_t>> runs;  // (id, b * T + t) of each run with an id >= 0
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t t = 0; t < len; ++t) {
      const int64_t id = id_at(b, t);
      if (id < 0 || (t > 0 && id == id_at(b, t - 1))) continue;  // padding, or inside a run
      for (const auto& [name, P] : states)
        if (id >= P)
          return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                      "seq_idx[%lld, %lld]: sequence id %lld is not a row of %s (expected an id "
                      "< %lld, its row count, or a negative id for padding)",
                      (long long)b, (long long)t, (long long)id, name, (long long)P);
      if (one_run) runs.push_back({id, b * k.T + t});
    }
  if (!one_run) return SC_OK;
  if (rows < k.B && !runs.empty())  // every later row repeats row 0's runs
    return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                "seq_idx[1, %lld]: sequence id %lld starts a second run (a broadcast batch axis "
                "repeats row 0); with %s each id may have one run only",
                (long long)(runs[0].second % k.T), (long long)runs[0].first, one_run);
  std::sort(runs.begin(), runs.end());
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].first == runs[i - 1].first)
      return fail(k.err, SC_ERR_INVALID_ARGUMENT,
                  "seq_idx[%lld, %lld]: sequence id %lld starts a second run (the first starts at "
                  "seq_idx[%lld, %lld]); with %s each id may have one run only",
                  (long long)(runs[i].second / k.T), (long long)(runs[i].second % k.T),
                  (long long)runs[i].first, (long long)(runs[i - 1].second / k.T),
                  (long long)(runs[i - 1].second % k.T), one_run);
  return SC_OK;
}

// ---- outputs: no self-overlap, no overlap with inputs or other outputs ---------------
// Whether final_state is exactly initial_state (the aliased decode update).
bool state_in_place(const Call& k) {
  const sc_conv_args& a = k.a;
  return k.fwd && present(a.final_state) && present(a.initial_state) &&
         same_memory(a.final_state, a.initial_state);
}

sc_status check_overlaps(Call& k) {
  const sc_conv_args& a = k.a;
  Checker& c = k.c;
  struct Named {
    const char* name;
    const sc_tensor* t;
  };
  // Fixed-size lists (validation runs on every call and allocates nothing):
  // the inputs of both directions, then the direction's own.
  constexpr size_t kMaxIns = 17, kMaxOuts = 4;
  Named ins[kMaxIns] = {{"x", &a.x}, {"weight", &a.weight}, {"bias", &a.bias},
                        {"cu_seqlens", &a.cu_seqlens},
                        {"initial_state_indices", &a.initial_state_indices},
                        {"has_initial_state", &a.has_initial_state},
                        {"ring_offsets", &a.ring_offsets}, {"seq_idx", &a.seq_idx},
                        {"num_accepted", &a.num_accepted},
                        {"parent_tokens", &a.parent_tokens},
                        {"block_table", &a.block_table},
                        {"initial_block", &a.initial_block},
                        {"final_block", &a.final_block},
                        {"first_block", &a.first_block},
                        {"computed_tokens", &a.computed_tokens}};
  size_t n_in = 15, n_out = 0;
  Named outs[kMaxOuts];
  if (k.fwd) {
    ins[n_in++] = {"residual", &a.residual};
    ins[n_in++] = {"final_state_indices", &a.final_state_indices};
    outs[n_out++] = {"y", &a.y};
    outs[n_out++] = {"final_state", &a.final_state};
  } else {
    ins[n_in++] = {"dy", &a.dy};
    ins[n_in++] = {"dfinal_state", &a.dfinal_state};
    outs[n_out++] = {"dx", &a.dx};
    outs[n_out++] = {"dweight", &a.dweight};
    outs[n_out++] = {"dbias", &a.dbias};
    outs[n_out++] = {"dinitial_state", &a.dinitial_state};
  }
  const bool in_place = state_in_place(k);
  for (size_t i = 0; i < n_out; ++i) {
    const sc_tensor& o = *outs[i].t;
    if (!present(o)) continue;
    if (!c.no_self_overlap(outs[i].name, o)) return c.status;
    for (size_t m = 0; m < n_in; ++m)
      if (present(*ins[m].t) && !c.disjoint(outs[i].name, o, ins[m].name, *ins[m].t))
        return c.status;
    const bool aliased_state = in_place && &o == &a.final_state;
    if (present(a.initial_state) && !aliased_state &&
        !c.disjoint(outs[i].name, o, "initial_state", a.initial_state))
      return c.status;
    for (size_t j = i + 1; j < n_out; ++j)
      if (present(*outs[j].t) && !c.disjoint(outs[i].name, o, outs[j].name, *outs[j].t))
        return c.status;
  }
  return SC_OK;
}

// ---- fill the problem ---------------------------------------------------------------
void fill_problem(const Call& k, Problem* p) {
  const sc_conv_args& a = k.a;
  *p = Problem{};
  p->dir = k.dir;
  p->W = k.W;
  p->S = k.S;
  p->act = sc_activation(a.activation);
  p->B = k.B;
  p->T = k.T;
  p->D = k.D;
  p->N = k.N;
  p->packed = k.packed;
  p->act_dtype = k.A;
  p->param_dtype = k.P;
  p->state_dtype = k.Z;
  p->x = k.xv;
  to_view(a.weight, &p->weight);
  to_view(a.bias, &p->bias);
  to_view(a.cu_seqlens, &p->cu_seqlens);
  to_view(a.initial_state, &p->h0);
  to_view(a.initial_state_indices, &p->h0_idx);
  to_view(a.has_initial_state, &p->has_h0);
  to_view(a.ring_offsets, &p->ring);
  p->pad_index = a.pad_index;
  to_view(a.seq_idx, &p->seq_idx);
  if (k.fwd) {
    to_view(a.num_accepted, &p->accepted);
    to_view(a.parent_tokens, &p->parents);
    to_view(a.block_table, &p->table);
    to_view(a.initial_block, &p->init_blk);
    to_view(a.final_block, &p->final_blk);
    to_view(a.first_block, &p->first_blk);
    to_view(a.computed_tokens, &p->computed);
    p->block_size = present(a.block_table) ? a.block_size : 0;
    p->zero_pads = a.zero_padded_outputs != 0;
    to_act_view(a.residual, &p->residual);
    to_act_view(a.y, &p->y);
    to_view(a.final_state, &p->ht);
    to_view(a.final_state_indices, &p->ht_idx);
    p->state_in_place = state_in_place(k);
  } else {
    to_act_view(a.dy, &p->dy);
    to_view(a.dfinal_state, &p->dht);
    to_act_view(a.dx, &p->dx);
    to_view(a.dweight, &p->dweight);
    to_view(a.dbias, &p->dbias);
    to_view(a.dinitial_state, &p->dh0);
  }
  p->exec = a.exec;
}

}  // namespace

sc_status validate(const sc_conv_args* a, Dir dir, Problem* p, sc_error* err) {
  if (err) err->message[0] = '\0';
  if (!a) return fail(err, SC_ERR_INVALID_ARGUMENT, "args: NULL pointer");
  if (!p) return fail(err, SC_ERR_INVALID_ARGUMENT, "problem: NULL pointer");
  if (a->struct_size != sizeof(sc_conv_args))
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "args.struct_size: expected %zu (call sc_conv_args_init), got %u",
                sizeof(sc_conv_args), a->struct_size);
  const Backend* be = nullptr;
  sc_status st = check_exec(a->exec, err, &be);
  if (st == SC_OK) st = check_scalars(*a, err);
  if (st != SC_OK) return st;

  Call k(*a, dir, err, be->memory == Memory::host);
  for (sc_status (*stage)(Call&) : {check_batch, check_forward_only, check_zero_pads,
                                    check_table_groups, check_params, check_state_len, check_states,
                                    check_addressing, check_act_like, check_cu_seqlens,
                                    check_seq_ids, check_block_tables, check_serving,
                                    check_overlaps, check_cross_reads})
    if ((st = stage(k)) != SC_OK) return st;
  fill_problem(k, p);
  return SC_OK;
}

}  // namespace shortconv
