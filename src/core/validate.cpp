// One validation for every backend, the CLI and the Python package.
// Each rule here is listed in docs/semantics.md ("Validation"); every message
// names the argument and says what was expected and what was given.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/activation.hpp"
#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"

namespace shortconv {

sc_status fail(sc_error* err, sc_status status, const char* fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
  }
  return status;
}

int64_t load_index(const View& v, int64_t i) {
  const int64_t o = i * v.stride[0];
  return v.dtype == SC_I32 ? int64_t(static_cast<const int32_t*>(v.data)[o])
                           : static_cast<const int64_t*>(v.data)[o];
}

int64_t Problem::seq_begin(int64_t n) const { return packed ? load_index(cu_seqlens, n) : 0; }
int64_t Problem::seq_len(int64_t n) const {
  return packed ? load_index(cu_seqlens, n + 1) - load_index(cu_seqlens, n) : T;
}
int64_t Problem::h0_row(int64_t n) const {
  if (!h0) return -1;
  return h0_idx ? load_index(h0_idx, n) : n;
}
int64_t Problem::ht_row(int64_t n) const {
  if (!ht) return -1;
  return ht_idx ? load_index(ht_idx, n) : n;
}

namespace {

std::string shape_str(const sc_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

// Byte range [lo, hi) a tensor touches, for overlap checks (strides >= 0).
struct Span {
  uintptr_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

class Checker {
 public:
  Checker(sc_error* err, bool host_memory) : err_(err), host_(host_memory) {}

  sc_status status = SC_OK;
  bool ok() const { return status == SC_OK; }

  template <class... A>
  bool bad(sc_status st, const char* fmt, A... a) {
    if (ok()) status = fail(err_, st, fmt, a...);
    return false;
  }

  // Structural checks shared by every tensor: rank, shape >= 0, strides >= 0,
  // no 64-bit overflow of the extent, data pointer when non-empty.
  bool basic(const char* name, const sc_tensor& t, int min_rank, int max_rank) {
    if (!ok()) return false;
    if (t.ndim < min_rank || t.ndim > max_rank) {
      if (min_rank == max_rank)
        return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected %d dims, got %d", name, min_rank, t.ndim);
      return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected %d to %d dims, got %d", name, min_rank,
                 max_rank, t.ndim);
    }
    int64_t numel = 1, extent = 0;  // extent: max element offset
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] < 0)
        return bad(SC_ERR_INVALID_ARGUMENT, "%s: shape[%d] must be >= 0, got %lld", name, i,
                   (long long)t.shape[i]);
      if (t.stride[i] < 0)
        return bad(SC_ERR_INVALID_ARGUMENT,
                   "%s: stride[%d] must be >= 0 (negative strides unsupported), got %lld", name, i,
                   (long long)t.stride[i]);
      if (__builtin_mul_overflow(numel, t.shape[i], &numel))
        return bad(SC_ERR_INVALID_ARGUMENT, "%s: element count of shape %s overflows 64 bits", name,
                   shape_str(t).c_str());
    }
    if (numel > 0) {
      for (int i = 0; i < t.ndim; ++i) {
        int64_t term;
        if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &term) ||
            __builtin_add_overflow(extent, term, &extent))
          return bad(SC_ERR_INVALID_ARGUMENT, "%s: largest offset of shape %s overflows 64 bits",
                     name, shape_str(t).c_str());
      }
      int64_t count, bytes;  // count = extent + 1 may itself overflow (extent == INT64_MAX)
      if (__builtin_add_overflow(extent, int64_t(1), &count) ||
          __builtin_mul_overflow(count, int64_t(dtype_size(t.dtype) ? dtype_size(t.dtype) : 1),
                                 &bytes))
        return bad(SC_ERR_INVALID_ARGUMENT, "%s: byte extent overflows 64 bits", name);
      if (!t.data)
        return bad(SC_ERR_INVALID_ARGUMENT, "%s: data pointer is NULL for a non-empty tensor %s",
                   name, shape_str(t).c_str());
    }
    return true;
  }

  bool float_dtype(const char* name, const sc_tensor& t) {
    if (!ok()) return false;
    if (!is_float_dtype(t.dtype))
      return bad(SC_ERR_INVALID_ARGUMENT,
                 "%s: expected a float dtype (float32, float16, bfloat16, float64), got %s (%d)",
                 name, dtype_name(t.dtype), t.dtype);
    return true;
  }

  bool same_dtype(const char* name, const sc_tensor& t, sc_dtype want, const char* why) {
    if (!ok()) return false;
    if (t.dtype != want)
      return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (%s), got %s", name,
                 dtype_name(want), why, dtype_name(t.dtype));
    return true;
  }

  bool index_dtype(const char* name, const sc_tensor& t) {
    if (!ok()) return false;
    if (!is_index_dtype(t.dtype))
      return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected dtype int32 or int64, got %s", name,
                 dtype_name(t.dtype));
    return true;
  }

  bool shape_is(const char* name, const sc_tensor& t, std::initializer_list<int64_t> want,
                const char* meaning) {
    if (!ok()) return false;
    bool same = int(want.size()) == t.ndim;
    int i = 0;
    for (int64_t w : want) {
      if (same && t.shape[i] != w) same = false;
      ++i;
    }
    if (!same)
      return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected shape %s %s, got %s", name,
                 shape_str(want).c_str(), meaning, shape_str(t).c_str());
    return true;
  }

  // An output must not write an element twice: with dims sorted by stride,
  // each stride must reach past the extent of the smaller dims.
  bool no_self_overlap(const char* name, const sc_tensor& t) {
    if (!ok()) return false;
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] == 0) return true;  // empty: nothing is written (contiguous strides may be 0)
      if (t.shape[i] > 1) dims.push_back({t.stride[i], t.shape[i]});
    }
    std::sort(dims.begin(), dims.end());
    int64_t reach = 1;  // elements spanned by the dims so far
    for (auto [stride, size] : dims) {
      if (stride < reach)
        return bad(SC_ERR_INVALID_ARGUMENT,
                   "%s: output strides make elements overlap (stride %lld for a dim of size %lld; "
                   "outputs need distinct memory per element, broadcast strides are for inputs)",
                   name, (long long)stride, (long long)size);
      reach = stride * (size - 1) + reach;
    }
    return true;
  }

  static Span span(const sc_tensor& t) {
    Span s;
    if (t.ndim == 0 || !t.data) return s;
    int64_t extent = 0;
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] == 0) return s;
      extent += (t.shape[i] - 1) * t.stride[i];
    }
    s.lo = reinterpret_cast<uintptr_t>(t.data);
    s.hi = s.lo + uintptr_t(extent + 1) * uintptr_t(dtype_size(t.dtype));
    return s;
  }

  // Overlapping byte ranges do not always mean shared elements: two column
  // slices of one fused buffer (x = qkv[..., :D], y = qkv[..., D:2D]) interleave.
  // Proves disjointness for views with the same element size and strides:
  // they share an element iff delta = sum_k c_k * stride_k (delta = the
  // base offset of b from a, in elements) has a solution with
  // -(nb_k - 1) <= c_k <= na_k - 1.  Searched from the largest stride down,
  // keeping only c_k whose remainder the smaller dims can still reach; gives
  // up (returns false: "may overlap") if that leaves more than 2 choices.
  static bool provably_disjoint(const sc_tensor& a, const sc_tensor& b) {
    const int es = dtype_size(a.dtype);
    if (es == 0 || es != dtype_size(b.dtype) || a.ndim != b.ndim || a.ndim > SC_MAX_DIMS)
      return false;
    const intptr_t bytes = reinterpret_cast<intptr_t>(b.data) - reinterpret_cast<intptr_t>(a.data);
    if (bytes % es != 0) return false;
    struct Dim { int64_t s, hi, lo; };  // stride, c_k range [lo, hi]
    Dim dims[SC_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < a.ndim; ++i) {
      if (a.shape[i] <= 1 && b.shape[i] <= 1) continue;
      if (a.stride[i] != b.stride[i]) return false;
      if (a.stride[i] == 0) continue;  // contributes no offset
      dims[n++] = {a.stride[i], a.shape[i] - 1, -(b.shape[i] - 1)};
    }
    for (int i = 1; i < n; ++i)  // insertion sort, largest stride first (n <= SC_MAX_DIMS)
      for (int j = i; j > 0 && dims[j - 1].s < dims[j].s; --j) std::swap(dims[j - 1], dims[j]);
    int64_t reach_hi[SC_MAX_DIMS + 1] = {}, reach_lo[SC_MAX_DIMS + 1] = {};  // dims k.. reach
    for (int k = n - 1; k >= 0; --k) {
      reach_hi[k] = reach_hi[k + 1] + dims[k].hi * dims[k].s;
      reach_lo[k] = reach_lo[k + 1] + dims[k].lo * dims[k].s;
    }
    auto floor_div = [](int64_t x, int64_t y) { return x / y - ((x % y != 0) && (x < 0)); };
    bool gave_up = false;
    auto solvable = [&](auto&& self, int k, int64_t r) -> bool {
      if (k >= n || k >= SC_MAX_DIMS) return r == 0;  // (the second test informs the compiler)
      const Dim& d = dims[k];
      // c with r - c*s in [reach_lo[k+1], reach_hi[k+1]]
      const int64_t cmin = std::max(d.lo, -floor_div(-(r - reach_hi[k + 1]), d.s));
      const int64_t cmax = std::min(d.hi, floor_div(r - reach_lo[k + 1], d.s));
      if (cmax - cmin > 1) {
        gave_up = true;
        return true;
      }
      for (int64_t c = cmin; c <= cmax; ++c)
        if (self(self, k + 1, r - c * d.s)) return true;
      return false;
    };
    const int64_t delta = int64_t(bytes / es);
    if (delta < reach_lo[0] || delta > reach_hi[0]) return true;
    return !solvable(solvable, 0, delta) && !gave_up;
  }

  bool disjoint(const char* out_name, const sc_tensor& out, const char* in_name,
                const sc_tensor& in) {
    if (!ok()) return false;
    Span a = span(out), b = span(in);
    if (a.empty() || b.empty()) return true;
    if (a.lo < b.hi && b.lo < a.hi && !provably_disjoint(out, in))
      return bad(SC_ERR_INVALID_ARGUMENT, "%s: output memory overlaps %s; outputs must not alias "
                 "inputs or other outputs (only final_state may be exactly initial_state)",
                 out_name, in_name);
    return true;
  }

  bool host() const { return host_; }

 private:
  sc_error* err_;
  bool host_;
};

bool present(const sc_tensor& t) { return t.ndim != 0; }

void to_view(const sc_tensor& t, View* v) {
  v->present = present(t);
  if (!v->present) return;
  v->data = t.data;
  v->dtype = sc_dtype(t.dtype);
  for (int i = 0; i < 3; ++i) {
    v->shape[i] = 1;
    v->stride[i] = 0;
  }
  for (int i = 0; i < t.ndim && i < 3; ++i) {
    v->shape[i] = t.shape[i];
    v->stride[i] = t.stride[i];
  }
}

// Activation-like [B, T, D] (or packed [total, D] -> [1, total, D]).
void to_act_view(const sc_tensor& t, View* v) {
  to_view(t, v);
  if (v->present && t.ndim == 2) {
    v->shape[0] = 1;
    v->stride[0] = 0;
    v->shape[1] = t.shape[0];
    v->stride[1] = t.stride[0];
    v->shape[2] = t.shape[1];
    v->stride[2] = t.stride[1];
  }
}

bool same_memory(const sc_tensor& a, const sc_tensor& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  return true;
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

  const sc_exec& ex = a->exec;
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

  Checker c(err, be->memory == Memory::host);
  const bool fwd = dir == Dir::fwd;

  if (a->width < 1 || a->width > SC_MAX_WIDTH)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "width: expected 1 <= W <= %d (SC_MAX_WIDTH), got %d", SC_MAX_WIDTH, a->width);
  if (!activation_name(a->activation)) {
    std::string known;
    for (int id = 0; id < Activations::kCount; ++id)
      known += (id ? ", " : "") + std::to_string(id) + " (" + activation_name(id) + ")";
    return fail(err, SC_ERR_INVALID_ARGUMENT, "activation: expected one of %s, got %d",
                known.c_str(), a->activation);
  }
  const int W = a->width;

  // ---- x and the batch structure -------------------------------------------
  const bool packed = present(a->cu_seqlens);
  if (!present(a->x)) return fail(err, SC_ERR_INVALID_ARGUMENT, "x: required, got an absent tensor");
  if (!c.basic("x", a->x, packed ? 2 : 3, 3) || !c.float_dtype("x", a->x)) return c.status;
  if (packed && a->x.ndim == 3 && a->x.shape[0] != 1)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "x: a packed batch (cu_seqlens given) expects shape [1, total, D] or [total, D], "
                "got %s", shape_str(a->x).c_str());
  const sc_dtype A = sc_dtype(a->x.dtype);
  View xv;
  to_act_view(a->x, &xv);
  const int64_t B = xv.shape[0], T = xv.shape[1], D = xv.shape[2];
  int64_t N = B;
  if (packed) {
    if (!c.basic("cu_seqlens", a->cu_seqlens, 1, 1) || !c.index_dtype("cu_seqlens", a->cu_seqlens))
      return c.status;
    if (a->cu_seqlens.shape[0] < 1)
      return fail(err, SC_ERR_INVALID_ARGUMENT,
                  "cu_seqlens: expected N+1 >= 1 entries, got shape [0]");
    N = a->cu_seqlens.shape[0] - 1;
  }
  const std::string xshape = "like x " + shape_str(a->x);

  // ---- weight, bias --------------------------------------------------------
  if (!present(a->weight))
    return fail(err, SC_ERR_INVALID_ARGUMENT, "weight: required, got an absent tensor");
  if (!c.basic("weight", a->weight, 2, 2) || !c.float_dtype("weight", a->weight) ||
      !c.shape_is("weight", a->weight, {D, W}, "= [D, W] (D from x, W = width)"))
    return c.status;
  const sc_dtype P = sc_dtype(a->weight.dtype);
  if (present(a->bias) &&
      (!c.basic("bias", a->bias, 1, 1) || !c.same_dtype("bias", a->bias, P, "weight's dtype") ||
       !c.shape_is("bias", a->bias, {D}, "= [D]")))
    return c.status;

  // ---- state length and dtype ------------------------------------------------
  // S comes from args.state_len, or from the first state tensor present.
  const sc_tensor* states[4] = {&a->initial_state, &a->final_state, &a->dfinal_state,
                                &a->dinitial_state};
  const char* state_names[4] = {"initial_state", "final_state", "dfinal_state", "dinitial_state"};
  const bool state_used[4] = {true, fwd, !fwd, !fwd};
  int S = a->state_len;
  if (S < -1)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "state_len: expected S >= W-1 = %d (or -1 to infer), got %d", W - 1, S);
  const char* S_from = "state_len";
  sc_dtype Z = A;
  bool have_state = false;
  for (int i = 0; i < 4; ++i) {
    if (!state_used[i] || !present(*states[i])) continue;
    if (!c.basic(state_names[i], *states[i], 3, 3) || !c.float_dtype(state_names[i], *states[i]))
      return c.status;
    if (!have_state) {
      Z = sc_dtype(states[i]->dtype);
      have_state = true;
      if (S == -1) {
        if (states[i]->shape[2] > INT32_MAX)
          return fail(err, SC_ERR_INVALID_ARGUMENT, "%s: state length %lld exceeds int32",
                      state_names[i], (long long)states[i]->shape[2]);
        S = int(states[i]->shape[2]);
        S_from = state_names[i];
      }
    }
  }
  if (S == -1) S = W - 1;
  if (S < W - 1)
    return fail(err, SC_ERR_INVALID_ARGUMENT,
                "%s: state length S must be >= W-1 = %d, got S = %d", S_from, W - 1, S);

  // ---- states --------------------------------------------------------------
  auto check_state = [&](const char* name, const sc_tensor& t, const char* idx_name,
                         const sc_tensor* idx, bool output) -> bool {
    if (!present(t)) {
      if (idx && present(*idx))
        return c.bad(SC_ERR_INVALID_ARGUMENT, "%s: given but %s is absent", idx_name, name);
      return true;
    }
    if (!c.same_dtype(name, t, Z, "all state tensors share one dtype")) return false;
    if (idx && present(*idx)) {
      if (!c.basic(idx_name, *idx, 1, 1) || !c.index_dtype(idx_name, *idx) ||
          !c.shape_is(idx_name, *idx, {N}, "= [N], one row per sequence"))
        return false;
      if (t.shape[1] != D || t.shape[2] != S)
        return c.bad(SC_ERR_INVALID_ARGUMENT,
                     "%s: expected a state pool of shape [P, D=%lld, S=%d] (S from %s), got %s",
                     name, (long long)D, S, S_from, shape_str(t).c_str());
      if (c.host()) {
        View iv;
        to_view(*idx, &iv);
        // A broadcast index tensor (stride 0) holds one value N times: check it
        // once (N may be 2^58 with no memory behind it).
        const int64_t distinct = iv.stride[0] == 0 ? std::min<int64_t>(N, 1) : N;
        for (int64_t n = 0; n < distinct; ++n) {
          int64_t r = load_index(iv, n);
          if (r < -1 || r >= t.shape[0])
            return c.bad(SC_ERR_INVALID_ARGUMENT,
                         "%s[%lld]: pool row index out of range: expected -1 <= index < P = %lld, "
                         "got %lld", idx_name, (long long)n, (long long)t.shape[0], (long long)r);
        }
        // An output pool row named by two sequences would be written twice
        // (order-dependent result): "no element written twice" (section 7).
        if (output && t.shape[1] > 0 && t.shape[2] > 0) {  // empty rows: nothing written
          if (distinct < N && load_index(iv, 0) >= 0)
            return c.bad(SC_ERR_INVALID_ARGUMENT,
                         "%s[1]: pool row %lld is also written by sequence 0 (a broadcast index "
                         "tensor names one row for all %lld sequences); an output row may be "
                         "named by one sequence only (or -1)",
                         idx_name, (long long)load_index(iv, 0), (long long)N);
          std::vector<std::pair<int64_t, int64_t>> rows;  // (row, n) for rows >= 0
          for (int64_t n = 0; n < distinct; ++n)
            if (int64_t r = load_index(iv, n); r >= 0) rows.push_back({r, n});
          std::sort(rows.begin(), rows.end());
          for (size_t i = 1; i < rows.size(); ++i)
            if (rows[i].first == rows[i - 1].first)
              return c.bad(SC_ERR_INVALID_ARGUMENT,
                           "%s[%lld]: pool row %lld is also written by sequence %lld; an output "
                           "row may be named by one sequence only (or -1)",
                           idx_name, (long long)rows[i].second, (long long)rows[i].first,
                           (long long)rows[i - 1].second);
        }
      }
      return true;
    }
    return c.shape_is(name, t, {N, D, S},
                      S_from == std::string("state_len") ? "= [N, D, S] (S from state_len)"
                                                         : "= [N, D, S]");
  };
  if (!check_state("initial_state", a->initial_state, "initial_state_indices",
                   &a->initial_state_indices, false))
    return c.status;
  if (fwd && !check_state("final_state", a->final_state, "final_state_indices",
                          &a->final_state_indices, true))
    return c.status;
  if (!fwd && (!check_state("dfinal_state", a->dfinal_state, nullptr, nullptr, false) ||
               !check_state("dinitial_state", a->dinitial_state, nullptr, nullptr, true)))
    return c.status;

  // ---- activation-like tensors ---------------------------------------------
  auto check_act = [&](const char* name, const sc_tensor& t) -> bool {
    if (!present(t)) return true;
    if (!c.basic(name, t, a->x.ndim, a->x.ndim) || !c.same_dtype(name, t, A, "x's dtype"))
      return false;
    for (int i = 0; i < t.ndim; ++i)
      if (t.shape[i] != a->x.shape[i])
        return c.bad(SC_ERR_INVALID_ARGUMENT, "%s: expected shape %s, got %s", name,
                     xshape.c_str(), shape_str(t).c_str());
    return true;
  };
  if (fwd) {
    if (!check_act("residual", a->residual) || !check_act("y", a->y)) return c.status;
  } else {
    if (!check_act("dy", a->dy) || !check_act("dx", a->dx)) return c.status;
    if (present(a->dweight) &&
        (!c.basic("dweight", a->dweight, 2, 2) ||
         !c.same_dtype("dweight", a->dweight, P, "weight's dtype") ||
         !c.shape_is("dweight", a->dweight, {D, W}, "= [D, W] like weight")))
      return c.status;
    if (present(a->dbias) &&
        (!c.basic("dbias", a->dbias, 1, 1) ||
         !c.same_dtype("dbias", a->dbias, P, "weight's dtype") ||
         !c.shape_is("dbias", a->dbias, {D}, "= [D]")))
      return c.status;
  }

  // ---- cu_seqlens contents (host memory only; the CUDA backend clamps) ------
  if (packed && c.host()) {
    View cv;
    to_view(a->cu_seqlens, &cv);
    int64_t prev = load_index(cv, 0);
    if (prev != 0)
      return fail(err, SC_ERR_INVALID_ARGUMENT, "cu_seqlens[0]: expected 0, got %lld",
                  (long long)prev);
    // Broadcast (stride 0): every entry is cu_seqlens[0] == 0, checked above.
    for (int64_t n = 1, last = cv.stride[0] == 0 ? 0 : N; n <= last; ++n) {
      int64_t v = load_index(cv, n);
      if (v < prev)
        return fail(err, SC_ERR_INVALID_ARGUMENT,
                    "cu_seqlens[%lld]: expected non-decreasing offsets, got %lld after %lld",
                    (long long)n, (long long)v, (long long)prev);
      prev = v;
    }
    if (prev != T)
      return fail(err, SC_ERR_INVALID_ARGUMENT,
                  "cu_seqlens[%lld]: expected the token count %lld (x.shape[%d]), got %lld",
                  (long long)N, (long long)T, a->x.ndim == 2 ? 0 : 1, (long long)prev);
  }

  // ---- outputs: no self-overlap, no overlap with inputs or other outputs -----
  struct Named {
    const char* name;
    const sc_tensor* t;
  };
  std::vector<Named> ins = {{"x", &a->x}, {"weight", &a->weight}, {"bias", &a->bias},
                            {"cu_seqlens", &a->cu_seqlens},
                            {"initial_state_indices", &a->initial_state_indices}};
  std::vector<Named> outs;
  if (fwd) {
    ins.push_back({"residual", &a->residual});
    ins.push_back({"final_state_indices", &a->final_state_indices});
    outs = {{"y", &a->y}, {"final_state", &a->final_state}};
  } else {
    ins.push_back({"dy", &a->dy});
    ins.push_back({"dfinal_state", &a->dfinal_state});
    outs = {{"dx", &a->dx}, {"dweight", &a->dweight}, {"dbias", &a->dbias},
            {"dinitial_state", &a->dinitial_state}};
  }
  const bool in_place = fwd && present(a->final_state) && present(a->initial_state) &&
                        same_memory(a->final_state, a->initial_state);
  for (size_t i = 0; i < outs.size(); ++i) {
    const sc_tensor& o = *outs[i].t;
    if (!present(o)) continue;
    if (!c.no_self_overlap(outs[i].name, o)) return c.status;
    for (const Named& in : ins)
      if (present(*in.t) && !c.disjoint(outs[i].name, o, in.name, *in.t)) return c.status;
    const bool aliased_state = in_place && &o == &a->final_state;
    if (present(a->initial_state) && !aliased_state &&
        !c.disjoint(outs[i].name, o, "initial_state", a->initial_state))
      return c.status;
    for (size_t j = i + 1; j < outs.size(); ++j)
      if (present(*outs[j].t) && !c.disjoint(outs[i].name, o, outs[j].name, *outs[j].t))
        return c.status;
  }

  // ---- fill the problem ------------------------------------------------------
  *p = Problem{};
  p->dir = dir;
  p->W = W;
  p->S = S;
  p->act = sc_activation(a->activation);
  p->B = B;
  p->T = T;
  p->D = D;
  p->N = N;
  p->packed = packed;
  p->act_dtype = A;
  p->param_dtype = P;
  p->state_dtype = Z;
  p->x = xv;
  to_view(a->weight, &p->weight);
  to_view(a->bias, &p->bias);
  to_view(a->cu_seqlens, &p->cu_seqlens);
  to_view(a->initial_state, &p->h0);
  to_view(a->initial_state_indices, &p->h0_idx);
  if (fwd) {
    to_act_view(a->residual, &p->residual);
    to_act_view(a->y, &p->y);
    to_view(a->final_state, &p->ht);
    to_view(a->final_state_indices, &p->ht_idx);
    p->state_in_place = in_place;
  } else {
    to_act_view(a->dy, &p->dy);
    to_view(a->dfinal_state, &p->dht);
    to_act_view(a->dx, &p->dx);
    to_view(a->dweight, &p->dweight);
    to_view(a->dbias, &p->dbias);
    to_view(a->dinitial_state, &p->dh0);
  }
  p->exec = ex;
  return SC_OK;
}

}  // namespace shortconv
