// The one test harness: describe a case, make random inputs, run any backend
// through the C ABI, fetch outputs as double vectors, compare to the oracle.
//
// Every backend is driven the same way:
//   Case  -> make_inputs()  (random, never zero, rounded to their storage dtype)
//         -> Prepared       (encodes the inputs into strided buffers, host or
//                            device; outputs poisoned with a NaN payload)
//         -> forward()/backward() through sc_forward / sc_backward
//         -> fetch()        (logical double vectors + counts of unwritten
//                            output elements and of stray writes)
// and chunked runs (head + tail, the head's final state handed over as the
// tail's initial state) are built from the same pieces (chunk.cpp).
//
// Logical orders of the double vectors (independent of the layout tested):
//   x, residual, y, dy, dx : [Bx, Tx, D]   (packed: Bx = 1, Tx = total tokens)
//   weight, dweight        : [D, W]
//   bias, dbias            : [D]
//   h0, ht                 : [rows, D, S]  (rows = pool size, or N; seq_idx: id_rows)
//   dht, dh0               : [N, D, S]     (seq_idx: [id_rows, D, S], rows by id)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shortconv/shortconv.h"

namespace shortconv::harness {

enum class Layout {
  token_major,    // [B, T, D] contiguous
  channel_major,  // [B, D, T] storage, strides {D*T, 1, T}
  strided,        // slot `view_slot` of a wider [B, T, view_mult*D] buffer (q of a fused qkv)
};
const char* layout_name(Layout l);

struct Case {
  int W = 4;
  int S = -1;  // state length; -1: W-1
  sc_activation act = SC_ACT_SILU;
  sc_dtype act_dtype = SC_F32;    // x, residual, y, dy, dx
  sc_dtype param_dtype = SC_F32;  // weight, bias, dweight, dbias
  sc_dtype state_dtype = SC_F32;  // h0, ht, dht, dh0
  sc_dtype index_dtype = SC_I32;  // cu_seqlens and pool indices
  int64_t D = 8;

  int64_t B = 1, T = 16;         // dense batch (when !packed)
  bool packed = false;           // packed batch of `lengths`
  std::vector<int64_t> lengths;  // packed sequence lengths (0 allowed)
  bool packed_2d = false;        // packed x given as [total, D] instead of [1, total, D]
  // Sequence ids (docs/semantics.md section 3) of a dense batch, [B*T] row after
  // row (negative: padding); empty: absent.  The state tensors are then [id_rows,
  // D, S] pools addressed by id (no pool indices, flags or rings).
  std::vector<int64_t> seq_idx;
  int64_t id_rows = 0;
  bool seq_idx_cm = false;       // seq_idx stored column-major: strides {1, B}

  Layout layout = Layout::token_major;
  int64_t view_mult = 3, view_slot = 1;  // Layout::strided

  bool bias = true;
  bool residual = false;
  bool h0 = false;        // initial_state given
  bool ht = false;        // final_state requested
  int64_t pool = 0;       // > 0: h0/ht are a pool [pool, D, S] addressed by the indices below
  std::vector<int64_t> h0_index, ht_index;  // [N] rows, -1 allowed (required when pool > 0)
  int64_t index_stride = 1;  // h0_index / ht_index / accepted stored every index_stride elements
                             // (strided views)
  bool in_place = false;  // final_state is exactly initial_state (needs h0 && ht)
  // State addressing (docs/semantics.md section 5); empty / -1: absent.
  std::vector<int64_t> has_h0;    // [N] has_initial_state flags (0/1), stored as flag_dtype
  sc_dtype flag_dtype = SC_BOOL;  // bool, int32 or int64
  std::vector<int64_t> ring;      // [N] ring_offsets (>= 0): state rows are rings
  int64_t pad_index = -1;         // a state index meaning "no row", besides -1
  bool zero_pads = false;         // zero_padded_outputs: padded sequences' outputs are 0
  bool state_transposed = false;  // h0/ht stored [rows, S, D]: strides {D*S, 1, D}
  // Elements before the origin of each state tensor in its buffer: a pool view aligned
  // to its element size, or to 4 or 8 bytes, only (device buffers are 256-byte
  // aligned, host ones malloc's 16).
  int64_t state_base = 0;
  // Serving steps (section 5), forward only; empty: absent.
  std::vector<int64_t> accepted;  // [N] num_accepted (speculative decoding)
  std::vector<int64_t> parents;   // [N, parent_cols] parent_tokens (tree drafts), row-major
  int64_t parent_cols = 0;        // M
  // Block tables and prefix caching (section 5); empty: absent.  With a table the
  // pool rows come from it (h0_index / ht_index unused).
  std::vector<int64_t> block_table;  // [N, table_cols] pool rows, row-major
  int64_t table_cols = 0;            // M; 0: no block table
  std::vector<int64_t> initial_block, final_block;  // [N]
  std::vector<int64_t> first_block, computed;       // [N] (prefix caching)
  int64_t block_size = 0;
  bool dht = false;       // dfinal_state given to the backward
  bool dy = true;         // dy given (absent = zeros)
  bool dy_broadcast = false;  // dy is one [D] row broadcast with strides {0, 0, 1}
  bool want_dx = true, want_dweight = true, want_dbias = true, want_dh0 = false;

  int64_t tile_t = 0, tile_d = 0;  // forced tiles (0 = automatic)
  int num_threads = 0;
  int overlap = SC_OVERLAP_NONE;   // exec.overlap (sc_overlap)
  uint64_t seed = 1;

  int state_len() const { return S < 0 ? W - 1 : S; }
  int64_t num_seqs() const { return packed ? int64_t(lengths.size()) : B; }
  int64_t xb() const { return packed ? 1 : B; }  // x viewed as [xb, xt, D]
  int64_t xt() const;
  int64_t state_rows() const { return by_ids() ? id_rows : pool > 0 ? pool : num_seqs(); }
  int64_t grad_rows() const { return by_ids() ? id_rows : num_seqs(); }  // of dht, dh0
  int64_t seq_len(int64_t n) const { return packed ? lengths[size_t(n)] : T; }
  bool table() const { return table_cols > 0; }
  bool serving() const { return !accepted.empty() || !parents.empty() || table(); }
  // Prefix caching: the boundaries inside sequence n's chunk, the chunk's tokens
  // before boundary k, and the row its snapshot goes to (-1: none).
  int64_t snapshots(int64_t n) const;
  int64_t snapshot_tokens(int64_t n, int64_t k) const;
  int64_t snapshot_row(int64_t n, int64_t k) const;
  int64_t h0_row(int64_t n) const;  // -1: none (also a false flag or the pad index)
  int64_t ht_row(int64_t n) const;  // -1: not written
  bool by_ids() const { return !seq_idx.empty(); }
  // The runs of seq_idx row after row: row b, tokens [t0, t1), the id.
  struct Run {
    int64_t b, t0, t1, id;
  };
  std::vector<Run> runs() const;
  // Whether final-state row r is written (a sequence or a real run names it).
  std::vector<char> ht_rows_written() const;
  std::string describe() const;
};

// Random inputs in logical order, every value already rounded to its storage
// dtype (so the oracle sees exactly what the backend sees); values are drawn
// from +-[0.25, 1] and are never zero.  Callers may edit them (a masked dy,
// a state handed over from another run) before running.
struct Inputs {
  std::vector<double> x, weight, bias, residual, h0, dy, dht;
  std::vector<int64_t> cu_seqlens;  // packed only
};

// The cu_seqlens packed batch equivalent to a seq_idx case (semantics section
// 3): x [1, B*T, D] with one sequence per run, pool indices = the ids (-1 for
// padding runs), dense dht / dh0 ([runs, D, S]) gathered from / scattered into
// the rows by id.  dy of padding tokens becomes 0 (their dpre then adds only
// zeros).  Token-major, c's dtypes, tiles and optionals.
void packed_equivalent(const Case& c, const Inputs& in, Case* out_c, Inputs* out_in);
Inputs make_inputs(const Case& c);

// Outputs in logical order (see the top of this file).  ht is the whole state
// buffer after the forward: rows that were not written hold NaN (or, in place,
// the initial state).  Absent outputs are empty vectors.
struct Outputs {
  sc_status status = SC_OK;
  std::string error;
  std::vector<double> y, ht, dx, dweight, dbias, dh0;
  int64_t unwritten = 0;  // requested output elements still holding the poison
  int64_t stray = 0;      // bytes outside the outputs' views that changed (gaps, skipped pool rows)
  bool ok() const { return status == SC_OK && unwritten == 0 && stray == 0; }
  std::string problems() const;  // "" when ok()
};

enum Pass { kForward = 1, kBackward = 2, kBoth = 3 };

// Device-or-host byte buffer.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, bool device);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const std::vector<unsigned char>& host);  // host image -> buffer
  std::vector<unsigned char> download() const;          // buffer -> host image

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = false;
};

// A case set up on one backend: buffers allocated and filled once, args for
// both directions built, workspace allocated once.  The bench times
// forward()/backward() repeatedly; run() below does one checked pass.
class Prepared {
 public:
  // inputs == nullptr: fill with a cheap deterministic pattern (bench sizes).
  Prepared(const Case& c, const Inputs* inputs, sc_backend backend);
  ~Prepared();
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;

  void set_stream(void* stream);  // CUDA stream for both directions
  void set_overlap(int overlap);  // exec.overlap for both directions (sc_overlap)
  void poison_outputs();          // NaN payload in every output element (and gap)
  void restore_state();           // in-place: put the initial state back into the pool
  sc_status forward(std::string* err = nullptr);
  sc_status backward(std::string* err = nullptr);
  Outputs fetch(int pass) const;  // decode outputs; counts unwritten / stray elements

  const sc_conv_args& fwd_args() const { return fa_; }
  const sc_conv_args& bwd_args() const { return ba_; }
  size_t fwd_workspace_bytes() const { return fws_.bytes(); }
  size_t bwd_workspace_bytes() const { return bws_.bytes(); }

  struct Tensor;  // one buffer + its description + the logical -> storage map

 private:
  Case c_;
  sc_backend backend_;
  bool device_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *res_ = nullptr, *cu_ = nullptr,
         *h0_ = nullptr, *h0i_ = nullptr, *hti_ = nullptr, *y_ = nullptr, *ht_ = nullptr,
         *dy_ = nullptr, *dht_ = nullptr, *dx_ = nullptr, *dw_ = nullptr, *db_ = nullptr,
         *dh0_ = nullptr, *h0b_ = nullptr, *h0f_ = nullptr, *ring_ = nullptr, *acc_ = nullptr,
         *par_ = nullptr, *tbl_ = nullptr, *iblk_ = nullptr, *fblk_ = nullptr, *first_ = nullptr,
         *comp_ = nullptr, *sid_ = nullptr;
  sc_conv_args fa_{}, ba_{};
  Buffer fws_, bws_;
  void* stream_ = nullptr;
  Tensor* add(std::unique_ptr<Tensor> t);
  void add_inputs(const Inputs* in);  // the constructor's steps, in order
  void add_outputs();
  void build_args();
  void allocate_workspaces();
  void sync() const;
};

// One checked run: prepare, poison, forward and/or backward, fetch (forward
// only for a serving case: its arguments are forward-only).
Outputs run(const Case& c, const Inputs& in, sc_backend backend, int pass = kBoth);

// ||out - ref|| / ||ref|| over the elements both hold (NaN in the same place in
// both counts as equal; NaN in one only gives +inf).  When ||ref|| == 0 the
// absolute ||out|| is returned.  Sizes differ: +inf.
double rel_err(const std::vector<double>& out, const std::vector<double>& ref);
// Bitwise equality (as doubles; NaN == NaN).
bool bit_equal(const std::vector<double>& a, const std::vector<double>& b);
// L2 norm.
double norm(const std::vector<double>& v);

// Tolerance for an output stored in `out_dtype` computed from `act_dtype`
// activations (which fix the accumulation type): fp64 1e-12, fp32 1e-5,
// fp16/bf16 1e-2 (output rounding only: the oracle runs on the same inputs).
double tolerance(sc_dtype out_dtype, sc_dtype act_dtype);

// Compares every output `got` and `ref` both hold, with tolerance(); returns
// "" or a description of each failure ("dx: rel err 3e-3 > 1e-5").
std::string compare(const Case& c, const Outputs& got, const Outputs& ref);

// Backends are named by the library (sc_backend_name, sc_has_backend); the
// harness adds only where a backend's tensors live, which decides how it
// allocates them.
//
// Whether a CUDA device is actually present (cudaGetDeviceCount > 0); false
// when the harness is built without CUDA.
bool cuda_device_present();
// Whether backend b's tensors and workspace live in device memory (allocated
// with CUDA by the harness); the C ABI does not say, so this is the one place
// the harness knows a backend by its id.
bool on_device(sc_backend b);
// Compiled in, and for a device backend a device is present.
bool usable(sc_backend b);
// Every usable backend, in sc_backend order.
std::vector<sc_backend> usable_backends();
// sc_backend_name(b), or "?" for an id the library does not know.
const char* backend_name(sc_backend b);

// ---- chunked computations (chunk.cpp) ---------------------------------------
//
// The whole batch vs the same batch cut in two per sequence: head n is tokens
// [0, split[n]) of sequence n, tail n the rest.  The head's final state
// (all S entries) is handed to the tail as its initial state.  The loss is on
// outputs of the tail only, with the same dy in both runs (zero on heads).
struct ChunkResult {
  sc_status status = SC_OK;
  std::string error;
  bool forward_bitexact = false;  // tail y (chunked) == whole y on tail tokens, bitwise
  bool state_bitexact = false;    // tail final state == whole final state, bitwise
  // Gradient w.r.t. the S state values at the cut, [N, D, S]: whole run du at
  // u positions [split, split+S) (dh0 ++ dx); chunked run: the tail's dh0.
  std::vector<double> grad_whole, grad_chunked;
  double ratio = 0;     // ||grad_chunked|| / ||grad_whole||, only the last W-1 state slots
  double grad_err = 0;  // ||grad_chunked - grad_whole|| / ||grad_whole|| (all S slots)
  // The full chain: the head's backward gets dht = the tail's dh0 (and no dy),
  // then head dx ++ tail dx vs whole dx, head + tail dweight/dbias vs whole,
  // head dh0 vs whole dh0 (rel errors).
  double dx_err = 0, dweight_err = 0, dbias_err = 0, dh0_err = 0;
  Outputs whole, head, tail, head_bwd;  // raw runs (tail: forward and backward)
};
// `c` describes the whole batch (dense or packed; h0 optional, no pool, not in
// place); split[n] in [0, L_n].  Runs on `backend` with c's tiles and threads.
ChunkResult run_chunked(const Case& c, const Inputs& in, const std::vector<int64_t>& split,
                        sc_backend backend);

// Sub-batches of a packed or dense case: the case and inputs of the tokens
// [lo[n], hi[n]) of each sequence n as a packed batch, with initial state
// `h0` ([N, D, S]; empty = none).  dy, residual are cut the same way.
void cut(const Case& c, const Inputs& in, const std::vector<int64_t>& lo,
         const std::vector<int64_t>& hi, const std::vector<double>& h0, Case* out_c,
         Inputs* out_in);

}  // namespace shortconv::harness
