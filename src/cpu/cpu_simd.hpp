// CPU backend: vector operations for ONE instruction set.
//
// NO include guard on purpose: each per-ISA unit (cpu_isa_v128.cpp,
// cpu_isa_avx2.cpp, cpu_isa_avx512.cpp) includes this file and cpu_kernels.hpp
// once, inside its own namespace (and, on x86, `#pragma GCC target(...)`),
// with SC_ISA set to 0 (128-bit vectors: SSE2 on x86-64, NEON on aarch64,
// GCC's generic vectors elsewhere), 1 (AVX2+FMA+F16C) or 2 (AVX-512
// F/BW/DQ/VL).  The library therefore runs on any architecture and, on
// x86-64, picks the widest kernels at run time (cpu_isa.cpp).  SC_ISA 0 is
// written with GCC vector extensions only, plus NEON's fused multiply-add.
//
// Ops structs: A = accumulation type, V = a vector of L lanes of A (GCC vector
// extensions: + - * / and ?: work lane-wise), loads/stores that convert from /
// to the storage type with round-to-nearest-even (the same rounding as
// core/dtype.hpp, which the state tensors use element by element).
//
// exp: Cephes-style range reduction 2^n * exp(r), |r| <= ln2/2, degree-7
// polynomial: ~2 ulp in float, far below the 1e-5 fp32 tolerance, +inf past
// float's range (see OpsF::exp for the ends of the range).  SiLU
// divides (one vdivps: it runs beside the FMA pipes and is shorter, in
// scheduler entries and latency, than a reciprocal estimate + Newton step).

struct OpsF {
  using A = float;
#if SC_ISA == 2
  using V = __m512;
  static constexpr int L = 16;
#elif SC_ISA == 1
  using V = __m256;
  static constexpr int L = 8;
#else
  using V = float __attribute__((vector_size(16)));
  static constexpr int L = 4;
#endif
  using VU = uint32_t __attribute__((vector_size(sizeof(V))));
  using VH = uint16_t __attribute__((vector_size(sizeof(V) / 2)));

  static V zero() { return V{}; }
  static V set1(float a) { return V{} + a; }
  // the math interface of core/activation.hpp
  static constexpr bool kTanhForm = false;
  static V one() { return set1(1.f); }
  static V div(V a, V b) { return a / b; }
  static V tanh(V h) { return h; }  // (unused: kTanhForm is false)
  static V load(const float* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V fma(V a, V b, V c) {
#if SC_ISA == 2
    return _mm512_fmadd_ps(a, b, c);
#elif SC_ISA == 1
    return _mm256_fmadd_ps(a, b, c);
#elif defined(__aarch64__)
    return V(vfmaq_f32(float32x4_t(c), float32x4_t(a), float32x4_t(b)));  // fused, as AVX2's
#else
    return a * b + c;  // (SSE2 has no FMA; the build never contracts this, see sources.cmake)
#endif
  }
  // min(hi, max(lo, x)); NaN stays NaN.  x86's max(a, b) and min(a, b)
  // return b when either is NaN, so max(l, x) is exactly `x < l ? l : x`;
  // GCC does not emit them for the ternaries (it emits a compare and a
  // blend for each), hence the intrinsics.
  static V clamp(V x, float lo, float hi) {
    const V l = set1(lo), h = set1(hi);
#if SC_ISA == 2
    return _mm512_min_ps(h, _mm512_max_ps(l, x));
#elif SC_ISA == 1
    return _mm256_min_ps(h, _mm256_max_ps(l, x));
#elif SC_X86
    return V(_mm_min_ps(__m128(h), _mm_max_ps(__m128(l), __m128(x))));
#else
    x = x < l ? l : x;
    return x > h ? h : x;
#endif
  }
  // exp(x) = 2^n * p(r), n = round(x / ln2), r = x - n ln2 (ln2 split in a
  // hi part exact in float and a lo part), p a degree-7 polynomial (Cephes
  // expf coefficients).  Range: x is clamped to [kExpLo, kExpInf] before the
  // reduction, so n stays in [-124, 129].  Past log(FLT_MAX) the result is
  // +inf without a compare: for n = 128 the product 2p * 2^127 (p >= 1 there)
  // overflows, and for n = 129 the factor 2^128 is itself +inf (exponent field
  // 255); AVX-512's scalef overflows the same way (silu(z) = z/(1+e^-z) thus
  // gives -0 for z < -88.7 instead of a clamped, wrong value).  Below kExpLo
  // the result is e^kExpLo, ~4e-38 instead of the true tiny value: callers
  // only ever add it to 1 (sigmoid), where both vanish.  NaN stays NaN
  // (except under AVX-512's min/max, where the caller's own NaN operand
  // carries it).
  static constexpr float kExpLo = -86.0f;
  static constexpr float kExpInf = 89.25f;  // > log(FLT_MAX) = 88.7228..., n = 129
  // Outside AVX-512 the polynomial is evaluated times 2 (every coefficient
  // doubled: exact) so that 2^n = 2 * 2^(n-1) costs no extra multiply.
  static constexpr float kQ = SC_ISA == 2 ? 1.f : 2.f;
  static V exp(V x0) {
    const V x = clamp(x0, kExpLo, kExpInf);
#if SC_ISA == 2
    const V n = _mm512_roundscale_ps(x * set1(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    // k = n + 1.5 * 2^23 exactly (adding the magic rounds to an integer), so
    // k's low mantissa bits hold n in two's complement: no conversion needed
    // for 2^(n-1) below.
    const V k = fma(x, set1(1.44269504088896341f), set1(kMagic));
    const V n = k - set1(kMagic);
#endif
    V r = fma(n, set1(-0.693359375f), x);
    r = fma(n, set1(2.12194440e-4f), r);
    // kQ (1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4 + c7 r^5)),
    // Estrin's scheme: a dependency chain of 4 instead of 7 FMAs (the sigmoid
    // is latency bound: shorter chains let more vectors overlap).
    const V r2 = r * r;
    const V a = fma(set1(kQ * 1.6666665459e-1f), r, set1(kQ * 5.0000001201e-1f));
    const V b = fma(set1(kQ * 8.3334519073e-3f), r, set1(kQ * 4.1665795894e-2f));
    const V c = fma(set1(kQ * 1.9875691500e-4f), r, set1(kQ * 1.3981999507e-3f));
    V q = fma(fma(c, r2, b), r2, a);
    q = fma(q, r2, fma(r, set1(kQ), set1(kQ)));
#if SC_ISA == 2
    return _mm512_scalef_ps(q, n);  // exact scaling; +inf past the range
#else
    // q = 2p; 2^(n-1) with n-1 in [-125, 128]: a normal float, or +inf at 128.
    return q * pow2_nm1(k);
#endif
  }
  // 1.5 * 2^23: x + kMagic rounds x (|x| < 2^22) to an integer n, and the sum
  // is exactly 1.5 * 2^23 + n.
  static constexpr float kMagic = 12582912.0f;
  // 2^(n-1) from k = kMagic + n, n in [-124, 129]: the exponent field is
  // n - 1 + 127 = n + 126 in [2, 255] (255: +inf).  k's bits are
  // 0x4B400000 + n; adding 126 and shifting left by 23 leaves exactly
  // (n + 126) << 23, since every bit of 0x4B400000 + n + 126 above bit 8
  // shifts out (unsigned, so the overflow is defined).
  static V pow2_nm1(V k) { return (V)(((VU)k + 126u) << 23); }

  // ---- storage conversions: contiguous full vectors ------------------------
  static V load_x(const float* p) { return load(p); }
  static V load_x(const bf16_t* p) {
#if SC_ISA == 2
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
#elif SC_ISA == 1
    // the 8 values in both 128-bit halves (a load, no shuffle), then each
    // moved into the high half of its 32-bit lane with zeros below: one
    // shuffle instead of a widening shuffle and a shift (on Zen, shuffles and
    // shifts share two of the four vector pipes)
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(
        b, _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1,
                            10, 11, -1, -1, 12, 13, -1, -1, 14, 15)));
#else
    VH h;
    std::memcpy(&h, p, sizeof h);
    return (V)(__builtin_convertvector(h, VU) << 16);
#endif
  }
  static V load_x(const f16_t* p) {
#if SC_ISA == 2
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif SC_ISA == 1
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    float t[L];
    for (int i = 0; i < L; ++i) t[i] = f16_to_f32(p[i].bits);
    return load(t);
#endif
  }
  static void store_x(float* p, V v) { store(p, v); }
  static void store_x(bf16_t* p, V v) {
#if SC_ISA == 2
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
#elif SC_ISA == 1
    // as below, the result in the high half of each 32-bit lane (a NaN gets
    // the quiet bit, 0x00400000, the bf16 0x40), which one byte shuffle and
    // one quadword permute gather: fewer shifts and shuffles than the
    // generic narrowing (shift, mask, pack, permute)
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    r = _mm256_shuffle_epi8(r, _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                                2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i h = _mm256_permute4x64_epi64(r, 0x08);  // quadwords 0 and 2
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(h));
#else
    const VU u = (VU)v;
    VU r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    r = v != v ? ((u >> 16) | 0x40u) : r;  // NaN: quieted, never rounded to inf
    const VH h = __builtin_convertvector(r, VH);
    std::memcpy(p, &h, sizeof h);
#endif
  }
  static void store_x(f16_t* p, V v) {
#if SC_ISA == 2
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif SC_ISA == 1
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    float t[L];
    store(t, v);
    for (int i = 0; i < L; ++i) p[i].bits = f32_to_f16(t[i]);
#endif
  }
};

// fp32 accumulation with a cheaper exp for a 16-bit OUTPUT: the forward of
// bf16 (kDeg 3) and fp16 (kDeg 4) activations, whose y is rounded to 8 or 11
// significant bits.  The backward keeps OpsF's exp: its dpre feeds fp32
// accumulations (dweight, dbias, dinitial_state) that may be fp32 outputs.
//
// e^x = 2^n 2^f, n = rint(x log2e), 2^f a degree-kDeg polynomial (minimax
// relative error on [-1/2, 1/2], fitted for these float coefficients): no
// two-part ln2 reduction, a shorter polynomial.
// - AVX-512 (8 operations with kDeg 3, against OpsF's 17): t = x log2e
//   rounded, the negation of SiLU's e^-z folded into that product by the
//   compiler, t clamped below only, n = rint(t), f = t - n, p(f) by Horner,
//   2^n p by scalef.  No upper clamp: once |t| >= 2^23 it is an integer, so
//   f = 0 and scalef overflows to +inf exactly where e^x does; t = +inf gives
//   f = NaN (silu(-inf) = -inf / inf = NaN either way).  On the project's Zen 4
//   VM a 512-bit operation issues as two halves and SiLU's operations bound the
//   bf16 forward (it ran at the same speed from memory and from cache).
// - Other ISAs (12 or 13 operations): x clamped to [kExpLo, kExpInf],
//   f = x log2e - n in one fma, p(f) by Estrin's scheme, 2^n by the exponent
//   field (the magic-number rounding needs |x log2e| < 2^22).
//
// Error bound of SiLU's y = z / (1 + e^-z) before rounding, e = e^x, x = -z:
//   polynomial                 7.49e-5 (kDeg 3), 2.69e-6 (kDeg 4)  (fit, in float)
//   f's argument error         fma form: |x| |log2e - fl(log2e)| <= 89.25 * 1.93e-8
//                              = 1.73e-6 in f; AVX-512 also the rounding of t,
//                              |t| 2^-24 <= 128 * 2^-24 = 7.6e-6 (|t| <= 128
//                              wherever e is finite and not below 2^-126):
//                              at most 9.4e-6 in f, ln2 times that, 6.5e-6,
//                              relative in 2^f
//   rounding of f and of p     <= 4e-7 (each operation rounds once; the
//                              terms past c0 + c1 f are small next to
//                              p(f) >= 0.7 on the interval; t - n is exact)
//   scaling by 2^n             exact (powers of two, normal results: n >= -124)
//   so |e~/e - 1| <= 8.2e-5 (kDeg 3) resp. 9.6e-6 (kDeg 4).  1 + e moves
//   by at most e/(1+e) < 1 times that, relatively, and the add and the
//   division round once each (2^-24): |y~/y - 1| <= 8.3e-5 < 2^-13.5
//   resp. 9.8e-6 < 2^-16.6.
// bf16 rounds at a relative half-ulp of at least 2^-9, fp16 at least 2^-12,
// so the stored y is the correctly rounded value or its neighbour: within
// one ulp (tested over every bf16 and fp16 input, activation_test.cpp).
// The ends of the range are OpsF's: +inf past log(FLT_MAX) (so silu(-inf) =
// -inf / inf = NaN, silu(-1e30) = -0), e^kExpLo (~4e-38, invisible next to
// 1) below; a NaN z stays NaN in z / d.
template <int kDeg>
struct OpsFNarrow : OpsF {
  static_assert(kDeg == 3 || kDeg == 4, "fitted degrees");
  // p(f) ~ 2^f (times kQ): coefficients of f^0 .. f^kDeg.
  static constexpr float kC3[4] = {9.9992805719e-01f, 6.9326096773e-01f, 2.4261109531e-01f,
                                   5.5171646178e-02f};
  static constexpr float kC4[5] = {9.9999928474e-01f, 6.9312179089e-01f, 2.4024744332e-01f,
                                   5.5917859077e-02f, 9.5700994134e-03f};
  static constexpr float c(int i) { return kQ * (kDeg == 3 ? kC3[i] : kC4[i]); }
  static constexpr float kLog2e = 1.44269504088896341f;
  static V exp(V x0) {
#if SC_ISA == 2
    // max(lo, t) keeps a NaN t (x86's max returns its second operand then)
    const V t = _mm512_max_ps(set1(kExpLo * kLog2e), x0 * set1(kLog2e));
    const V n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = t - n;  // exact; |f| <= 1/2
    V q = set1(c(kDeg));
    for (int i = kDeg - 1; i >= 0; --i) q = fma(q, f, set1(c(i)));
    return _mm512_scalef_ps(q, n);
#else
    const V x = clamp(x0, kExpLo, kExpInf), log2e = set1(kLog2e);
    const V k = fma(x, log2e, set1(kMagic));
    const V n = k - set1(kMagic);
    const V f = fma(x, log2e, -n);  // |f| <= 1/2 (+ the argument error)
    // Estrin's scheme (one multiply more than Horner, a dependency chain of
    // 3 operations instead of kDeg: these loops are bound by how many vectors
    // are in flight, and every vector waits for its whole chain).
    const V f2 = f * f;
    V q;
    if constexpr (kDeg == 3) {
      q = fma(fma(set1(c(3)), f, set1(c(2))), f2, fma(set1(c(1)), f, set1(c(0))));
    } else {
      q = fma(fma(set1(c(4)), f2, fma(set1(c(3)), f, set1(c(2)))), f2,
              fma(set1(c(1)), f, set1(c(0))));
    }
    return q * pow2_nm1(k);  // q = 2p (kQ = 2): 2^n p = 2^(n-1) q
#endif
  }
};

#if SC_ISA == 2
// bf16 with AVX-512 BF16 (the avx512bf16 table): y and dx rounded by
// vcvtneps2bf16, one instruction instead of OpsF's eight (on the project's
// Zen 4 VM the rounding was a quarter of the bf16 forward's time: one thread,
// 4x4096x2048, 13.9 -> 10.6 ms).
// It rounds to nearest even and quiets a NaN exactly as OpsF::store_x does
// ((u >> 16) | 0x40), ignoring MXCSR as OpsF's integer path does, but it
// flushes subnormal inputs to zero: a vector holding a subnormal takes
// OpsF's path, so the stored bits are OpsF's in every case.
// Base: the forward's OpsFNarrow<3> or the backward's OpsF.
template <class Base>
struct Bf16Cvt : Base {
  using V = typename Base::V;
  using Base::store_x;
  static void store_x(bf16_t* p, V v) {
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) != 0, 0)) return OpsF::store_x(p, v);  // 0x20: subnormal
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
};
#endif

// fp64 accumulation for f64 activations (the gradcheck path): exact libm exp.
struct OpsD {
  using A = double;
  using V = double __attribute__((vector_size(16)));
  static constexpr int L = 2;
  static V zero() { return V{}; }
  static V set1(double a) { return V{} + a; }
  static constexpr bool kTanhForm = false;  // the math interface of core/activation.hpp
  static V one() { return set1(1.0); }
  static V div(V a, V b) { return a / b; }
  static V tanh(V h) { return h; }
  static V load(const double* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(double* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V fma(V a, V b, V c) {  // fused where OpsF::fma is
#if SC_ISA >= 1
    return V(_mm_fmadd_pd(__m128d(a), __m128d(b), __m128d(c)));
#elif defined(__aarch64__)
    return V(vfmaq_f64(float64x2_t(c), float64x2_t(a), float64x2_t(b)));
#else
    return a * b + c;
#endif
  }
  static V exp(V x) {
    for (int i = 0; i < L; ++i) x[i] = std::exp(x[i]);
    return x;
  }
  static V load_x(const double* p) { return load(p); }
  static void store_x(double* p, V v) { store(p, v); }
};

// L lanes of an activation row starting at p with channel stride sd; only the
// first n lanes are real (the rest read as 0).  Strided / partial vectors are
// gathered as raw storage elements and converted as one vector, so they round
// exactly like the contiguous path and cost a move per lane, not a conversion.
template <class O, class XT>
inline typename O::V load_lanes(const XT* p, int64_t sd, int n) {
  if (sd == 1 && n == O::L) return O::load_x(p);
  XT t[O::L];
  std::memset(static_cast<void*>(t), 0, sizeof t);
  for (int i = 0; i < n; ++i) t[i] = p[i * sd];
  return O::load_x(t);
}

template <class O, class XT>
inline void store_lanes(XT* p, int64_t sd, int n, typename O::V v) {
  if (sd == 1 && n == O::L) return O::store_x(p, v);
  XT t[O::L];
  O::store_x(t, v);
  for (int i = 0; i < n; ++i) p[i * sd] = t[i];
}

// L lanes of a state tensor (any dtype, any strides): element (row, d+i, j).
template <class O>
inline typename O::V load_state_lanes(const View& v, int64_t row, int64_t d, int64_t j, int n) {
  typename O::A t[O::L] = {};
  for (int i = 0; i < n; ++i) t[i] = typename O::A(load_f64(v.data, v.dtype, v.off(row, d + i, j)));
  return O::load(t);
}

template <class O>
inline void store_state_lanes(const View& v, int64_t row, int64_t d, int64_t j, int n,
                              typename O::V x) {
  typename O::A t[O::L];
  O::store(t, x);
  for (int i = 0; i < n; ++i) store_f64(v.data, v.dtype, v.off(row, d + i, j), double(t[i]));
}

