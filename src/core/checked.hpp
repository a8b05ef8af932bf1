// Overflow-checked arithmetic for counts and byte sizes derived from user
// shapes (plans, workspace queries).  Shapes that pass validation each fit in
// 64 bits, but products of them (sequences x state entries x channels x
// bytes) need not: every such product in a plan goes through Count, and a
// plan whose size is not representable is reported as an error instead of
// wrapping to a small number.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shortconv {

// A non-negative int64 quantity that remembers whether any step overflowed.
class Count {
 public:
  constexpr Count() = default;
  constexpr Count(int64_t v) : v_(v), bad_(v < 0) {}  // NOLINT: implicit on purpose

  Count operator*(Count o) const {
    Count r;
    r.bad_ = bad_ || o.bad_ || __builtin_mul_overflow(v_, o.v_, &r.v_);
    return r;
  }
  Count operator+(Count o) const {
    Count r;
    r.bad_ = bad_ || o.bad_ || __builtin_add_overflow(v_, o.v_, &r.v_);
    return r;
  }
  Count& operator*=(Count o) { return *this = *this * o; }
  Count& operator+=(Count o) { return *this = *this + o; }

  bool overflow() const { return bad_; }
  int64_t value() const { return bad_ ? INT64_MAX : v_; }  // saturated
  size_t bytes() const { return size_t(value()); }

 private:
  int64_t v_ = 0;
  bool bad_ = false;
};

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// a rounded up to a multiple of m (a >= 0, m > 0), overflow-checked.
inline Count round_up(Count a, int64_t m) {
  if (a.overflow()) return a;
  return Count(ceil_div(a.value(), m)) * m;
}

// The smaller of two non-negative values: forced tiles larger than the axis
// they cut mean the whole axis (and cannot overflow the tile arithmetic).
constexpr int64_t clamp_tile(int64_t tile, int64_t axis) {
  const int64_t whole = axis > 0 ? axis : 1;
  return tile < whole ? tile : whole;
}

}  // namespace shortconv
