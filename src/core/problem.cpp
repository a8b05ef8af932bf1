// The Problem's host-side helpers and the error writer (problem.hpp).
#include <cstdarg>
#include <cstdio>

#include "core/problem.hpp"

#include <cstring>

#include "core/dtype.hpp"

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

int64_t load_index_at(const View& v, int64_t off) {
  return v.dtype == SC_I32 ? int64_t(static_cast<const int32_t*>(v.data)[off])
                           : static_cast<const int64_t*>(v.data)[off];
}
int64_t load_index(const View& v, int64_t i) { return load_index_at(v, i * v.stride[0]); }

int64_t load_index(const View& v, int64_t i, int64_t j) {
  return load_index_at(v, i * v.stride[0] + j * v.stride[1]);
}

int64_t Problem::seq_begin(int64_t n) const { return packed ? load_index(cu_seqlens, n) : 0; }
int64_t Problem::seq_len(int64_t n) const {
  return packed ? load_index(cu_seqlens, n + 1) - load_index(cu_seqlens, n) : T;
}
int64_t load_flag(const View& v, int64_t i) {
  if (v.dtype == SC_BOOL) return static_cast<const uint8_t*>(v.data)[i * v.stride[0]] != 0;
  return load_index(v, i) != 0;
}

// -1 and pad_index both mean "no row" (semantics section 5).
static int64_t row_or_none(int64_t r, int64_t pad_index) {
  return r == pad_index ? -1 : r;
}
int64_t Problem::h0_row(int64_t n) const {
  if (!h0 || (has_h0 && !load_flag(has_h0, n))) return -1;
  if (table) return row_or_none(load_index(table, n, load_index(init_blk, n)), pad_index);
  return h0_idx ? row_or_none(load_index(h0_idx, n), pad_index) : n;
}
int64_t Problem::ht_row(int64_t n) const {
  if (!ht) return -1;
  if (table) return row_or_none(load_index(table, n, load_index(final_blk, n)), pad_index);
  return ht_idx ? row_or_none(load_index(ht_idx, n), pad_index) : n;
}

bool Problem::padded(int64_t n) const {
  if (!h0_idx && !ht_idx) return false;
  return (!h0_idx || row_or_none(load_index(h0_idx, n), pad_index) < 0) &&
         (!ht_idx || row_or_none(load_index(ht_idx, n), pad_index) < 0);
}

void zero_padded_outputs(const Problem& p) {
  const int64_t es = dtype_size(p.act_dtype);
  char* y = static_cast<char*>(p.y.data);
  for (int64_t n = 0; n < p.N; ++n) {
    if (!p.padded(n)) continue;
    const int64_t b = p.seq_batch(n), t0 = p.seq_begin(n), L = p.seq_len(n);
    for (int64_t t = t0; t < t0 + L; ++t) {
      if (p.y.stride[2] == 1) {  // the token's channels: one block
        std::memset(y + p.y.off(b, t) * es, 0, size_t(p.D * es));
        continue;
      }
      for (int64_t d = 0; d < p.D; ++d) std::memset(y + p.y.off(b, t, d) * es, 0, size_t(es));
    }
  }
}

int64_t Problem::snapshots(int64_t n) const {
  if (block_size <= 0 || !ht) return 0;
  int64_t first = 0;
  return block_boundaries(load_index(computed, n), seq_len(n), block_size, &first);
}
int64_t Problem::snapshot_tokens(int64_t n, int64_t k) const {
  const int64_t c = load_index(computed, n);
  return (c / block_size + 1 + k) * block_size - c;
}
int64_t Problem::snapshot_row(int64_t n, int64_t k) const {
  return row_or_none(load_index(table, n, load_index(first_blk, n) + k), pad_index);
}

int64_t Problem::state_slot(int64_t n, int64_t j) const {
  if (!ring || S == 0) return j;
  const int64_t c = load_index(ring, n) % S;  // ring offsets are >= 0 (validated)
  const int64_t s = c + j % S;
  return s >= S ? s - S : s;
}

int64_t Problem::final_slot(int64_t n, int64_t j) const {
  return ring ? state_slot(n, seq_len(n) + j) : j;
}

int64_t Problem::window_start(int64_t n) const {
  return accepted ? load_index(accepted, n) - 1 : S - (W - 1);
}

int64_t Problem::final_entries(int64_t n) const {
  if (!accepted) return S;
  const int64_t L = seq_len(n);
  return L > 0 ? (W - 2) + L : 0;
}

int64_t Problem::parent(int64_t n, int64_t t) const {
  return parents ? load_index(parents, n, t) : t - 1;
}

}  // namespace shortconv
