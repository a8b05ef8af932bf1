// Prepared: a case's tensors in strided buffers on the backend's side (host
// or device), the arguments of both directions, one workspace each, and the
// decoding of outputs back to logical double vectors (harness.hpp).
//
// Every tensor lives in a buffer whose bytes outside the tensor's view (gaps
// of a strided view, pool rows nobody writes) hold a NaN poison payload:
// an input gap read by mistake turns an output into NaN, an output element
// never written still holds the poison (counted as `unwritten`), and any
// changed byte outside an output's written elements is counted as `stray`.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/dtype.hpp"
#include "harness/harness.hpp"

#ifdef SHORTCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace shortconv::harness {

namespace {

// Quiet-NaN payloads no arithmetic produces (the canonical NaNs differ).
constexpr uint32_t kPoisonF32 = 0x7fc5a5a5u;
constexpr uint64_t kPoisonF64 = 0x7ff8a5a5a5a5a5a5ull;
constexpr uint16_t kPoisonF16 = 0x7e5au;
constexpr uint16_t kPoisonBF16 = 0x7fc5u;

void put_poison(unsigned char* p, sc_dtype dt, int64_t off) {
  switch (dt) {
    case SC_F32: std::memcpy(p + off * 4, &kPoisonF32, 4); break;
    case SC_F64: std::memcpy(p + off * 8, &kPoisonF64, 8); break;
    case SC_F16: std::memcpy(p + off * 2, &kPoisonF16, 2); break;
    case SC_BF16: std::memcpy(p + off * 2, &kPoisonBF16, 2); break;
    case SC_I32: { int32_t v = -7777777; std::memcpy(p + off * 4, &v, 4); break; }
    case SC_I64: { int64_t v = -7777777; std::memcpy(p + off * 8, &v, 8); break; }
    default: break;
  }
}

bool is_poison(const unsigned char* p, sc_dtype dt, int64_t off) {
  switch (dt) {
    case SC_F32: return std::memcmp(p + off * 4, &kPoisonF32, 4) == 0;
    case SC_F64: return std::memcmp(p + off * 8, &kPoisonF64, 8) == 0;
    case SC_F16: return std::memcmp(p + off * 2, &kPoisonF16, 2) == 0;
    case SC_BF16: return std::memcmp(p + off * 2, &kPoisonBF16, 2) == 0;
    default: return false;
  }
}

void put_value(unsigned char* p, sc_dtype dt, int64_t off, double v) {
  if (dt == SC_BOOL) {
    p[off] = v != 0.0 ? 1 : 0;
  } else if (dt == SC_I32) {
    int32_t i = int32_t(v);
    std::memcpy(p + off * 4, &i, 4);
  } else if (dt == SC_I64) {
    int64_t i = int64_t(v);
    std::memcpy(p + off * 8, &i, 8);
  } else {
    store_f64(p, dt, off, v);
  }
}

}  // namespace

// ---- Buffer -------------------------------------------------------------------

Buffer::Buffer(size_t bytes, bool device) : bytes_(bytes), device_(device) {
  const size_t n = std::max<size_t>(bytes, 16);
  if (device) {
#ifdef SHORTCONV_WITH_CUDA
    if (cudaMalloc(&ptr_, n) != cudaSuccess)
      throw std::runtime_error("harness: cudaMalloc of " + std::to_string(n) + " bytes failed");
#else
    throw std::runtime_error("harness: device buffer requested in a build without CUDA");
#endif
  } else {
    ptr_ = std::malloc(n);
    if (!ptr_) throw std::runtime_error("harness: malloc failed");
  }
}

Buffer::~Buffer() {
  if (!ptr_) return;
  if (device_) {
#ifdef SHORTCONV_WITH_CUDA
    cudaFree(ptr_);
#endif
  } else {
    std::free(ptr_);
  }
}

Buffer::Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::upload(const std::vector<unsigned char>& host) {
  const size_t n = std::min(host.size(), bytes_);
  if (n == 0) return;
  if (device_) {
#ifdef SHORTCONV_WITH_CUDA
    if (cudaMemcpy(ptr_, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("harness: cudaMemcpy to device failed");
#endif
  } else {
    std::memcpy(ptr_, host.data(), n);
  }
}

std::vector<unsigned char> Buffer::download() const {
  std::vector<unsigned char> host(bytes_);
  if (bytes_ == 0) return host;
  if (device_) {
#ifdef SHORTCONV_WITH_CUDA
    if (cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("harness: cudaMemcpy from device failed");
#endif
  } else {
    std::memcpy(host.data(), ptr_, bytes_);
  }
  return host;
}

// ---- Prepared -------------------------------------------------------------------

// One tensor: its buffer, strided description and the logical -> storage map.
struct Prepared::Tensor {
  std::string name;
  sc_dtype dtype = SC_F32;
  bool output = false;
  int64_t shape[3] = {1, 1, 1};   // logical shape (rank padded to 3 at the front)
  int64_t stride[3] = {0, 0, 0};  // element strides of the logical dims
  int64_t base = 0;               // element offset of the logical origin in the buffer
  int64_t alloc = 1;              // elements allocated
  sc_tensor desc{};               // what the library sees
  Buffer buf;
  std::vector<unsigned char> initial;  // kept input image (in-place state only)

  int64_t numel() const { return shape[0] * shape[1] * shape[2]; }
  int64_t offset(int64_t i) const {  // storage offset of logical row-major index i
    const int64_t i2 = i % shape[2], i1 = (i / shape[2]) % shape[1], i0 = i / (shape[2] * shape[1]);
    return base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
  }
  size_t bytes() const { return size_t(alloc) * size_t(dtype_size(dtype)); }
  std::vector<unsigned char> poison_image() const {
    std::vector<unsigned char> img(bytes());
    for (int64_t e = 0; e < alloc; ++e) put_poison(img.data(), dtype, e);
    return img;
  }
};

namespace {

// Builds a tensor of logical shape `shape` (rank `rank`, right-aligned in 3)
// with strides `stride`, origin `base`, `alloc` elements, and the library's
// description of rank `desc_rank` (the last desc_rank logical dims).
std::unique_ptr<Prepared::Tensor> make_tensor(const char* name, sc_dtype dt, bool output,
                                              std::initializer_list<int64_t> shape,
                                              std::initializer_list<int64_t> stride, int64_t base,
                                              int64_t alloc, int desc_rank) {
  auto t = std::make_unique<Prepared::Tensor>();
  t->name = name;
  t->dtype = dt;
  t->output = output;
  const int rank = int(shape.size());
  int i = 3 - rank;
  for (int64_t s : shape) t->shape[i++] = s;
  i = 3 - rank;
  for (int64_t s : stride) t->stride[i++] = s;
  t->base = base;
  t->alloc = std::max<int64_t>(alloc, 1);
  t->desc.dtype = dt;
  t->desc.ndim = desc_rank;
  for (int k = 0; k < desc_rank; ++k) {
    t->desc.shape[k] = t->shape[3 - desc_rank + k];
    t->desc.stride[k] = t->stride[3 - desc_rank + k];
  }
  return t;
}

// ---- tensors of a case -----------------------------------------------------------

using Tensor = Prepared::Tensor;

// An activation-like tensor [B, T, D] in the case's layout; `broadcast`: one
// [D] row with strides {0, 0, 1} (a broadcast dy).
std::unique_ptr<Tensor> act_tensor(const Case& c, const char* name, bool output, bool broadcast) {
  const int64_t B = c.xb(), T = c.xt(), D = c.D;
  const int act_rank = c.packed && c.packed_2d ? 2 : 3;
  if (broadcast) return make_tensor(name, c.act_dtype, output, {B, T, D}, {0, 0, 1}, 0, D, act_rank);
  switch (c.layout) {
    case Layout::channel_major:
      return make_tensor(name, c.act_dtype, output, {B, T, D}, {D * T, 1, T}, 0, B * T * D,
                         act_rank);
    case Layout::strided: {
      const int64_t M = std::max<int64_t>(c.view_mult, 1) * D;
      return make_tensor(name, c.act_dtype, output, {B, T, D}, {T * M, M, 1},
                         std::min(c.view_slot, c.view_mult - 1) * D, B * T * M, act_rank);
    }
    default:
      return make_tensor(name, c.act_dtype, output, {B, T, D}, {T * D, D, 1}, 0, B * T * D,
                         act_rank);
  }
}

// A state tensor [rows, D, S] at element c.state_base of its buffer;
// `transposed`: stored [rows, S, D].
std::unique_ptr<Tensor> state_tensor(const Case& c, const char* name, bool output, int64_t rows,
                                     bool transposed) {
  const int64_t D = c.D, S = c.state_len(), base = c.state_base, n = base + rows * D * S;
  if (transposed)
    return make_tensor(name, c.state_dtype, output, {rows, D, S}, {D * S, 1, D}, base, n, 3);
  return make_tensor(name, c.state_dtype, output, {rows, D, S}, {D * S, S, 1}, base, n, 3);
}

// `stride`: entry i at element i * stride (the entries between are poison).
std::unique_ptr<Tensor> index_tensor(const Case& c, const char* name, int64_t n, int64_t stride = 1) {
  return make_tensor(name, c.index_dtype, false, {n}, {stride}, 0, n > 0 ? (n - 1) * stride + 1 : 0, 1);
}

// Fills an input tensor from logical values (or, when there are none, a cheap
// pattern hashed from the storage offset and *pattern_seed) and uploads it;
// `keep`: remember the image (an in-place state, restored between runs).
void fill(Tensor* t, const std::vector<double>* values, bool keep, uint64_t* pattern_seed) {
  std::vector<unsigned char> img = t->poison_image();
  const int64_t n = t->numel();
  if (values && int64_t(values->size()) >= n) {
    for (int64_t i = 0; i < n; ++i) put_value(img.data(), t->dtype, t->offset(i), (*values)[size_t(i)]);
  } else {
    const uint64_t s = ++*pattern_seed * 0x9e3779b97f4a7c15ull;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      // hashed from the storage offset: broadcast elements get one value
      uint64_t h = (uint64_t(t->offset(i)) + s) * 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31;
      const double m = 0.25 + 0.75 * double(h & 1023) / 1023.0;
      put_value(img.data(), t->dtype, t->offset(i), (h >> 11) & 1 ? m : -m);
    }
  }
  t->buf.upload(img);
  if (keep) t->initial = std::move(img);
}

void fill_index(Tensor* t, const std::vector<int64_t>& v) {
  std::vector<unsigned char> img = t->poison_image();
  for (int64_t i = 0; i < t->numel(); ++i) put_value(img.data(), t->dtype, t->offset(i), double(v[size_t(i)]));
  t->buf.upload(img);
}

}  // namespace

Prepared::Tensor* Prepared::add(std::unique_ptr<Tensor> t) {
  t->buf = Buffer(t->bytes(), device_);
  t->desc.data = static_cast<unsigned char*>(t->buf.data()) + t->base * dtype_size(t->dtype);
  tensors_.push_back(std::move(t));
  return tensors_.back().get();
}

Prepared::Prepared(const Case& c, const Inputs* in, sc_backend backend)
    : c_(c), backend_(backend), device_(on_device(backend)) {
  add_inputs(in);
  add_outputs();
  build_args();
  allocate_workspaces();
}

void Prepared::add_inputs(const Inputs* in) {
  const Case& c = c_;
  const int64_t D = c.D, W = c.W, N = c.num_seqs();
  uint64_t pattern_seed = c.seed;
  x_ = add(act_tensor(c, "x", false, false));
  fill(x_, in ? &in->x : nullptr, false, &pattern_seed);
  w_ = add(make_tensor("weight", c.param_dtype, false, {D, W}, {W, 1}, 0, D * W, 2));
  fill(w_, in ? &in->weight : nullptr, false, &pattern_seed);
  if (c.bias) {
    b_ = add(make_tensor("bias", c.param_dtype, false, {D}, {1}, 0, D, 1));
    fill(b_, in ? &in->bias : nullptr, false, &pattern_seed);
  }
  if (c.residual) {
    res_ = add(act_tensor(c, "residual", false, false));
    fill(res_, in ? &in->residual : nullptr, false, &pattern_seed);
  }
  if (c.packed) {
    std::vector<int64_t> cu(1, 0);
    for (int64_t l : c.lengths) cu.push_back(cu.back() + l);
    cu_ = add(index_tensor(c, "cu_seqlens", N + 1));
    fill_index(cu_, cu);
  }
  const int64_t rows = c.state_rows();
  if (c.h0) {
    h0_ = add(state_tensor(c, "initial_state", c.in_place, rows, c.state_transposed));
    fill(h0_, in ? &in->h0 : nullptr, c.in_place, &pattern_seed);
    if (c.pool > 0 && !c.table()) {
      h0i_ = add(index_tensor(c, "initial_state_indices", N, c.index_stride));
      fill_index(h0i_, c.h0_index);
    }
    if (!c.has_h0.empty()) {
      h0f_ = add(make_tensor("has_initial_state", c.flag_dtype, false, {N}, {1}, 0, N, 1));
      fill_index(h0f_, c.has_h0);
    }
    if (c.in_place) {  // the backward reads the original state from its own copy
      h0b_ = add(state_tensor(c, "initial_state(bwd)", false, rows, c.state_transposed));
      h0b_->buf.upload(h0_->initial);
    }
  }
  if (c.by_ids()) {  // [B, T], row-major or column-major storage
    const int64_t B = c.B, T = c.T;
    const sc_dtype I = c.index_dtype;
    sid_ = add(c.seq_idx_cm ? make_tensor("seq_idx", I, false, {B, T}, {1, B}, 0, B * T, 2)
                            : make_tensor("seq_idx", I, false, {B, T}, {T, 1}, 0, B * T, 2));
    fill_index(sid_, c.seq_idx);
  }
  if (!c.ring.empty()) {
    ring_ = add(index_tensor(c, "ring_offsets", N));
    fill_index(ring_, c.ring);
  }
  if (!c.accepted.empty()) {
    acc_ = add(index_tensor(c, "num_accepted", N, c.index_stride));
    fill_index(acc_, c.accepted);
  }
  if (!c.parents.empty()) {
    const int64_t M = c.parent_cols;
    par_ = add(make_tensor("parent_tokens", c.index_dtype, false, {N, M}, {M, 1}, 0, N * M, 2));
    fill_index(par_, c.parents);
  }
  if (c.table()) {
    const int64_t M = c.table_cols;
    tbl_ = add(make_tensor("block_table", c.index_dtype, false, {N, M}, {M, 1}, 0, N * M, 2));
    fill_index(tbl_, c.block_table);
    iblk_ = add(index_tensor(c, "initial_block", N));
    fill_index(iblk_, c.initial_block);
    fblk_ = add(index_tensor(c, "final_block", N));
    fill_index(fblk_, c.final_block);
    if (c.block_size > 0) {
      first_ = add(index_tensor(c, "first_block", N));
      fill_index(first_, c.first_block);
      comp_ = add(index_tensor(c, "computed_tokens", N));
      fill_index(comp_, c.computed);
    }
  }
  if (c.dy) {
    dy_ = add(act_tensor(c, "dy", false, c.dy_broadcast));
    std::vector<double> dy;  // a broadcast dy ([D] values) expanded to its logical shape
    const int64_t n = c.xb() * c.xt() * D;
    if (in && c.dy_broadcast && int64_t(in->dy.size()) == D)
      for (int64_t i = 0; i < n; ++i) dy.push_back(in->dy[size_t(i % D)]);
    fill(dy_, in ? (c.dy_broadcast ? &dy : &in->dy) : nullptr, false, &pattern_seed);
  }
  if (c.dht) {
    dht_ = add(state_tensor(c, "dfinal_state", false, c.grad_rows(), false));
    fill(dht_, in ? &in->dht : nullptr, false, &pattern_seed);
  }
}

void Prepared::add_outputs() {
  const Case& c = c_;
  const int64_t D = c.D, W = c.W, N = c.num_seqs();
  y_ = add(act_tensor(c, "y", true, false));
  if (c.ht) {
    ht_ = c.in_place && h0_ ? h0_ : add(state_tensor(c, "final_state", true, c.state_rows(),
                                                     c.state_transposed));
    if (c.pool > 0 && !c.table()) {
      hti_ = add(index_tensor(c, "final_state_indices", N, c.index_stride));
      fill_index(hti_, c.ht_index);
    }
  }
  if (c.want_dx) dx_ = add(act_tensor(c, "dx", true, false));
  if (c.want_dweight) dw_ = add(make_tensor("dweight", c.param_dtype, true, {D, W}, {W, 1}, 0, D * W, 2));
  if (c.want_dbias) db_ = add(make_tensor("dbias", c.param_dtype, true, {D}, {1}, 0, D, 1));
  if (c.want_dh0) dh0_ = add(state_tensor(c, "dinitial_state", true, c.grad_rows(), false));
}

void Prepared::build_args() {
  auto set = [](sc_tensor& dst, const Tensor* t) {
    if (t) dst = t->desc;
  };
  for (sc_conv_args* a : {&fa_, &ba_}) {
    sc_conv_args_init(a);
    a->width = c_.W;
    a->state_len = int32_t(c_.state_len());
    a->activation = c_.act;
    set(a->x, x_);
    set(a->weight, w_);
    set(a->bias, b_);
    set(a->cu_seqlens, cu_);
    set(a->initial_state_indices, h0i_);
    set(a->has_initial_state, h0f_);
    set(a->seq_idx, sid_);
    a->pad_index = c_.pad_index;
    a->zero_padded_outputs = c_.zero_pads ? 1 : 0;
    a->exec.backend = backend_;
    a->exec.num_threads = c_.num_threads;
    a->exec.tile_t = c_.tile_t;
    a->exec.tile_d = c_.tile_d;
    a->exec.overlap = c_.overlap;
  }
  set(fa_.ring_offsets, ring_);
  set(fa_.num_accepted, acc_);  // (forward only)
  set(fa_.parent_tokens, par_);
  set(fa_.block_table, tbl_);
  set(fa_.initial_block, iblk_);
  set(fa_.final_block, fblk_);
  set(fa_.first_block, first_);
  set(fa_.computed_tokens, comp_);
  fa_.block_size = c_.table() ? c_.block_size : 0;
  if (h0_) set(ba_.ring_offsets, ring_);  // the backward reads no final state
  set(fa_.residual, res_);
  set(fa_.initial_state, h0_);
  set(fa_.y, y_);
  set(fa_.final_state, ht_);
  set(fa_.final_state_indices, hti_);
  set(ba_.initial_state, h0b_ ? h0b_ : h0_);
  set(ba_.dy, dy_);
  set(ba_.dfinal_state, dht_);
  set(ba_.dx, dx_);
  set(ba_.dweight, dw_);
  set(ba_.dbias, db_);
  set(ba_.dinitial_state, dh0_);
}

// Once per direction; a failed query surfaces in forward() / backward().
void Prepared::allocate_workspaces() {
  size_t bytes = 0;
  sc_error err{};
  if (sc_forward_workspace_size(&fa_, &bytes, &err) == SC_OK && bytes > 0) {
    fws_ = Buffer(bytes, device_);
    fa_.exec.workspace = fws_.data();
    fa_.exec.workspace_bytes = bytes;
  }
  bytes = 0;
  if (sc_backward_workspace_size(&ba_, &bytes, &err) == SC_OK && bytes > 0) {
    bws_ = Buffer(bytes, device_);
    ba_.exec.workspace = bws_.data();
    ba_.exec.workspace_bytes = bytes;
  }
}

Prepared::~Prepared() = default;

void Prepared::set_overlap(int overlap) {
  c_.overlap = overlap;
  fa_.exec.overlap = overlap;
  ba_.exec.overlap = overlap;
}

void Prepared::set_stream(void* stream) {
  stream_ = stream;
  fa_.exec.stream = stream;
  ba_.exec.stream = stream;
}

void Prepared::sync() const {
#ifdef SHORTCONV_WITH_CUDA
  if (device_) cudaDeviceSynchronize();
#endif
}

void Prepared::poison_outputs() {
  for (auto& t : tensors_)
    if (t->output && !(t.get() == ht_ && c_.in_place)) t->buf.upload(t->poison_image());
  restore_state();
}

void Prepared::restore_state() {
  if (c_.in_place && h0_ && !h0_->initial.empty()) h0_->buf.upload(h0_->initial);
}

sc_status Prepared::forward(std::string* err) {
  sc_error e{};
  const sc_status st = sc_forward(&fa_, &e);
  if (err) *err = e.message;
  return st;
}

sc_status Prepared::backward(std::string* err) {
  sc_error e{};
  const sc_status st = sc_backward(&ba_, &e);
  if (err) *err = e.message;
  return st;
}

Outputs Prepared::fetch(int pass) const {
  sync();
  Outputs o;
  // Decodes t; `written(i)` says whether logical element i must be written.
  auto decode = [&](const Tensor* t, std::vector<double>& out, auto written) {
    const std::vector<unsigned char> img = t->buf.download();
    const std::vector<unsigned char> before =
        t->initial.empty() ? t->poison_image() : t->initial;
    std::vector<char> mine(size_t(t->alloc), 0);
    const int64_t n = t->numel();
    out.assign(size_t(n), std::nan(""));
    const int es = dtype_size(t->dtype);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t off = t->offset(i);
      if (!written(i)) continue;
      mine[size_t(off)] = 1;
      if (t->initial.empty() && is_poison(img.data(), t->dtype, off)) {
        ++o.unwritten;
        continue;
      }
      out[size_t(i)] = load_f64(img.data(), t->dtype, off);
    }
    for (int64_t e = 0; e < t->alloc; ++e) {
      if (mine[size_t(e)]) continue;
      if (std::memcmp(img.data() + e * es, before.data() + e * es, size_t(es)) != 0) ++o.stray;
    }
    if (!t->initial.empty()) {  // unwritten elements of an in-place pool hold the initial state
      for (int64_t i = 0; i < n; ++i)
        if (!written(i)) out[size_t(i)] = load_f64(img.data(), t->dtype, t->offset(i));
    }
  };
  auto all = [](int64_t) { return true; };
  if (pass & kForward) {
    decode(y_, o.y, all);
    if (ht_) {
      // entries written per row: S, or (W-2) + L_n of a speculative row (0 without tokens)
      const int64_t S = c_.state_len(), per_row = c_.D * S;
      std::vector<int64_t> entries(size_t(c_.state_rows()), 0);
      if (c_.by_ids()) {  // rows named by a sequence id: whole rows
        const std::vector<char> rows = c_.ht_rows_written();
        for (size_t r = 0; r < rows.size(); ++r) entries[r] = rows[r] ? S : 0;
      } else {
        for (int64_t n = 0; n < c_.num_seqs(); ++n) {
          const int64_t r = c_.ht_row(n), L = c_.seq_len(n);
          const int64_t E = c_.accepted.empty() ? S : L > 0 ? c_.W - 2 + L : 0;
          if (r >= 0 && r < c_.state_rows()) entries[size_t(r)] = E;
          for (int64_t k = 0; k < c_.snapshots(n); ++k)  // prefix-caching snapshots: whole rows
            if (const int64_t sr = c_.snapshot_row(n, k); sr >= 0 && sr < c_.state_rows())
              entries[size_t(sr)] = S;
        }
      }
      decode(ht_, o.ht, [&](int64_t i) {
        return S > 0 && i % S < entries[size_t(i / per_row)];
      });
    }
  }
  if (pass & kBackward) {
    if (dx_) decode(dx_, o.dx, all);
    if (dw_) decode(dw_, o.dweight, all);
    if (db_) decode(db_, o.dbias, all);
    if (dh0_) decode(dh0_, o.dh0, all);
  }
  return o;
}

}  // namespace shortconv::harness
