// The caller's floating-point modes on every worker thread of a call.
//
// Flush-to-zero / denormals-are-zero and the rounding mode are per-thread
// state (x86: MXCSR; Arm: FPCR).  OpenMP workers keep the modes they had when
// the pool was created, so a caller that flushes denormals after the pool
// exists (torch.set_flush_denormal(True)) would get results that depend on the
// thread count.  Each worker therefore adopts the calling thread's modes for
// the duration of a call and restores its own afterwards (no state leaks into
// the pool).  Exception masks and sticky flags are left alone.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace shortconv::cpu {

class FpMode {
 public:
  // The modes of the calling thread.
  static FpMode current() { return FpMode(read() & kMask); }

  // Sets these modes on the calling thread until the scope ends.
  class Scope {
   public:
    explicit Scope(const FpMode& m) : saved_(read()) { write((saved_ & ~kMask) | m.bits_); }
    ~Scope() { write(saved_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    uint64_t saved_;
  };

 private:
  explicit FpMode(uint64_t bits) : bits_(bits) {}
  uint64_t bits_;

#if defined(__x86_64__) || defined(__i386__)
  // MXCSR: DAZ (bit 6), rounding control (bits 13-14), FTZ (bit 15).
  static constexpr uint64_t kMask = 0x0040u | 0x6000u | 0x8000u;
  static uint64_t read() { return _mm_getcsr(); }
  static void write(uint64_t v) { _mm_setcsr(unsigned(v)); }
#elif defined(__aarch64__)
  // FPCR: FZ16 (bit 19), RMode (bits 22-23), FZ (bit 24).
  static constexpr uint64_t kMask = (uint64_t(1) << 19) | (uint64_t(3) << 22) | (uint64_t(1) << 24);
  static uint64_t read() {
    uint64_t v;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
    return v;
  }
  static void write(uint64_t v) { __asm__ __volatile__("msr fpcr, %0" : : "r"(v)); }
#else
  // Other architectures: the modes are not propagated (docs/semantics.md §6).
  static constexpr uint64_t kMask = 0;
  static uint64_t read() { return 0; }
  static void write(uint64_t) {}
#endif
};

}  // namespace shortconv::cpu
