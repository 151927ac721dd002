// The AMX kernel's building blocks, in AVX-512 registers: the sizes its forward
// (_block_window_amx.cpp) and backward (_block_window_amx_backward.cpp) agree on, the
// base-2 exponential and the softmax over rows of scores, loads, stores and transposes,
// the products of a few rows with packed operands, and the packing of key and value blocks
// into the GEMM's operand layouts; and the kernel's two operators.
//
// Dimension letters as in _block_window_amx.cpp.

#pragma once

#include <ATen/ATen.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

namespace attnlab_block_window_amx {

using at::BFloat16;
using at::Tensor;

constexpr int64_t kChunk = 16;  // query blocks per packing round
constexpr int64_t kAlign = 32;  // block size and head dims come in multiples of this
constexpr int64_t kGlobalAlign = 16;  // the global tokens are padded to a multiple of this
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A bias in base 2: -inf stays -inf, a finite one stays finite (a mask of the dtype's
// lowest value, as HuggingFace builds them, must not become -inf).
inline float base2_bias(float bias) {
  return bias == -INFINITY ? bias : std::max(bias * kLog2e, std::numeric_limits<float>::lowest());
}

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// t = whole + f with whole an integer and f in [-0.5, 0.5]: vreduceps gives f = t - round(t)
// exactly, one instruction where a rounding and a subtraction took two (7 % of the softmax's
// time). For -inf or NaN, f and whole are no use (f = 0 for -inf): the callers mask those lanes.
inline __m512 fraction_of(__m512 t) {
  return _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// 2^t for t <= 0 (-inf included), 0 where the result would be subnormal, given
// two_to_fraction(f) = 2^f on [-0.5, 0.5].
template <typename Polynomial>
inline __m512 exp2_nonpositive_with(__m512 t, Polynomial two_to_fraction) {
  const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 f = fraction_of(t);
  return _mm512_maskz_scalef_ps(normal, two_to_fraction(f), _mm512_sub_ps(t, f));
}

// 2^t for t <= 0: 2^f of degree 5, least-squares fit on Chebyshev nodes (relative error 1.1e-7).
inline __m512 exp2_nonpositive(__m512 t) {
  return exp2_nonpositive_with(t, [](__m512 f) {
    __m512 p = _mm512_set1_ps(0.001340043731033802f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009676042012870312f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550327152013779f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402210682630539f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  });
}

// The softmax runs on kRows rows at once: their independent chains keep both vector units
// busy where one row's exp2 and sums would wait on latencies (measured alone: 24 % faster
// than row by row).
constexpr int64_t kRows = 4;
static_assert(kAlign % kRows == 0, "a block's rows come in groups of kRows");

// tops[r] <- the maximum of row r of x (kRows rows of `width`, a multiple of 32).
inline void rows_max(const float* x, int64_t width, float* tops) {
  __m512 m[kRows][2];
  for (int64_t r = 0; r < kRows; ++r) m[r][0] = m[r][1] = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < width; i += 32) {
    for (int64_t r = 0; r < kRows; ++r) {
      m[r][0] = _mm512_max_ps(m[r][0], _mm512_loadu_ps(x + r * width + i));
      m[r][1] = _mm512_max_ps(m[r][1], _mm512_loadu_ps(x + r * width + i + 16));
    }
  }
  for (int64_t r = 0; r < kRows; ++r) tops[r] = _mm512_reduce_max_ps(_mm512_max_ps(m[r][0], m[r][1]));
}

// x <- x * c + bias (base-2 scores); returns their maximum. width: a multiple of 16.
inline float add_bias_row(float* x, const float* bias, int64_t width, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  int64_t i = 0;
  for (; i + 32 <= width; i += 32) {
    const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vc, _mm512_loadu_ps(bias + i));
    const __m512 b = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), vc, _mm512_loadu_ps(bias + i + 16));
    _mm512_storeu_ps(x + i, a);
    _mm512_storeu_ps(x + i + 16, b);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  if (i < width) {
    const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vc, _mm512_loadu_ps(bias + i));
    _mm512_storeu_ps(x + i, a);
    m0 = _mm512_max_ps(m0, a);
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

// For kRows rows of x (of `width`, a multiple of 16): x <- x * c + bias (one bias row for
// all), and tops[r] <- the larger of tops[r] and row r's new maximum.
inline void add_bias_rows(float* x, const float* bias, int64_t width, float c, float* tops) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 m[kRows];
  for (int64_t r = 0; r < kRows; ++r) m[r] = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < width; i += 16) {
    const __m512 b = _mm512_loadu_ps(bias + i);
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * width + i), vc, b);
      _mm512_storeu_ps(x + r * width + i, a);
      m[r] = _mm512_max_ps(m[r], a);
    }
  }
  // std::max keeps a NaN top (vector max would drop it): such a row stays NaN, as row by row.
  for (int64_t r = 0; r < kRows; ++r) tops[r] = std::max(tops[r], _mm512_reduce_max_ps(m[r]));
}

// Two vectors of float32 into 32 consecutive elements.
inline void store_pair(float* out, __m512 a, __m512 b) {
  _mm512_storeu_ps(out, a);
  _mm512_storeu_ps(out + 16, b);
}

inline void store_pair(BFloat16* out, __m512 a, __m512 b) {
  _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

// One vector of float32 into 16 consecutive elements.
inline void store16(float* out, __m512 x) { _mm512_storeu_ps(out, x); }

inline void store16(BFloat16* out, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(x));
}

// 16 consecutive elements as float32.
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }

inline __m512 load16(const BFloat16* x) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The dot product of a and b (width: a multiple of 32), summed in float32.
template <typename T>
inline float dot_row(const T* a, const T* b, int64_t width) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  for (int64_t i = 0; i < width; i += 32) {
    s0 = _mm512_fmadd_ps(load16(a + i), load16(b + i), s0);
    s1 = _mm512_fmadd_ps(load16(a + i + 16), load16(b + i + 16), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// 2^t as exp2_nonpositive, for results rounded to bfloat16: degree 3 (relative error
// 7.7e-5, far below bfloat16's 2^-9). 4 % of the bfloat16 forward at T = 16384.
inline __m512 exp2_nonpositive_coarse(__m512 t) {
  return exp2_nonpositive_with(t, [](__m512 f) {
    __m512 p = _mm512_set1_ps(0.05508868396282196f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24260404706001282f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932762265205383f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999289512634277f));
  });
}

template <typename T>
inline __m512 exp2_for(__m512 t) { return exp2_nonpositive(t); }

template <>
inline __m512 exp2_for<BFloat16>(__m512 t) { return exp2_nonpositive_coarse(t); }

// p <- 2^(x * c - top) (rounded to p's type); returns the sum of the float32 values.
// width: a multiple of 16.
template <typename T>
inline float exp2_row(const float* x, int64_t width, float c, float top, T* p) {
  const __m512 vc = _mm512_set1_ps(c), vtop = _mm512_set1_ps(top);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 32 <= width; i += 32) {
    const __m512 a = exp2_for<T>(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), vc, vtop));
    const __m512 b = exp2_for<T>(_mm512_fmsub_ps(_mm512_loadu_ps(x + i + 16), vc, vtop));
    s0 = _mm512_add_ps(s0, a);
    s1 = _mm512_add_ps(s1, b);
    store_pair(p + i, a, b);
  }
  if (i < width) {
    const __m512 a = exp2_for<T>(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), vc, vtop));
    s0 = _mm512_add_ps(s0, a);
    store16(p + i, a);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// Row r of p <- 2^(x * c - tops[r]) for kRows rows of `width` (a multiple of 32; p rounded
// to its type), and where `global_width` (a multiple of 16) is not 0, row r of global_p <-
// 2^(global_x - tops[r]) (scores already scaled); sums[r] <- the sum of row r's float32
// values, both parts. A top of -inf is taken as 0 (the caller zeroes such rows).
template <typename T>
inline void exp2_rows(const float* x, int64_t width, float c, const float* tops, T* p, float* sums,
                      const float* global_x = nullptr, int64_t global_width = 0, T* global_p = nullptr) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 top[kRows], sum[kRows][2];
  for (int64_t r = 0; r < kRows; ++r) {
    top[r] = _mm512_set1_ps(tops[r] == -INFINITY ? 0.0f : tops[r]);
    sum[r][0] = sum[r][1] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < width; i += 32) {
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512 a = exp2_for<T>(_mm512_fmsub_ps(_mm512_loadu_ps(x + r * width + i), vc, top[r]));
      const __m512 b = exp2_for<T>(_mm512_fmsub_ps(_mm512_loadu_ps(x + r * width + i + 16), vc, top[r]));
      sum[r][0] = _mm512_add_ps(sum[r][0], a);
      sum[r][1] = _mm512_add_ps(sum[r][1], b);
      store_pair(p + r * width + i, a, b);
    }
  }
  for (int64_t i = 0; i < global_width; i += 16) {
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512 a = exp2_for<T>(_mm512_sub_ps(_mm512_loadu_ps(global_x + r * global_width + i), top[r]));
      sum[r][0] = _mm512_add_ps(sum[r][0], a);
      store16(global_p + r * global_width + i, a);
    }
  }
  for (int64_t r = 0; r < kRows; ++r) sums[r] = _mm512_reduce_add_ps(_mm512_add_ps(sum[r][0], sum[r][1]));
}

// out <- x * factor (rounded to out's type).
template <typename T>
inline void scale_row(const float* x, int64_t width, float factor, T* out) {
  const __m512 vf = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < width; i += 32) {
    const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), vf);
    const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), vf);
    store_pair(out + i, a, b);
  }
}

// Transposes a 16 x 16 matrix of 32-bit elements held one row per register.
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of elements
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: 8 x 8, then 16 x 16
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// One step of a dot product: acc + row's unit u times a vector of packed units. bfloat16
// units are pairs (vdpbf16ps), float32 units single elements (FMA).
inline __m512 multiply_add(__m512 acc, const BFloat16* row, int64_t u, __m512 packed) {
  int32_t bits;
  std::memcpy(&bits, row + 2 * u, sizeof(bits));  // the pair as one 32-bit unit
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(bits), (__m512bh)packed);
}

inline __m512 multiply_add(__m512 acc, const float* row, int64_t u, __m512 packed) {
  return _mm512_fmadd_ps(_mm512_set1_ps(row[u]), packed, acc);
}

// For R rows (`depth` elements apart): out row r, [0, 16 V) (+)= the sum over units u of
// row r's unit u times packed unit row u, columns [col, col + 16 V) (ld columns per unit
// row). Each packed vector is read once for all R rows.
template <int R, int V, typename T>
inline void dot_columns(const T* rows, int64_t depth, const T* packed, int64_t ld, int64_t col, float* out,
                        int64_t out_stride, bool accumulate) {
  constexpr int64_t per_unit = 4 / sizeof(T);
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t u = 0; u < depth / per_unit; ++u) {
    const T* at = packed + (u * ld + col) * per_unit;
    for (int v = 0; v < V; ++v) {
      const __m512 vector = _mm512_loadu_ps(reinterpret_cast<const float*>(at + v * 16 * per_unit));
      for (int r = 0; r < R; ++r) acc[r][v] = multiply_add(acc[r][v], rows + r * depth, u, vector);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) {
      float* to = out + r * out_stride + v * 16;
      _mm512_storeu_ps(to, accumulate ? _mm512_add_ps(acc[r][v], _mm512_loadu_ps(to)) : acc[r][v]);
    }
  }
}

// R rows times packed, columns [0, width) (width a multiple of 16; out rows `out_stride`
// apart): V vectors of columns at a time, then narrower ones for the rest.
template <int R, int V, typename T>
void rows_times_packed_columns(const T* rows, int64_t depth, const T* packed, int64_t ld, int64_t width,
                               float* out, int64_t out_stride, bool accumulate) {
  int64_t col = 0;
  for (; col + 16 * V <= width; col += 16 * V) {
    dot_columns<R, V>(rows, depth, packed, ld, col, out + col, out_stride, accumulate);
  }
  if constexpr (V > 1) {
    if (col < width) rows_times_packed_columns<R, V / 2>(rows, depth, packed + col * (4 / sizeof(T)), ld,
                                                         width - col, out + col, out_stride, accumulate);
  }
}

// out [count, width] (+)= rows [count, depth] times packed [depth / per_unit units, ld
// columns] (its first `width`): the global tokens' rows against a chunk's packed keys
// (depth D, width its columns), then their probabilities against its packed values (depth
// the columns, width Dv). For these few rows, AMX's 16-row tiles would mostly multiply
// padding: dot products in vector registers, up to 8 rows at a time so that each packed
// vector is read once for all of them, take about 40 % less time (measured with two global
// tokens at T = 16384). With hundreds of rows the tiles win: the global keys' products over
// a chunk's 2048 queries took 1.6-1.9x longer this way. width: a multiple of 16; depth: even.
template <typename T>
void rows_times_packed(const T* rows, int64_t count, int64_t depth, const T* packed, int64_t ld,
                       int64_t width, float* out, bool accumulate) {
  int64_t g = 0;
  for (; g + 8 <= count; g += 8) {
    rows_times_packed_columns<8, 2>(rows + g * depth, depth, packed, ld, width, out + g * width, width,
                                    accumulate);
  }
  const T* from = rows + g * depth;
  float* to = out + g * width;
  switch (count - g) {
    case 7: rows_times_packed_columns<7, 2>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 6: rows_times_packed_columns<6, 2>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 5: rows_times_packed_columns<5, 2>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 4: rows_times_packed_columns<4, 4>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 3: rows_times_packed_columns<3, 4>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 2: rows_times_packed_columns<2, 4>(from, depth, packed, ld, width, to, width, accumulate); break;
    case 1: rows_times_packed_columns<1, 4>(from, depth, packed, ld, width, to, width, accumulate); break;
    default: break;
  }
}

// Keys [rows, D] -> the right operand of Q K^T: in bfloat16 the VNNI layout [D / 2, rows, 2]
// (a transpose of bfloat16 pairs), in float32 K^T [D, rows]; either way a transpose of
// 32-bit units, 16 x 16 at a time. Rows from `valid` on are zeros. ld: the packed row count.
template <typename T>
void pack_keys(const T* keys, int64_t rows, int64_t valid, int64_t D, int64_t ld, T* packed) {
  const int64_t pairs = D * static_cast<int64_t>(sizeof(T)) / 4;  // 32-bit units per key
  const uint32_t* source = reinterpret_cast<const uint32_t*>(keys);
  uint32_t* target = reinterpret_cast<uint32_t*>(packed);
  __m512i tile[16];
  for (int64_t r = 0; r < rows; r += 16) {
    for (int64_t d = 0; d < pairs; d += 16) {
      for (int i = 0; i < 16; ++i) {
        tile[i] = r + i < valid ? _mm512_loadu_si512(source + (r + i) * pairs + d) : _mm512_setzero_si512();
      }
      transpose_16x16(tile);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(target + (d + i) * ld + r, tile[i]);
    }
  }
}

// Values [rows, Dv] -> the right operand of P V: in bfloat16 the VNNI layout [rows / 2, Dv, 2]
// (rows interleaved in pairs), in float32 as they are. Rows from `valid` on are zeros.
// rows: even; Dv: a multiple of 16.
inline void pack_values(const float* values, int64_t rows, int64_t valid, int64_t Dv, float* packed) {
  const int64_t copied = std::min(rows, valid) * Dv;
  std::memcpy(packed, values, copied * sizeof(float));
  std::memset(packed + copied, 0, (rows * Dv - copied) * sizeof(float));
}

inline void pack_values(const BFloat16* values, int64_t rows, int64_t valid, int64_t Dv, BFloat16* packed) {
  const __m512i low = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_set_epi16(
      63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
      55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t r = 0; r < rows; r += 2) {
    const BFloat16* first = values + r * Dv;
    BFloat16* target = packed + r * Dv;
    int64_t d = 0;
    for (; d + 32 <= Dv; d += 32) {
      const __m512i a = r < valid ? _mm512_loadu_si512(first + d) : zero;
      const __m512i b = r + 1 < valid ? _mm512_loadu_si512(first + Dv + d) : zero;
      _mm512_storeu_si512(target + 2 * d, _mm512_permutex2var_epi16(a, low, b));
      _mm512_storeu_si512(target + 2 * d + 32, _mm512_permutex2var_epi16(a, high, b));
    }
    if (d < Dv) {  // the last 16 columns: their 32 interleaved elements
      const __m512i a = r < valid ? _mm512_maskz_loadu_epi16(0xFFFF, first + d) : zero;
      const __m512i b = r + 1 < valid ? _mm512_maskz_loadu_epi16(0xFFFF, first + Dv + d) : zero;
      _mm512_storeu_si512(target + 2 * d, _mm512_permutex2var_epi16(a, low, b));
    }
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> block_window_forward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& global_keys, const Tensor& global_values, const Tensor& global_bias,
    const Tensor& global_queries, const Tensor& key_bias, double scale);

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> block_window_backward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& grad_output, const Tensor& output, const Tensor& logsumexp,
    const Tensor& global_keys, const Tensor& global_values, const Tensor& global_bias,
    const Tensor& global_queries, const Tensor& global_grad_output, const Tensor& global_row_term,
    const Tensor& global_logsumexp, const Tensor& key_bias, double scale);

}  // namespace attnlab_block_window_amx
