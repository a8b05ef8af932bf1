// Run-time choices -> template parameters, once for both directions.
//
//   with_act_type(dtype, f)     f(TypeTag<T>{}) for the activation dtype
//   with_wmax<4, 8>(wmax, f)    f(Int<WMAX>{}) when wmax is one of the listed
//                               instances (the lists below are checked against
//                               traits.hpp's sets, so planner and launcher agree)
//   Launch                      one kernel launch on the caller's stream, with
//                               the plan's geometry; remembers which kernel ran
//                               last and whether a plan found no instance
//   with_step_instance(p, pl, l, name, f)
//                               f(TypeTag<T>{}, Int<CH>{}, TypeTag<I>{}) for the
//                               engines' common decode steps (dtype, channels
//                               per thread, index dtype)
//
// fwd.cu and bwd.cu each write one launcher over these; neither repeats a
// dtype switch, a window ladder or a grid computation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/plan.hpp"

namespace shortconv::cuda {

template <class T>
struct TypeTag {
  using type = T;
};
template <int V>
using Int = std::integral_constant<int, V>;

template <class F>
decltype(auto) with_act_type(sc_dtype dt, F&& f) {
  switch (dt) {
    case SC_F32: return f(TypeTag<float>{});
    case SC_F16: return f(TypeTag<__half>{});
    case SC_BF16: return f(TypeTag<__nv_bfloat16>{});
    default: return f(TypeTag<double>{});
  }
}

template <int... Ws, class F>
bool with_wmax(int wmax, F&& f) {
  return ((wmax == Ws ? (f(Int<Ws>{}), true) : false) || ...);
}

// The instantiated window bounds, the same sets the planner picks from.
#define SC_TM_VEC_WMAX 4, 8
#define SC_TM_VEC_WMAX16 2, 3, 4, 8, 16
#define SC_NARROW_WMAX 4, 16
template <int... Ws>
constexpr bool same_set(const WmaxSet& s) {
  const int v[] = {Ws...};
  if (int(sizeof...(Ws)) != s.n) return false;
  for (int i = 0; i < s.n; ++i)
    if (v[i] != s.v[i]) return false;
  return true;
}
static_assert(same_set<SC_TM_VEC_WMAX>(kTmVecWmax), "SC_TM_VEC_WMAX must list kTmVecWmax");
static_assert(same_set<SC_TM_VEC_WMAX16>(kTmVecWmax16), "SC_TM_VEC_WMAX16 must list kTmVecWmax16");
static_assert(same_set<SC_NARROW_WMAX>(kNarrowWmax), "SC_NARROW_WMAX must list kNarrowWmax");

// Channel-major full-window instances (fwd_cm / bwd_cm<T, W, true>): the
// window W itself as the bound (no pad taps) and SiLU, at compile time, for
// the widths of the targets' layers under the W <= 4 bound (W = 5..16 is
// rare, and every instance is compiled for two architectures in CI).
// with_cm_full<WMAX>(a, f) calls f(Int<W>{}) and returns true when the
// problem has one.
#define SC_CM_FULL_W 2, 3, 4
template <int WMAX, class F>
bool with_cm_full(const Args& a, F&& f) {
  if constexpr (WMAX != 4) return false;
  else return a.act == SC_ACT_SILU && with_wmax<SC_CM_FULL_W>(a.W, f);
}

// One direction's launches.  Each returns the launch's error; `kernel` names
// the last kernel launched (or attempted), `missing` is set when a plan named
// an instance that was not compiled (reported as SC_ERR_BACKEND).
struct Launch {
  cudaStream_t stream;
  const char* kernel = "?";
  bool missing = false;
  // Launch with programmatic stream serialization (sc_exec.overlap), for
  // the overlapped instances (Plan::overlap), which call overlap_wait()
  // before their first access to memory the previous kernel may write or
  // read (or, reading ahead, before any that it may write).  Attached only
  // to code compiled for sm_90 or newer (its PTX version: code compiled for
  // an older target and JIT-compiled for this device has no wait).
  bool overlap = false;

  // kernel<<<plan geometry>>>(args, extra...) with the plan's shared memory.
  // (K: the kernel's argument block, Args; fwd_decode_plain's is its own.)
  template <class K, class... X>
  cudaError_t main(const char* name, void (*k)(K, X...), const Plan& pl, const K& a, X... extra) {
    return go(name, k, dim3(unsigned(pl.grid_x), unsigned(pl.grid_y)),
              dim3(unsigned(pl.block_x), unsigned(pl.block_y)), pl.smem, a, extra...);
  }
  // One thread per item of a small kernel (SmallTraits).
  template <class... X>
  cudaError_t small(const char* name, void (*k)(Args, X...), int64_t items, const Args& a,
                    X... extra) {
    return go(name, k, dim3(unsigned(ceil_div(items, SmallTraits::kThreads))),
              dim3(SmallTraits::kThreads), 0, a, extra...);
  }
  // seq_idx state kernels (IdStateTraits): blocks over (tokens, channels).
  template <class... X>
  cudaError_t ids(const char* name, void (*k)(Args, X...), int64_t tokens, int64_t channels,
                  const Args& a, X... extra) {
    return go(name, k,
              dim3(unsigned(ceil_div(tokens, IdStateTraits::kTokens)),
                   unsigned(ceil_div(channels, IdStateTraits::kThreads))),
              dim3(IdStateTraits::kThreads), 0, a, extra...);
  }
  cudaError_t no_instance(const char* name) {
    kernel = name;
    missing = true;
    return cudaErrorInvalidValue;
  }

 private:
  template <class K, class... X>
  cudaError_t go(const char* name, void (*k)(K, X...), dim3 grid, dim3 block, size_t smem,
                 const K& a, X... extra) {
    kernel = name;
    void* params[] = {const_cast<K*>(&a), &extra...};
    const void* f = reinterpret_cast<const void*>(k);
    if (overlap) {
      cudaFuncAttributes fa{};
      if (cudaFuncGetAttributes(&fa, f) != cudaSuccess) return cudaGetLastError();
      if (fa.ptxVersion >= kOverlapMinPtx) {
        cudaLaunchAttribute attr[1] = {};
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return cudaLaunchKernelExC(&cfg, f, params);
      }
    }
    return cudaLaunchKernel(f, grid, block, params, smem, stream);
  }
  static constexpr int kOverlapMinPtx = 90;  // griddepcontrol: sm_90 and newer
};

// The main kernel(s) of pl.path for activation type T, for one direction:
// K supplies, as static member templates returning K's launch result,
//   tm<T, WMAX, CH>(pl, a, l)   token-major (CH > 1: vector path, 1: scalar)
//   cm<T, WMAX>(pl, a, l)       channel-major
//   general<A>(pl, a, l)        W > kMaxFastW
// and this picks the instance the plan names (or reports none).
template <class K, class T>
cudaError_t launch_path(const Plan& pl, const Args& a, Launch* l) {
  constexpr bool f64 = std::is_same_v<T, double>;
  bool found = false;
  cudaError_t e = cudaSuccess;
  switch (pl.path) {
    case Path::token_major_vec: {
      auto vec = [&](auto wm) {
        constexpr int W = decltype(wm)::value, CH = tm_vec_channels(sizeof(T), W);
        if constexpr (CH > 1 && !f64) e = K::template tm<T, W, CH>(pl, a, l);
        else e = l->no_instance("token-major vector (fp64 or one channel)");
      };
      if constexpr (sizeof(T) == 2) found = with_wmax<SC_TM_VEC_WMAX16>(pl.wmax, vec);
      else found = with_wmax<SC_TM_VEC_WMAX>(pl.wmax, vec);
      break;
    }
    case Path::token_major_scalar:
      found = with_wmax<SC_NARROW_WMAX>(pl.wmax, [&](auto wm) {
        e = K::template tm<T, decltype(wm)::value, 1>(pl, a, l);
      });
      break;
    case Path::channel_major:
      found = with_wmax<SC_NARROW_WMAX>(pl.wmax, [&](auto wm) {
        if constexpr (!f64) e = K::template cm<T, decltype(wm)::value>(pl, a, l);
        else e = l->no_instance("channel-major (fp64)");
      });
      break;
    case Path::general:
      found = true;
      e = K::template general<acc_t<T>>(pl, a, l);
      break;
    case Path::decode:  // (launch_decode's: no instance of either direction's tables)
      break;
  }
  return found ? e : l->no_instance(path_name(pl.path));
}

// The engines' common decode steps (decode_plain.cu, decode_spec.cu):
// f(TypeTag<T>{}, Int<CH>{}, TypeTag<I>{}) for the activation dtype (fp64 has
// no instance), the plan's channels per thread (DecodeTraits::kWideBytes or
// kVecBytes of x) and its index dtype (Plan::plain_index).  `kernel` names
// the kernel when no instance matches.
template <class F>
cudaError_t with_step_instance(const Problem& p, const Plan& pl, Launch* l, const char* kernel, F&& f) {
  return with_act_type(p.act_dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      return l->no_instance(kernel);
    } else {
      constexpr int kWide = DecodeTraits::kWideBytes / int(sizeof(T));
      constexpr int kNarrow = DecodeTraits::kVecBytes / int(sizeof(T));
      const bool i32 = pl.plain_index == SC_I32;
      if (pl.ch == kWide)
        return i32 ? f(tag, Int<kWide>{}, TypeTag<int32_t>{}) : f(tag, Int<kWide>{}, TypeTag<int64_t>{});
      if (pl.ch == kNarrow)
        return i32 ? f(tag, Int<kNarrow>{}, TypeTag<int32_t>{}) : f(tag, Int<kNarrow>{}, TypeTag<int64_t>{});
      return l->no_instance(kernel);
    }
  });
}

// Kernels of each direction (fwd.cu, bwd.cu).
cudaError_t launch_fwd(const Problem& p, const Plan& pl, const Args& a, Launch* l);
cudaError_t launch_bwd(const Problem& p, const Plan& pl, const Args& a, Launch* l);
// The one-launch decode step (decode.cu), for plans of Path::decode.
cudaError_t launch_decode(const Problem& p, const Plan& pl, const Args& a, Launch* l);
// Its linear steps with the state rows in registers (decode_linear.cu: vLLM
// rows, short [P, D, S] rows of the wide instance), called by launch_decode.
cudaError_t launch_decode_linear(const Problem& p, const Plan& pl, const Args& a, Launch* l);
// The plain step (decode_plain.cu: Plan::plain_step, vLLM rows or [P, D, S]
// rows in registers), called by launch_decode_linear.
cudaError_t launch_decode_plain(const Problem& p, const Plan& pl, const Args& a, Launch* l);
// The common speculative step (decode_spec.cu: Plan::spec_step, vLLM rows or
// [P, D, S] rows in registers), called by launch_decode_linear.
cudaError_t launch_decode_spec(const Problem& p, const Plan& pl, const Args& a, Launch* l);

// A forward's padded sequences' outputs set to 0 after its kernel (pads.cu), for
// zero_padded_outputs on plans that do not fuse it (Plan::zero_pads_fused).
cudaError_t launch_zero_padded_y(const Problem& p, const Args& a, Launch* l);

// The kernels' argument block for a problem and its plan (backend.cu).
Args make_args(const Problem& p, const Plan& pl, void* workspace);

}  // namespace shortconv::cuda
