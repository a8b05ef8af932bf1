// The validated, normalised description of one call, shared by every backend.
//
// validate() (validate.cpp) turns an sc_conv_args into a Problem or an error
// naming the argument; backends receive only Problems and may assume every
// rule of docs/semantics.md "Validation" holds (shapes consistent, strides
// non-negative, outputs non-overlapping, cu_seqlens / indices sane when the
// backend reads host memory).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shortconv/shortconv.h"

namespace shortconv {

enum class Dir { fwd, bwd };

// A normalised strided view.  Activation-like tensors always have 3 dims in
// logical order [B, T, D] (a packed [total, D] input becomes [1, total, D]);
// states have 3 dims [rows, D, S]; weight [D, W]; bias / indices / cu_seqlens
// 1 dim.  Unused trailing dims have shape 1, stride 0.
struct View {
  void* data = nullptr;
  sc_dtype dtype = SC_F32;
  bool present = false;
  int64_t shape[3] = {1, 1, 1};
  int64_t stride[3] = {0, 0, 0};

  explicit operator bool() const { return present; }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // element offset of index (i0, i1, i2)
  int64_t off(int64_t i0, int64_t i1 = 0, int64_t i2 = 0) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
  }
};

// Reads element i of a 1-D int32/int64 host tensor (element (i, j) of a 2-D one).
int64_t load_index(const View& v, int64_t i);
int64_t load_index(const View& v, int64_t i, int64_t j);
// Reads the int32/int64 host element at element offset `off` (any rank).
int64_t load_index_at(const View& v, int64_t off);

struct Problem {
  Dir dir = Dir::fwd;
  int W = 1;              // width
  int S = 0;              // state length, >= W-1
  sc_activation act = SC_ACT_NONE;

  int64_t B = 0, T = 0, D = 0;  // x viewed as [B, T, D]; packed: B == 1, T = total tokens
  int64_t N = 0;                // sequences: B (dense) or cu_seqlens.shape[0]-1 (packed)
  bool packed = false;

  sc_dtype act_dtype = SC_F32;    // x, residual, y, dy, dx
  sc_dtype param_dtype = SC_F32;  // weight, bias, dweight, dbias
  sc_dtype state_dtype = SC_F32;  // every state tensor (meaningful when one is present)

  // inputs
  View x;            // [B, T, D]
  View weight;       // [D, W]
  View bias;         // [D]
  View residual;     // [B, T, D] (forward)
  View cu_seqlens;   // [N+1] int32/int64 (packed only)
  View h0;           // [N, D, S], or pool [P, D, S] when h0_idx present
  View h0_idx;       // [N] int32/int64, -1: zero initial state
  View dy;           // [B, T, D] (backward; absent = zeros)
  View dht;          // [N, D, S] (backward; absent = zeros)

  // outputs (absent = not requested)
  View y;            // [B, T, D]
  View ht;           // [N, D, S], or pool [P, D, S] when ht_idx present
  View ht_idx;       // [N] int32/int64, -1: do not write
  View dx;           // [B, T, D]
  View dweight;      // [D, W]
  View dbias;        // [D]
  View dh0;          // [N, D, S]

  // state addressing (docs/semantics.md section 5), both directions
  View has_h0;         // [N] bool/int32/int64: false = zero initial state (row not read)
  View ring;           // [N] int32/int64: state rows are rings, entry j at slot (ring[n] + j) mod S
  int64_t pad_index = -1;  // a state index meaning "no row", besides -1

  // serving steps (docs/semantics.md section 5), forward only
  View accepted;       // [N] int32/int64: speculative decoding (window at accepted - 1)
  View parents;        // [N, M] int32/int64: tree drafts (parent of token t of sequence n)
  View table;          // [N, M] int32/int64: block_table, pool rows per sequence's blocks
  View init_blk;       // [N]: block read (with table)
  View final_blk;      // [N]: block written (with table)
  View first_blk;      // [N]: block of the first snapshot (prefix caching)
  View computed;       // [N]: the chunk's first absolute position (prefix caching)
  int64_t block_size = 0;  // > 0: prefix caching (snapshots at block boundaries)
  bool zero_pads = false;  // padded sequences' outputs are 0 (forward, with state indices)
  // sequence ids (docs/semantics.md section 3): runs of one id in a row are the
  // sequences, negative ids padding; N = B*T (the packed batch, empty after the
  // last run); state tensors are pools whose row i is id i's (no state indices,
  // flags or rings)
  View seq_idx;        // [B, T] int32/int64

  bool state_in_place = false;  // ht is exactly h0's memory (aliased decode update)

  sc_exec exec{};

  // Host-side helpers for host backends (cu_seqlens and indices in host memory).
  int64_t seq_begin(int64_t n) const;   // first token (index into T) of sequence n
  int64_t seq_len(int64_t n) const;     // L_n
  int64_t seq_batch(int64_t n) const { return packed ? 0 : n; }  // batch row of sequence n
  int64_t h0_row(int64_t n) const;      // row of h0 for sequence n, -1 if none (or flag false)
  int64_t ht_row(int64_t n) const;      // row of ht for sequence n, -1 if none
  // slot of logical state entry j of sequence n in its row (rings: rotated)
  int64_t state_slot(int64_t n, int64_t j) const;
  // slot of final-state entry j (= u entry L_n + j) of sequence n in its row
  int64_t final_slot(int64_t n, int64_t j) const;
  // seq_idx[b, t] (host memory)
  int64_t seq_id(int64_t b, int64_t t) const {
    return load_index_at(seq_idx, b * seq_idx.stride[0] + t * seq_idx.stride[1]);
  }

  // Speculative decoding: the row entry the W-1 window of sequence n starts at
  // (accepted[n] - 1; without num_accepted the last W-1 entries, S - (W-1)),
  // and the entries its final state writes (S; speculative: (W-2) + L_n, 0
  // for a zero-length sequence).
  int64_t window_start(int64_t n) const;
  int64_t final_entries(int64_t n) const;
  // Padded slots (zero_pads): every state index tensor given names no row for
  // sequence n (-1 or pad_index; host memory).
  bool padded(int64_t n) const;
  // Tree drafts: the parent of token t >= 1 of sequence n (t - 1 without parents).
  int64_t parent(int64_t n, int64_t t) const;
  // Prefix caching: the block boundaries strictly inside sequence n's chunk, the
  // chunk's tokens before boundary k, and the row snapshot k goes to (-1: none).
  int64_t snapshots(int64_t n) const;
  int64_t snapshot_tokens(int64_t n, int64_t k) const;
  int64_t snapshot_row(int64_t n, int64_t k) const;
};

// y of every padded sequence (Problem::padded) set to +0 (host memory): the
// forward's last step on host backends with zero_pads.
void zero_padded_outputs(const Problem& p);

// The block boundaries m * B strictly inside a chunk of L tokens from the
// absolute position c (c >= 0, B >= 1): their count, and in *first the m of
// the first one.
inline int64_t block_boundaries(int64_t c, int64_t L, int64_t B, int64_t* first) {
  *first = c / B + 1;
  if (L < 2) return 0;
  const int64_t last = (c + L - 1) / B;
  return last >= *first ? last - *first + 1 : 0;
}

// Reads element i of a 1-D bool/int32/int64 host tensor as 0 or 1.
int64_t load_flag(const View& v, int64_t i);

// Fills *out from args, or returns an error (message in err) and leaves *out
// unspecified.  Checks everything docs/semantics.md lists, including the
// contents of cu_seqlens and indices when the backend reads host memory.
// Does not check the workspace.
sc_status validate(const sc_conv_args* args, Dir dir, Problem* out, sc_error* err);

// Writes a formatted message into err (if not null) and returns status.
sc_status fail(sc_error* err, sc_status status, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace shortconv
