// Consumer of the installed package: one forward on each host backend,
// checked against the definition (docs/semantics.md section 1) computed here.
#include <cmath>
#include <cstdio>
#include <vector>

#include "shortconv/shortconv.hpp"

extern "C" int consumer_c_version_ok(void);

int main() {
  const int64_t T = 5, D = 2, W = 3;  // one sequence, no state: S = W-1, zero initial state
  std::vector<float> x(T * D), w(D * W), y(T * D, -1.0f);
  for (int64_t i = 0; i < T * D; ++i) x[i] = float(i % 7) * 0.25f - 0.5f;
  for (int64_t i = 0; i < D * W; ++i) w[i] = float(i + 1) * 0.125f;
  int failures = 0;
  for (sc_backend be : {SC_BACKEND_REF, SC_BACKEND_CPU}) {
    sc_conv_args a = shortconv::conv_args();
    a.width = int32_t(W);
    a.exec.backend = be;
    a.x = shortconv::tensor(x.data(), SC_F32, {1, T, D});
    a.weight = shortconv::tensor(w.data(), SC_F32, {D, W});
    a.y = shortconv::tensor(y.data(), SC_F32, {1, T, D});
    std::vector<unsigned char> ws(shortconv::forward_workspace_size(a));
    a.exec.workspace = ws.empty() ? nullptr : ws.data();
    a.exec.workspace_bytes = ws.size();
    sc_error err{};
    shortconv::check(sc_forward(&a, &err), err);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        double want = 0;  // y[t] = sum_k w[k] x[t - (W-1) + k], zeros before the start
        for (int64_t k = 0; k < W; ++k) {
          const int64_t s = t - (W - 1) + k;
          if (s >= 0) want += double(w[d * W + k]) * x[s * D + d];
        }
        if (std::fabs(y[t * D + d] - want) > 1e-5 * (1 + std::fabs(want))) {
          std::fprintf(stderr, "backend %d: y[%lld, %lld] = %g, want %g\n", int(be), (long long)t,
                       (long long)d, double(y[t * D + d]), want);
          ++failures;
        }
      }
  }
  if (!consumer_c_version_ok()) {
    std::fprintf(stderr, "version mismatch between header and library\n");
    ++failures;
  }
  if (failures) return 1;
  std::printf("consumer: shortconv %s from the installed package works\n", sc_version_string());
  return 0;
}
