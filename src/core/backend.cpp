// The backend table (backend.hpp).
#include "core/backend.hpp"

namespace shortconv {

namespace {

#ifdef SHORTCONV_WITH_CUDA
constexpr bool kCuda = true;
#define SC_CUDA_FN(f) &cuda::f
#else
constexpr bool kCuda = false;
#define SC_CUDA_FN(f) nullptr
#endif

// Indexed by sc_backend.
constexpr Backend kBackends[] = {
    {SC_BACKEND_CPU, "cpu", Memory::host, true, &cpu::workspace, &cpu::run},
    {SC_BACKEND_CUDA, "cuda", Memory::device, kCuda, SC_CUDA_FN(workspace), SC_CUDA_FN(run)},
    {SC_BACKEND_REF, "ref", Memory::host, true, &ref::workspace, &ref::run},
};
#undef SC_CUDA_FN

static_assert(kBackends[SC_BACKEND_CPU].id == SC_BACKEND_CPU &&
                  kBackends[SC_BACKEND_CUDA].id == SC_BACKEND_CUDA &&
                  kBackends[SC_BACKEND_REF].id == SC_BACKEND_REF,
              "kBackends is indexed by sc_backend");

}  // namespace

const Backend* find_backend(int32_t id) {
  constexpr int32_t n = int32_t(sizeof(kBackends) / sizeof(kBackends[0]));
  return id >= 0 && id < n ? &kBackends[id] : nullptr;
}

sc_status workspace_too_large(const Problem& p, sc_error* err) {
  return fail(err, SC_ERR_UNSUPPORTED,
              "exec.workspace: the scratch this call needs does not fit in 63 bits "
              "(N=%lld sequences, T=%lld tokens, D=%lld channels, W=%d, S=%d, tiles %lld x %lld)",
              (long long)p.N, (long long)p.T, (long long)p.D, p.W, p.S,
              (long long)p.exec.tile_t, (long long)p.exec.tile_d);
}

}  // namespace shortconv
