// The single-tensor and tensor-pair checks of validation (checker.hpp).
#include "core/checker.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/dtype.hpp"

namespace shortconv::validation {

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

namespace {

// Byte range [lo, hi) a tensor touches, for overlap checks (strides >= 0).
struct Span {
  uintptr_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

Span span(const sc_tensor& t) {
  Span s;
  if (t.ndim == 0 || !t.data) return s;
  // Empty first: an empty tensor's other dims are not bounded by basic(), so
  // their extent may not even be representable.
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return s;
  int64_t extent = 0;
  for (int i = 0; i < t.ndim; ++i) extent += (t.shape[i] - 1) * t.stride[i];
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
bool provably_disjoint(const sc_tensor& a, const sc_tensor& b) {
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

}  // namespace

bool Checker::basic(const char* name, const sc_tensor& t, int min_rank, int max_rank) {
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

bool Checker::float_dtype(const char* name, const sc_tensor& t) {
  if (!ok()) return false;
  if (!is_float_dtype(t.dtype))
    return bad(SC_ERR_INVALID_ARGUMENT,
               "%s: expected a float dtype (float32, float16, bfloat16, float64), got %s (%d)",
               name, dtype_name(t.dtype), t.dtype);
  return true;
}

bool Checker::same_dtype(const char* name, const sc_tensor& t, sc_dtype want, const char* why) {
  if (!ok()) return false;
  if (t.dtype != want)
    return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected dtype %s (%s), got %s", name,
               dtype_name(want), why, dtype_name(t.dtype));
  return true;
}

bool Checker::index_dtype(const char* name, const sc_tensor& t) {
  if (!ok()) return false;
  if (!is_index_dtype(t.dtype))
    return bad(SC_ERR_INVALID_ARGUMENT, "%s: expected dtype int32 or int64, got %s", name,
               dtype_name(t.dtype));
  return true;
}

bool Checker::shape_is(const char* name, const sc_tensor& t, std::initializer_list<int64_t> want,
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
bool Checker::no_self_overlap(const char* name, const sc_tensor& t) {
  if (!ok()) return false;
  std::pair<int64_t, int64_t> dims[SC_MAX_DIMS];  // (stride, size) of dims with size > 1
  int n = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return true;  // empty: nothing is written (contiguous strides may be 0)
    if (t.shape[i] > 1) dims[n++] = {t.stride[i], t.shape[i]};
  }
  for (int i = 1; i < n; ++i)  // insertion sort of at most SC_MAX_DIMS pairs
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  int64_t reach = 1;  // elements spanned by the dims so far
  for (int i = 0; i < n; ++i) {
    const auto [stride, size] = dims[i];
    if (stride < reach)
      return bad(SC_ERR_INVALID_ARGUMENT,
                 "%s: output strides make elements overlap (stride %lld for a dim of size %lld; "
                 "outputs need distinct memory per element, broadcast strides are for inputs)",
                 name, (long long)stride, (long long)size);
    reach = stride * (size - 1) + reach;
  }
  return true;
}

bool Checker::disjoint(const char* out_name, const sc_tensor& out, const char* in_name,
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

void to_view(const sc_tensor& t, View* v) {
  v->present = present(t);
  if (!v->present) return;
  v->data = t.data;
  v->dtype = sc_dtype(t.dtype);
  for (int i = 0; i < 3; ++i) {
    v->shape[i] = 1;
    v->stride[i] = 0;
  }
  bool empty = false;
  for (int i = 0; i < t.ndim && i < 3; ++i) {
    v->shape[i] = t.shape[i];
    v->stride[i] = t.stride[i];
    empty = empty || t.shape[i] == 0;
  }
  // Nothing is ever addressed in an empty tensor, and validation bounds the
  // offsets of non-empty ones only: an empty view gets zero strides so that
  // base offsets computed from it (sequence n of a T = 0 batch) cannot overflow.
  if (empty)
    for (int i = 0; i < 3; ++i) v->stride[i] = 0;
}

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

}  // namespace shortconv::validation
