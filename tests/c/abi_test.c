/*
 * The C ABI from C11: a tiny forward and backward through shortconv.h on every
 * host backend, checked against docs/semantics.md sections 1-2 transcribed
 * below in double precision.
 *
 *   case 1: dense [B, T, D] float64, silu, bias, residual, initial and final
 *           state with S = W (the FLA convention); tolerance 1e-12.
 *   case 2: packed [total, D] float32 stored channel-major (strides {1, total}),
 *           int64 cu_seqlens with a sequence shorter than S and an empty one,
 *           identity activation, no bias, S = W-1; tolerance 1e-5.
 *   case 3: a bad argument answers with a status and a message naming it.
 *
 * Exit status 0 on success; every failure is printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shortconv/shortconv.h"

static int g_failures = 0;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      ++g_failures;                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                             \
      fputc('\n', stderr);                                      \
    }                                                           \
  } while (0)

/* ---- the definition (docs/semantics.md), logical dense double arrays ------
 * x, res, y, dy, dx: [tokens][D]; h0, ht, dht, dh0: [N][D][S]; w, dw: [D][W]
 * sequence n is tokens [begin[n], begin[n] + len[n]). */
typedef struct {
  int N, D, W, S, silu;
  const long long* begin;
  const long long* len;
} problem;

static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

static double act(int silu, double z) { return silu ? z * sigmoid(z) : z; }

static double act_grad(int silu, double z) {
  double s;
  if (!silu) return 1.0;
  s = sigmoid(z);
  return s * (1.0 + z * (1.0 - s));
}

/* u = h0 ++ x for sequence n, channel d (h0 NULL: zeros) */
static void extended(const problem* p, int n, int d, const double* x, const double* h0, double* u) {
  int j;
  long long t;
  for (j = 0; j < p->S; ++j) u[j] = h0 ? h0[((size_t)n * p->D + d) * p->S + j] : 0.0;
  for (t = 0; t < p->len[n]; ++t) u[p->S + t] = x[(size_t)(p->begin[n] + t) * p->D + d];
}

static double pre_at(const problem* p, const double* u, const double* w, const double* bias,
                     int d, long long t) {
  double s = bias ? bias[d] : 0.0;
  int k;
  for (k = 0; k < p->W; ++k) s += w[d * p->W + k] * u[p->S - (p->W - 1) + t + k];
  return s;
}

static void ref_forward(const problem* p, const double* x, const double* w, const double* bias,
                        const double* res, const double* h0, double* y, double* ht, double* u) {
  int n, d, j;
  long long t;
  for (n = 0; n < p->N; ++n)
    for (d = 0; d < p->D; ++d) {
      extended(p, n, d, x, h0, u);
      for (t = 0; t < p->len[n]; ++t) {
        size_t o = (size_t)(p->begin[n] + t) * p->D + d;
        y[o] = act(p->silu, pre_at(p, u, w, bias, d, t)) + (res ? res[o] : 0.0);
      }
      for (j = 0; j < p->S; ++j) ht[((size_t)n * p->D + d) * p->S + j] = u[p->len[n] + j];
    }
}

static void ref_backward(const problem* p, const double* x, const double* w, const double* bias,
                         const double* h0, const double* dy, const double* dht, double* dx,
                         double* dw, double* db, double* dh0, double* u, double* du) {
  int n, d, j, k;
  long long t;
  memset(dw, 0, sizeof(double) * p->D * p->W);
  memset(db, 0, sizeof(double) * p->D);
  for (n = 0; n < p->N; ++n)
    for (d = 0; d < p->D; ++d) {
      const long long L = p->len[n];
      const int off = p->S - (p->W - 1);
      extended(p, n, d, x, h0, u);
      for (t = 0; t < p->S + L; ++t) du[t] = t >= L ? dht[((size_t)n * p->D + d) * p->S + (t - L)] : 0.0;
      for (t = 0; t < L; ++t) {
        const double g = dy[(size_t)(p->begin[n] + t) * p->D + d];
        const double dpre = g * act_grad(p->silu, pre_at(p, u, w, bias, d, t));
        for (k = 0; k < p->W; ++k) {
          du[off + t + k] += w[d * p->W + k] * dpre;
          dw[d * p->W + k] += dpre * u[off + t + k];
        }
        db[d] += dpre;
      }
      for (t = 0; t < L; ++t) dx[(size_t)(p->begin[n] + t) * p->D + d] = du[p->S + t];
      for (j = 0; j < p->S; ++j) dh0[((size_t)n * p->D + d) * p->S + j] = du[j];
    }
}

/* ---- tensors -------------------------------------------------------------- */

static sc_tensor make(void* data, sc_dtype dt, int ndim, const long long* shape,
                      const long long* stride) {
  sc_tensor t;
  int i;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.ndim = ndim;
  for (i = 0; i < ndim; ++i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride[i];
  }
  return t;
}

/* row-major strides */
static sc_tensor dense(void* data, sc_dtype dt, int ndim, const long long* shape) {
  long long stride[SC_MAX_DIMS], s = 1;
  int i;
  for (i = ndim - 1; i >= 0; --i) {
    stride[i] = s;
    s *= shape[i];
  }
  return make(data, dt, ndim, shape, stride);
}

static double rnd(unsigned* s) {
  *s = *s * 1664525u + 1013904223u;
  return (double)((int)(*s >> 8) % 2001 - 1000) / 1000.0;
}

static double rel_err(const double* got, const double* want, size_t n) {
  double e = 0.0, r = 0.0;
  size_t i;
  for (i = 0; i < n; ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return r > 0.0 ? sqrt(e / r) : sqrt(e);
}

static const char* backend_name(int be) { return be == SC_BACKEND_REF ? "ref" : "cpu"; }

/* Runs forward or backward with a workspace of the size the library asks for. */
static sc_status run(sc_conv_args* a, int backward, sc_error* err) {
  size_t bytes = 0;
  void* ws = NULL;
  sc_status st = backward ? sc_backward_workspace_size(a, &bytes, err)
                          : sc_forward_workspace_size(a, &bytes, err);
  if (st != SC_OK) return st;
  if (bytes) ws = malloc(bytes);
  a->exec.workspace = ws;
  a->exec.workspace_bytes = bytes;
  st = backward ? sc_backward(a, err) : sc_forward(a, err);
  a->exec.workspace = NULL;
  a->exec.workspace_bytes = 0;
  free(ws);
  return st;
}

/* ---- case 1: dense float64 ------------------------------------------------ */
enum { B1 = 2, T1 = 6, D1 = 3, W1 = 4, S1 = 4 };

static void case_dense_f64(int be) {
  double x[B1 * T1 * D1], res[B1 * T1 * D1], dy[B1 * T1 * D1], w[D1 * W1], bias[D1];
  double h0[B1 * D1 * S1], dht[B1 * D1 * S1];
  double y[B1 * T1 * D1], ht[B1 * D1 * S1], dx[B1 * T1 * D1], dw[D1 * W1], db[D1], dh0[B1 * D1 * S1];
  double ry[B1 * T1 * D1], rht[B1 * D1 * S1], rdx[B1 * T1 * D1], rdw[D1 * W1], rdb[D1],
      rdh0[B1 * D1 * S1];
  double u[S1 + T1], du[S1 + T1];
  const long long begin[B1] = {0, T1}, len[B1] = {T1, T1};
  const long long sx[3] = {B1, T1, D1}, sw[2] = {D1, W1}, sb[1] = {D1}, ss[3] = {B1, D1, S1};
  unsigned seed = 12345u;
  size_t i;
  problem p;
  sc_conv_args a;
  sc_error err;
  sc_status st;

  for (i = 0; i < B1 * T1 * D1; ++i) {
    x[i] = rnd(&seed);
    res[i] = rnd(&seed);
    dy[i] = rnd(&seed);
  }
  for (i = 0; i < D1 * W1; ++i) w[i] = rnd(&seed);
  for (i = 0; i < D1; ++i) bias[i] = rnd(&seed);
  for (i = 0; i < B1 * D1 * S1; ++i) {
    h0[i] = rnd(&seed);
    dht[i] = rnd(&seed);
  }
  /* sentinels: a missing write shows up as a large error */
  for (i = 0; i < B1 * T1 * D1; ++i) y[i] = dx[i] = 1e30;
  for (i = 0; i < B1 * D1 * S1; ++i) ht[i] = dh0[i] = 1e30;
  for (i = 0; i < D1 * W1; ++i) dw[i] = 1e30;
  for (i = 0; i < D1; ++i) db[i] = 1e30;

  p.N = B1; p.D = D1; p.W = W1; p.S = S1; p.silu = 1; p.begin = begin; p.len = len;
  ref_forward(&p, x, w, bias, res, h0, ry, rht, u);
  ref_backward(&p, x, w, bias, h0, dy, dht, rdx, rdw, rdb, rdh0, u, du);

  sc_conv_args_init(&a);
  a.width = W1;
  a.state_len = S1;
  a.activation = SC_ACT_SILU;
  a.exec.backend = be;
  a.x = dense(x, SC_F64, 3, sx);
  a.weight = dense(w, SC_F64, 2, sw);
  a.bias = dense(bias, SC_F64, 1, sb);
  a.residual = dense(res, SC_F64, 3, sx);
  a.initial_state = dense(h0, SC_F64, 3, ss);
  a.y = dense(y, SC_F64, 3, sx);
  a.final_state = dense(ht, SC_F64, 3, ss);
  a.dy = dense(dy, SC_F64, 3, sx);
  a.dfinal_state = dense(dht, SC_F64, 3, ss);
  a.dx = dense(dx, SC_F64, 3, sx);
  a.dweight = dense(dw, SC_F64, 2, sw);
  a.dbias = dense(db, SC_F64, 1, sb);
  a.dinitial_state = dense(dh0, SC_F64, 3, ss);

  st = run(&a, 0, &err);
  CHECK(st == SC_OK, "[%s] dense forward: %s", backend_name(be), err.message);
  st = run(&a, 1, &err);
  CHECK(st == SC_OK, "[%s] dense backward: %s", backend_name(be), err.message);
  {
    struct { const char* name; const double* got; const double* want; size_t n; } out[] = {
        {"y", y, ry, B1 * T1 * D1},        {"final_state", ht, rht, B1 * D1 * S1},
        {"dx", dx, rdx, B1 * T1 * D1},     {"dweight", dw, rdw, D1 * W1},
        {"dbias", db, rdb, D1},            {"dinitial_state", dh0, rdh0, B1 * D1 * S1}};
    for (i = 0; i < sizeof out / sizeof out[0]; ++i) {
      const double e = rel_err(out[i].got, out[i].want, out[i].n);
      CHECK(e <= 1e-12, "[%s] dense f64 %s: relative error %.3e > 1e-12", backend_name(be),
            out[i].name, e);
    }
  }
}

/* ---- case 2: packed float32, channel-major, short and empty sequences ----- */
enum { TOT2 = 9, D2 = 4, W2 = 3, S2 = 2, N2 = 3 };

static void case_packed_f32(int be) {
  /* channel-major storage: element (token, d) at d * TOT2 + token */
  float xs[TOT2 * D2], dys[TOT2 * D2], ys[TOT2 * D2], dxs[TOT2 * D2];
  float ws[D2 * W2], dws[D2 * W2], dbs[D2];
  float h0s[N2 * D2 * S2], dhts[N2 * D2 * S2], hts[N2 * D2 * S2], dh0s[N2 * D2 * S2];
  double x[TOT2 * D2], dy[TOT2 * D2], w[D2 * W2], h0[N2 * D2 * S2], dht[N2 * D2 * S2];
  double ry[TOT2 * D2], rht[N2 * D2 * S2], rdx[TOT2 * D2], rdw[D2 * W2], rdb[D2], rdh0[N2 * D2 * S2];
  double y[TOT2 * D2], ht[N2 * D2 * S2], dx[TOT2 * D2], dw[D2 * W2], db[D2], dh0[N2 * D2 * S2];
  double u[S2 + TOT2], du[S2 + TOT2];
  /* lengths 1 (< S: part of h0 shifts into ht), 0 (ht = h0) and 8 */
  long long cu[N2 + 1] = {0, 1, 1, TOT2};
  const long long begin[N2] = {0, 1, 1}, len[N2] = {1, 0, TOT2 - 1};
  const long long shx[2] = {TOT2, D2}, stx[2] = {1, TOT2};
  const long long sw[2] = {D2, W2}, sb[1] = {D2}, ss[3] = {N2, D2, S2}, scu[1] = {N2 + 1};
  unsigned seed = 777u;
  int tok, d, i;
  problem p;
  sc_conv_args a;
  sc_error err;
  sc_status st;

  for (tok = 0; tok < TOT2; ++tok)
    for (d = 0; d < D2; ++d) {
      /* values exactly representable in float: the oracle sees what the library sees */
      x[tok * D2 + d] = (float)rnd(&seed);
      dy[tok * D2 + d] = (float)rnd(&seed);
      xs[d * TOT2 + tok] = (float)x[tok * D2 + d];
      dys[d * TOT2 + tok] = (float)dy[tok * D2 + d];
      ys[d * TOT2 + tok] = dxs[d * TOT2 + tok] = 1e30f;
    }
  for (i = 0; i < D2 * W2; ++i) {
    w[i] = (float)rnd(&seed);
    ws[i] = (float)w[i];
    dws[i] = 1e30f;
  }
  for (i = 0; i < D2; ++i) dbs[i] = 1e30f;
  for (i = 0; i < N2 * D2 * S2; ++i) {
    h0[i] = (float)rnd(&seed);
    dht[i] = (float)rnd(&seed);
    h0s[i] = (float)h0[i];
    dhts[i] = (float)dht[i];
    hts[i] = dh0s[i] = 1e30f;
  }

  p.N = N2; p.D = D2; p.W = W2; p.S = S2; p.silu = 0; p.begin = begin; p.len = len;
  ref_forward(&p, x, w, NULL, NULL, h0, ry, rht, u);
  ref_backward(&p, x, w, NULL, h0, dy, dht, rdx, rdw, rdb, rdh0, u, du);

  sc_conv_args_init(&a); /* state_len -1: inferred from the state tensors */
  a.width = W2;
  a.activation = SC_ACT_NONE;
  a.exec.backend = be;
  a.x = make(xs, SC_F32, 2, shx, stx);
  a.cu_seqlens = dense(cu, SC_I64, 1, scu);
  a.weight = dense(ws, SC_F32, 2, sw);
  a.initial_state = dense(h0s, SC_F32, 3, ss);
  a.y = make(ys, SC_F32, 2, shx, stx);
  a.final_state = dense(hts, SC_F32, 3, ss);
  a.dy = make(dys, SC_F32, 2, shx, stx);
  a.dfinal_state = dense(dhts, SC_F32, 3, ss);
  a.dx = make(dxs, SC_F32, 2, shx, stx);
  a.dweight = dense(dws, SC_F32, 2, sw);
  a.dbias = dense(dbs, SC_F32, 1, sb);
  a.dinitial_state = dense(dh0s, SC_F32, 3, ss);

  st = run(&a, 0, &err);
  CHECK(st == SC_OK, "[%s] packed forward: %s", backend_name(be), err.message);
  st = run(&a, 1, &err);
  CHECK(st == SC_OK, "[%s] packed backward: %s", backend_name(be), err.message);
  for (tok = 0; tok < TOT2; ++tok)
    for (d = 0; d < D2; ++d) {
      y[tok * D2 + d] = ys[d * TOT2 + tok];
      dx[tok * D2 + d] = dxs[d * TOT2 + tok];
    }
  for (i = 0; i < N2 * D2 * S2; ++i) {
    ht[i] = hts[i];
    dh0[i] = dh0s[i];
  }
  for (i = 0; i < D2 * W2; ++i) dw[i] = dws[i];
  for (i = 0; i < D2; ++i) db[i] = dbs[i];
  {
    struct { const char* name; const double* got; const double* want; size_t n; } out[] = {
        {"y", y, ry, TOT2 * D2},       {"final_state", ht, rht, N2 * D2 * S2},
        {"dx", dx, rdx, TOT2 * D2},    {"dweight", dw, rdw, D2 * W2},
        {"dbias", db, rdb, D2},        {"dinitial_state", dh0, rdh0, N2 * D2 * S2}};
    size_t k;
    for (k = 0; k < sizeof out / sizeof out[0]; ++k) {
      const double e = rel_err(out[k].got, out[k].want, out[k].n);
      CHECK(e <= 1e-5, "[%s] packed f32 %s: relative error %.3e > 1e-5", backend_name(be),
            out[k].name, e);
    }
  }
  /* the empty sequence 1: ht = h0 and dh0 = dht exactly */
  for (d = 0; d < D2; ++d)
    for (i = 0; i < S2; ++i) {
      CHECK(hts[(1 * D2 + d) * S2 + i] == h0s[(1 * D2 + d) * S2 + i], "[%s] empty sequence ht",
            backend_name(be));
      CHECK(dh0s[(1 * D2 + d) * S2 + i] == dhts[(1 * D2 + d) * S2 + i],
            "[%s] empty sequence dh0", backend_name(be));
    }
}

/* ---- case 3: errors from C ------------------------------------------------- */
static void case_errors(void) {
  float x[6] = {0}, w[3] = {0}, y[6];
  const long long sx[3] = {1, 2, 3}, sw[2] = {3, 1};
  sc_conv_args a;
  sc_error err;
  size_t bytes = 0;
  int i;
  for (i = 0; i < 6; ++i) y[i] = -7.0f;
  sc_conv_args_init(&a);
  a.width = 1;
  a.x = dense(x, SC_F32, 3, sx);
  a.weight = dense(w, SC_F32, 2, sw);
  a.y = dense(y, SC_F32, 3, sx);
  CHECK(sc_validate(&a, 0, &err) == SC_OK, "baseline: %s", err.message);
  a.width = 0;
  CHECK(sc_forward(&a, &err) == SC_ERR_INVALID_ARGUMENT, "width 0 accepted");
  CHECK(strstr(err.message, "width") != NULL, "message does not name width: %s", err.message);
  CHECK(sc_forward_workspace_size(&a, &bytes, &err) == SC_ERR_INVALID_ARGUMENT, "query accepted");
  a.width = 1;
  a.y.data = x; /* y over x */
  CHECK(sc_forward(&a, &err) == SC_ERR_INVALID_ARGUMENT, "y over x accepted");
  CHECK(strstr(err.message, "y:") == err.message, "message does not start with y: %s", err.message);
  a.y.data = y;
  a.exec.backend = 17;
  CHECK(sc_forward(&a, NULL) == SC_ERR_INVALID_ARGUMENT, "backend 17 accepted");
  for (i = 0; i < 6; ++i) CHECK(y[i] == -7.0f, "y[%d] written on error", i);
  CHECK(sc_forward(NULL, &err) == SC_ERR_INVALID_ARGUMENT, "NULL args accepted");
  if (!sc_has_backend(SC_BACKEND_CUDA)) {
    a.exec.backend = SC_BACKEND_CUDA;
    CHECK(sc_backward(&a, &err) == SC_ERR_UNSUPPORTED, "cuda in a CPU-only build: %s", err.message);
  }
  CHECK(strcmp(sc_status_string(SC_ERR_WORKSPACE), "") != 0, "status string");
  CHECK(sc_version() == SC_VERSION_MAJOR * 10000 + SC_VERSION_MINOR * 100 + SC_VERSION_PATCH,
        "version %d", (int)sc_version());
}

int main(void) {
  const int backends[2] = {SC_BACKEND_REF, SC_BACKEND_CPU};
  int i;
  for (i = 0; i < 2; ++i) {
    CHECK(sc_has_backend(backends[i]) == 1, "host backend %d missing", backends[i]);
    case_dense_f64(backends[i]);
    case_packed_f32(backends[i]);
  }
  case_errors();
  if (g_failures) {
    fprintf(stderr, "shortconv C ABI test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("shortconv C ABI test (version %s): all checks passed\n", sc_version_string());
  return 0;
}
