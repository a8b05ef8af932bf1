// The Problem's host-side helpers and the error writer (problem.hpp).
#include <cstdarg>
#include <cstdio>

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

}  // namespace shortconv
