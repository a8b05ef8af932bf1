// Harness core: cases, random inputs, one checked run through the C ABI,
// comparison, and the backends a run can use.  The buffers, poisoning and
// decoding of a prepared case are in prepared.cpp.
#include "harness/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "core/dtype.hpp"

#ifdef SHORTCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace shortconv::harness {

namespace {

double round_to(sc_dtype dt, double v) {
  unsigned char tmp[8];
  store_f64(tmp, dt, 0, v);
  return load_f64(tmp, dt, 0);
}

}  // namespace

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::token_major: return "token-major";
    case Layout::channel_major: return "channel-major";
    case Layout::strided: return "strided";
  }
  return "?";
}

const char* backend_name(sc_backend b) {
  const char* name = sc_backend_name(b);
  return name ? name : "?";
}

int64_t Case::xt() const {
  if (!packed) return T;
  int64_t t = 0;
  for (int64_t l : lengths) t += l;
  return t;
}

int64_t Case::h0_row(int64_t n) const {
  if (!h0 || (!has_h0.empty() && !has_h0[size_t(n)])) return -1;
  if (pool == 0) return n;  // (the pad index applies to index tensors only)
  const int64_t r = !table() ? h0_index[size_t(n)]
                              : block_table[size_t(n * table_cols + initial_block[size_t(n)])];
  return r == pad_index ? -1 : r;
}

int64_t Case::ht_row(int64_t n) const {
  if (!ht) return -1;
  if (pool == 0) return n;
  const int64_t r = !table() ? ht_index[size_t(n)]
                              : block_table[size_t(n * table_cols + final_block[size_t(n)])];
  return r == pad_index ? -1 : r;
}

int64_t Case::snapshots(int64_t n) const {
  if (block_size <= 0 || !ht) return 0;
  const int64_t c = computed[size_t(n)], L = seq_len(n);
  if (L < 2) return 0;
  const int64_t first = c / block_size + 1, last = (c + L - 1) / block_size;
  return last >= first ? last - first + 1 : 0;
}

int64_t Case::snapshot_tokens(int64_t n, int64_t k) const {
  const int64_t c = computed[size_t(n)];
  return (c / block_size + 1 + k) * block_size - c;
}

int64_t Case::snapshot_row(int64_t n, int64_t k) const {
  const int64_t r = block_table[size_t(n * table_cols + first_block[size_t(n)] + k)];
  return r == pad_index ? -1 : r;
}

std::vector<Case::Run> Case::runs() const {
  std::vector<Run> r;
  if (!by_ids()) return r;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0, t1 = 0; t0 < T; t0 = t1) {
      const int64_t id = seq_idx[size_t(b * T + t0)];
      for (t1 = t0 + 1; t1 < T && seq_idx[size_t(b * T + t1)] == id; ++t1) {
      }
      r.push_back({b, t0, t1, id});
    }
  return r;
}

std::vector<char> Case::ht_rows_written() const {
  std::vector<char> rows(size_t(std::max<int64_t>(state_rows(), 0)), 0);
  if (!ht) return rows;
  if (by_ids()) {
    for (const Run& r : runs())
      if (r.id >= 0 && r.id < state_rows()) rows[size_t(r.id)] = 1;
    return rows;
  }
  for (int64_t n = 0; n < num_seqs(); ++n) {
    const int64_t r = ht_row(n);
    if (r >= 0 && r < state_rows()) rows[size_t(r)] = 1;
  }
  return rows;
}

std::string Case::describe() const {
  std::ostringstream o;
  const char* act_name = sc_activation_name(act);
  o << "W=" << W << " S=" << state_len() << " act=" << (act_name ? act_name : "?")
    << " dtypes=" << dtype_name(act_dtype) << "/" << dtype_name(param_dtype) << "/"
    << dtype_name(state_dtype) << " D=" << D;
  if (packed) {
    o << " packed" << (packed_2d ? "2d" : "") << "[";
    for (size_t i = 0; i < lengths.size(); ++i) o << (i ? "," : "") << lengths[i];
    o << "]";
  } else {
    o << " B=" << B << " T=" << T;
  }
  if (by_ids()) {
    o << " seq_idx" << (seq_idx_cm ? "^T" : "") << "[";
    for (size_t i = 0; i < seq_idx.size(); ++i)
      o << (i ? (T && i % size_t(T) == 0 ? "|" : ",") : "") << seq_idx[i];
    o << "] id_rows=" << id_rows;
  }
  o << " " << layout_name(layout);
  if (bias) o << " bias";
  if (residual) o << " residual";
  if (h0) o << " h0";
  if (ht) o << " ht";
  if (pool) o << " pool=" << pool;
  if (in_place) o << " in-place";
  if (!has_h0.empty()) o << " flags(" << dtype_name(flag_dtype) << ")";
  if (!ring.empty()) o << " rings";
  if (pad_index != -1) o << " pad=" << pad_index;
  if (zero_pads) o << " zero_pads";
  if (index_stride != 1) o << " index_stride=" << index_stride;
  if (state_transposed) o << " state^T";
  if (state_base) o << " state+" << state_base;
  if (!accepted.empty()) {
    o << " accepted[";
    for (size_t i = 0; i < accepted.size(); ++i) o << (i ? "," : "") << accepted[i];
    o << "]";
  }
  if (!parents.empty()) o << " tree(M=" << parent_cols << ")";
  if (table()) o << " table(M=" << table_cols << ")";
  if (block_size > 0) {
    o << " apc(B=" << block_size << ", c=";
    for (size_t i = 0; i < computed.size(); ++i) o << (i ? "," : "") << computed[i];
    o << ")";
  }
  if (dht) o << " dht";
  if (!dy) o << " no-dy";
  if (dy_broadcast) o << " dy-broadcast";
  if (tile_t) o << " tile_t=" << tile_t;
  if (tile_d) o << " tile_d=" << tile_d;
  if (num_threads) o << " threads=" << num_threads;
  if (overlap) o << " overlap=" << (overlap == SC_OVERLAP_LAUNCH ? "launch" : overlap == SC_OVERLAP_READS ? "reads" : "?");
  o << " seed=" << seed;
  return o.str();
}

Inputs make_inputs(const Case& c) {
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 12345);
  std::uniform_real_distribution<double> mag(0.25, 1.0);
  auto fill = [&](std::vector<double>& v, size_t n, sc_dtype dt, double scale = 1.0) {
    v.resize(n);
    for (auto& e : v) {
      double m = mag(rng) * scale;
      e = round_to(dt, (rng() & 1) ? m : -m);
    }
  };
  Inputs in;
  const int64_t D = c.D, W = c.W, S = c.state_len();
  const size_t act_n = size_t(c.xb() * c.xt() * D);
  fill(in.x, act_n, c.act_dtype);
  fill(in.weight, size_t(D * W), c.param_dtype, 1.0 / std::sqrt(double(W)));
  if (c.bias) fill(in.bias, size_t(D), c.param_dtype, 0.5);
  if (c.residual) fill(in.residual, act_n, c.act_dtype);
  if (c.h0) fill(in.h0, size_t(c.state_rows() * D * S), c.state_dtype);
  if (c.dy) fill(in.dy, c.dy_broadcast ? size_t(D) : act_n, c.act_dtype);
  if (c.dht) fill(in.dht, size_t(c.grad_rows() * D * S), c.state_dtype);
  if (c.packed) {
    in.cu_seqlens.assign(1, 0);
    for (int64_t l : c.lengths) in.cu_seqlens.push_back(in.cu_seqlens.back() + l);
  }
  return in;
}

Outputs run(const Case& c, const Inputs& in, sc_backend backend, int pass) {
  if (c.serving()) pass &= kForward;  // serving steps are forward-only (semantics section 7)
  Prepared p(c, &in, backend);
  p.poison_outputs();
  std::string err;
  sc_status st = SC_OK;
  if (pass & kForward) st = p.forward(&err);
  if (st == SC_OK && (pass & kBackward)) st = p.backward(&err);
  if (st != SC_OK) {
    Outputs o;
    o.status = st;
    o.error = err;
    return o;
  }
  return p.fetch(pass);
}

std::string Outputs::problems() const {
  std::ostringstream s;
  if (status != SC_OK) s << sc_status_string(status) << ": " << error << "; ";
  if (unwritten) s << unwritten << " output elements never written; ";
  if (stray) s << stray << " elements outside the outputs changed; ";
  return s.str();
}

// ---- comparison ---------------------------------------------------------------

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double e : v)
    if (!std::isnan(e)) s += e * e;
  return std::sqrt(s);
}

double rel_err(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool a = std::isnan(out[i]), b = std::isnan(ref[i]);
    if (a && b) continue;
    if (a != b || std::isinf(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool bit_equal(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return false;
  }
  return true;
}

double tolerance(sc_dtype out_dtype, sc_dtype act_dtype) {
  auto tol = [](sc_dtype d) {
    switch (d) {
      case SC_F64: return 1e-12;
      case SC_F32: return 1e-5;
      default: return 1e-2;
    }
  };
  // accumulation is fp64 only for fp64 activations (semantics section 4)
  const double acc = act_dtype == SC_F64 ? 1e-12 : 1e-5;
  return std::max(tol(out_dtype), acc);
}

std::string compare(const Case& c, const Outputs& got, const Outputs& ref) {
  std::ostringstream s;
  if (!got.ok()) s << got.problems();
  if (ref.status != SC_OK) s << "oracle failed: " << ref.problems();
  auto one = [&](const char* name, const std::vector<double>& a, const std::vector<double>& b,
                 sc_dtype dt) {
    if (a.empty() && b.empty()) return;
    const double e = rel_err(a, b), tol = tolerance(dt, c.act_dtype);
    if (!(e <= tol)) s << name << ": rel err " << e << " > " << tol << "; ";
  };
  one("y", got.y, ref.y, c.act_dtype);
  one("final_state", got.ht, ref.ht, c.state_dtype);
  one("dx", got.dx, ref.dx, c.act_dtype);
  one("dweight", got.dweight, ref.dweight, c.param_dtype);
  one("dbias", got.dbias, ref.dbias, c.param_dtype);
  one("dinitial_state", got.dh0, ref.dh0, c.state_dtype);
  return s.str();
}

// ---- backends -----------------------------------------------------------------

bool cuda_device_present() {
#ifdef SHORTCONV_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

bool on_device(sc_backend b) { return b == SC_BACKEND_CUDA; }

bool usable(sc_backend b) { return sc_has_backend(b) && (!on_device(b) || cuda_device_present()); }

std::vector<sc_backend> usable_backends() {
  std::vector<sc_backend> b;
  for (int32_t id = 0; sc_backend_name(id); ++id)
    if (usable(sc_backend(id))) b.push_back(sc_backend(id));
  return b;
}

}  // namespace shortconv::harness
