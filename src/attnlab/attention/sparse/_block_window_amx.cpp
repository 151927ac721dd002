// Block-sparse attention on CPUs with AMX, forward and backward, in bfloat16 and float32.
//
// Dimension letters as in _block_window_kernel.py: L block size, D (Dv) head dim of keys
// (values), W = spread * L window keys, G global keys (Gp: G rounded up to 16), n blocks.
//
// Why a kernel of our own: torch's fused CPU attention splits a 128-query block into 32-row
// pieces and repacks each block's keys for every window that holds them, so its matrix
// products run far below the GEMM units' speed here. Here every query block is one 128-row
// product over its whole window, built on torch's batch-reduce GEMM (oneDNN: AMX tiles in
// bfloat16, AVX-512 in float32), and the softmax is one pass in base 2.
//
// Forward. Each thread walks a contiguous range of query blocks in chunks of kChunk: it
// packs the key and value blocks the chunk's windows cover (kChunk + spread - 1 of them;
// bfloat16 in the VNNI layout, float32 keys transposed) into a buffer that stays in cache,
// then for each block: S = Q K^T over the window (one GEMM), the softmax into probabilities
// P with the log-sum-exp, O = P V (one GEMM). The global keys are one GEMM per chunk and
// head on each side (their scores join each row's softmax), and the global tokens' own
// rows, which attend every key, keep a running softmax per thread over the chunks' own key
// blocks, merged at the end. Key blocks outside the source tensor are packed as zeros; the
// window bias removes them, as it removes every key a block may not attend.
//
// Backward: see backward_blocks.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

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

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

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
void pack_values(const float* values, int64_t rows, int64_t valid, int64_t Dv, float* packed) {
  const int64_t copied = std::min(rows, valid) * Dv;
  std::memcpy(packed, values, copied * sizeof(float));
  std::memset(packed + copied, 0, (rows * Dv - copied) * sizeof(float));
}

void pack_values(const BFloat16* values, int64_t rows, int64_t valid, int64_t Dv, BFloat16* packed) {
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

template <typename T>
std::tuple<Tensor, Tensor, Tensor, Tensor> forward_blocks(
    const Tensor& query,  // [n, L, D]
    const Tensor& key_source,  // [S, L, D]: window i is source blocks i + shift .. + spread
    const Tensor& value_source,  // [Sv, L, Dv]: window i is source blocks i + value_shift ..
    int64_t shift,
    int64_t value_shift,
    int64_t spread,
    int64_t heads,  // H: block i is block i % N of head i / N; its bias row (i / (H N)) N + i % N
    int64_t blocks,  // N
    const Tensor& window_bias,  // [B N, W] float32
    const Tensor& biased,  // [B N] bool: whether the row's window bias has anything but zeros
    const Tensor& global_keys,  // [B H, G, D]
    const Tensor& global_values,  // [B H, G, Dv]
    const Tensor& global_bias,  // [B N, G] float32
    const Tensor& global_queries,  // [B H, G, D]: the global tokens' queries, which attend every key
    const Tensor& key_bias,  // [B, N L] float32: every key's bias for them
    double scale) {
  constexpr auto dtype = c10::CppTypeToScalarType<T>::value;
  constexpr int64_t per_unit = 4 / sizeof(T);  // elements per 32-bit unit of the packed keys
  TORCH_CHECK(key_source.scalar_type() == dtype && value_source.scalar_type() == dtype &&
              global_keys.scalar_type() == dtype && global_values.scalar_type() == dtype &&
              global_queries.scalar_type() == dtype,
              "block_window_forward: queries, keys, values and global tokens of one dtype");
  TORCH_CHECK(query.is_contiguous() && key_source.is_contiguous() && value_source.is_contiguous() &&
              window_bias.is_contiguous() && biased.is_contiguous() && global_keys.is_contiguous() &&
              global_values.is_contiguous() && global_bias.is_contiguous() &&
              global_queries.is_contiguous() &&
              key_bias.is_contiguous(),
              "block_window_forward: contiguous inputs only");
  TORCH_CHECK(window_bias.scalar_type() == at::kFloat && global_bias.scalar_type() == at::kFloat &&
              key_bias.scalar_type() == at::kFloat &&
              biased.scalar_type() == at::kBool, "block_window_forward: float32 biases, bool rows");
  const int64_t n = query.size(0), L = query.size(1), D = query.size(2);
  const int64_t S = key_source.size(0), Sv = value_source.size(0), Dv = value_source.size(2);
  const int64_t G = global_keys.size(1);
  const int64_t W = spread * L, Gp = round_up(G, kGlobalAlign);
  TORCH_CHECK(L % kAlign == 0 && D % kAlign == 0 && Dv % kAlign == 0,
              "block_window_forward: block size and head dims must be multiples of 32");
  TORCH_CHECK(scale > 0 && spread % 2 == 1, "block_window_forward: a positive scale and an odd spread only");
  TORCH_CHECK(heads > 0 && blocks > 0 && n % (heads * blocks) == 0 && window_bias.size(0) == n / heads &&
              biased.numel() == window_bias.size(0) && global_bias.size(0) == window_bias.size(0),
              "block_window_forward: heads and blocks do not match the queries and biases");
  TORCH_CHECK(key_source.size(1) == L && key_source.size(2) == D && value_source.size(1) == L &&
              global_keys.size(0) == n / blocks && global_keys.size(2) == D &&
              global_values.size(0) == n / blocks && global_values.size(1) == G &&
              global_values.size(2) == Dv && global_queries.size(0) == n / blocks &&
              global_queries.size(2) == D && key_bias.size(0) * heads * blocks == n,
              "block_window_forward: key, value and global shapes do not match the queries");
  TORCH_CHECK(window_bias.size(1) == W && global_bias.size(1) == G && n % blocks == 0 &&
              global_queries.size(1) == G && key_bias.size(1) == blocks * L,
              "block_window_forward: bias shapes do not match");

  auto output = at::empty({n, L, Dv}, query.options());
  auto logsumexp = at::empty({n, L}, query.options().dtype(at::kFloat));
  const int64_t heads_total = n / blocks;  // B H

  // The global keys and values of every head, packed once (bfloat16: [B H, D / 2, Gp, 2] and
  // [B H, Gp / 2, Dv, 2]; float32: [B H, D, Gp] and [B H, Gp, Dv]).
  auto packed_global_keys = at::empty({heads_total, D * Gp}, query.options());
  auto packed_global_values = at::empty({heads_total, Gp * Dv}, query.options());
  if (G) {
    at::parallel_for(0, heads_total, 1, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) {
        pack_keys(global_keys.data_ptr<T>() + h * G * D, Gp, G, D, Gp,
                  packed_global_keys.data_ptr<T>() + h * D * Gp);
        pack_values(global_values.data_ptr<T>() + h * G * Dv, Gp, G, Dv,
                    packed_global_values.data_ptr<T>() + h * Gp * Dv);
      }
    });
  }

  // The global rows: each thread keeps a running softmax (max, sum, weighted values) per
  // head and global row over the key blocks it meets (block i's own keys, once each),
  // merged after the parallel loop.
  // Each thread's state covers only the heads of its blocks ([first_head, first_head + heads)).
  struct RowState {
    int64_t first_head = 0, heads = 0;
    std::vector<float> top, sum, values;  // [heads, G], [heads, G], [heads, G, Dv]
  };
  std::vector<RowState> row_states(at::get_num_threads());
  const T* global_q = global_queries.data_ptr<T>();
  const float* key_bias_data = key_bias.data_ptr<float>();

  const T* q = query.data_ptr<T>();
  const T* k = key_source.data_ptr<T>();
  const T* v = value_source.data_ptr<T>();
  const float* window_bias_data = window_bias.data_ptr<float>();
  const bool* biased_data = biased.data_ptr<bool>();
  const float* global_bias_data = global_bias.data_ptr<float>();
  const T* global_k = packed_global_keys.data_ptr<T>();
  const T* global_v = packed_global_values.data_ptr<T>();
  T* out = output.data_ptr<T>();
  float* lse = logsumexp.data_ptr<float>();
  const float c = static_cast<float>(scale) * kLog2e;  // scores in base 2

  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    const int64_t packed_blocks = kChunk + spread - 1, packed_columns = packed_blocks * L;
    const int64_t chunk_rows = kChunk * L, own_offset = (spread - 1) / 2;  // a block's own keys in its window
    std::vector<T> packed_keys(packed_blocks * L * D), packed_values(packed_blocks * L * Dv);
    std::vector<float> scores(L * W), window_row_bias(W), global_row_bias(Gp);
    std::vector<T> probs(L * W);
    // Per chunk: the global keys' scores and probabilities, the weighted values, 1 / sum per row.
    std::vector<float> global_scores(chunk_rows * Gp), accumulator(chunk_rows * Dv), inverse(chunk_rows);
    std::vector<T> global_probs(chunk_rows * Gp);
    // The global rows over the chunk's own keys.
    std::vector<float> row_scores(G * chunk_rows), own_key_bias(chunk_rows);
    std::vector<T> row_probs(G * chunk_rows);
    TORCH_CHECK(at::get_thread_num() < static_cast<int64_t>(row_states.size()),
                "block_window_forward: more threads than torch reports");
    RowState& state = row_states[at::get_thread_num()];
    if (G) {
      state.first_head = begin / blocks;
      state.heads = (end - 1) / blocks - state.first_head + 1;
      state.top.assign(state.heads * G, -INFINITY);
      state.sum.assign(state.heads * G, 0.0f);
      state.values.assign(state.heads * G * Dv, 0.0f);
    }
    float* row_top = state.top.data();
    float* row_sum = state.sum.data();
    float* row_values = state.values.data();

    for (int64_t chunk = begin; chunk < end; chunk += kChunk) {
      const int64_t chunk_end = std::min(end, chunk + kChunk);
      for (int64_t t = 0; t < chunk_end - chunk + spread - 1; ++t) {
        const int64_t source = chunk + shift + t, value_source_block = chunk + value_shift + t;
        const bool inside = source >= 0 && source < S;
        const bool value_inside = value_source_block >= 0 && value_source_block < Sv;
        pack_keys(inside ? k + source * L * D : k, L, inside ? L : 0, D, packed_columns,
                  packed_keys.data() + t * L * per_unit);  // columns t L .. of the packed keys
        pack_values(value_inside ? v + value_source_block * L * Dv : v, L, value_inside ? L : 0, Dv,
                    packed_values.data() + t * L * Dv);
      }
      // The chunk's blocks by head: [segment, segment_end) share head `segment / blocks`.
      std::vector<int64_t> segments{chunk};
      for (int64_t i = chunk + 1; i < chunk_end; ++i) {
        if (i % blocks == 0) segments.push_back(i);
      }
      segments.push_back(chunk_end);
      if (G) {  // every query of the chunk against its head's global keys
        for (size_t a = 0; a + 1 < segments.size(); ++a) {
          const int64_t from = segments[a], rows = (segments[a + 1] - from) * L;
          at::native::cpublas::brgemm(rows, Gp, D, D, Gp, Gp, false, q + from * L * D,
                                      global_k + (from / blocks) * D * Gp,
                                      global_scores.data() + (from - chunk) * L * Gp);
        }
      }

      for (int64_t i = chunk; i < chunk_end; ++i) {
        const int64_t first = i - chunk;  // the window's first packed block
        const int64_t row = (i / (heads * blocks)) * blocks + i % blocks;  // its bias row
        at::native::cpublas::brgemm(L, W, D, D, packed_columns, W, false, q + i * L * D,
                                    packed_keys.data() + first * L * per_unit, scores.data());
        // Biases in base 2, like the scores: the window's only where it has any, the global
        // keys' always (their padding columns are -inf).
        const bool window_biased = biased_data[row];
        if (window_biased) {
          const float* bias = window_bias_data + row * W;
          for (int64_t x = 0; x < W; ++x) window_row_bias[x] = base2_bias(bias[x]);
        }
        for (int64_t g = 0; g < Gp; ++g) {
          global_row_bias[g] = g < G ? base2_bias(global_bias_data[row * G + g]) : -INFINITY;
        }
        const float window_c = window_biased ? 1.0f : c;  // biased scores are scaled in place
        for (int64_t r0 = 0; r0 < L; r0 += kRows) {  // kRows rows at a time
          float* lines = scores.data() + r0 * W;
          float tops[kRows], sums[kRows];
          const int64_t global_at = (first * L + r0) * Gp;
          if (window_biased) {
            std::fill(tops, tops + kRows, -INFINITY);
            add_bias_rows(lines, window_row_bias.data(), W, c, tops);
          } else {
            rows_max(lines, W, tops);
            for (int64_t r = 0; r < kRows; ++r) tops[r] *= c;
          }
          if (G) add_bias_rows(global_scores.data() + global_at, global_row_bias.data(), Gp, c, tops);
          exp2_rows(lines, W, window_c, tops, probs.data() + r0 * W, sums, global_scores.data() + global_at,
                    G ? Gp : 0, global_probs.data() + global_at);
          for (int64_t r = r0; r < r0 + kRows; ++r) {
            const int64_t at = first * L + r;  // row of the chunk
            const float top = tops[r - r0];
            // A top of -inf: no key (or NaN scores, which max may drop: the row is not trusted).
            const float sum = top == -INFINITY ? 0.0f : sums[r - r0];
            if (sum == 0.0f) {  // no key: probabilities, output and weight 0
              std::memset(probs.data() + r * W, 0, W * sizeof(T));
              if (G) std::memset(global_probs.data() + at * Gp, 0, Gp * sizeof(T));
              lse[i * L + r] = -INFINITY;
              inverse[at] = 0.0f;
            } else {
              lse[i * L + r] = (top + std::log2(sum)) * kLn2;
              inverse[at] = 1.0f / sum;
            }
          }
        }
        at::native::cpublas::brgemm(L, Dv, W, W, Dv, Dv, false, probs.data(),
                                    packed_values.data() + first * L * Dv,
                                    accumulator.data() + first * L * Dv);
      }

      for (size_t a = 0; G && a + 1 < segments.size(); ++a) {  // + the global keys' values
        const int64_t from = segments[a], rows = (segments[a + 1] - from) * L;
        at::native::cpublas::brgemm(rows, Dv, Gp, Gp, Dv, Dv, true,
                                    global_probs.data() + (from - chunk) * L * Gp,
                                    global_v + (from / blocks) * Gp * Dv,
                                    accumulator.data() + (from - chunk) * L * Dv);
      }
      for (int64_t at = 0; at < (chunk_end - chunk) * L; ++at) {
        scale_row(accumulator.data() + at * Dv, Dv, inverse[at], out + (chunk * L + at) * Dv);
      }

      for (size_t a = 0; G && a + 1 < segments.size(); ++a) {  // the global rows over the chunk's own keys
        const int64_t from = segments[a], columns = (segments[a + 1] - from) * L, head = from / blocks;
        const int64_t slot = (head - state.first_head) * G;
        const int64_t own = from - chunk + own_offset;  // packed block of block `from`'s own keys
        rows_times_packed(global_q + head * G * D, G, D, packed_keys.data() + own * L * per_unit,
                          packed_columns, columns, row_scores.data(), false);
        const float* bias = key_bias_data + (from / (heads * blocks)) * blocks * L + (from % blocks) * L;
        for (int64_t x = 0; x < columns; ++x) own_key_bias[x] = base2_bias(bias[x]);
        for (int64_t g = 0; g < G; ++g) {
          float* line = row_scores.data() + g * columns;
          T* p = row_probs.data() + g * columns;
          const float top = std::max(row_top[slot + g], add_bias_row(line, own_key_bias.data(), columns, c));
          if (top == -INFINITY) {  // no key so far
            std::memset(p, 0, columns * sizeof(T));
            continue;
          }
          const float factor = std::exp2(row_top[slot + g] - top);  // 0 from -inf
          row_sum[slot + g] = row_sum[slot + g] * factor + exp2_row(line, columns, 1.0f, top, p);
          row_top[slot + g] = top;
          float* values_row = row_values + (slot + g) * Dv;
          for (int64_t d = 0; d < Dv; ++d) values_row[d] *= factor;
        }
        rows_times_packed(row_probs.data(), G, columns, packed_values.data() + own * L * Dv, Dv, Dv,
                          row_values + slot * Dv, true);
      }
    }
    at::native::cpublas::brgemm_release();
  });

  auto global_output = at::empty({heads_total, G, Dv}, query.options());
  auto global_logsumexp = at::empty({heads_total, G}, query.options().dtype(at::kFloat));
  T* global_out = global_output.data_ptr<T>();
  float* global_lse = global_logsumexp.data_ptr<float>();
  std::vector<float> merged(Dv);
  for (int64_t row = 0; row < heads_total * G; ++row) {
    const int64_t head = row / G, g = row % G;
    float top = -INFINITY, sum = 0.0f;
    for (const RowState& state : row_states) {
      if (head >= state.first_head && head < state.first_head + state.heads) {
        top = std::max(top, state.top[(head - state.first_head) * G + g]);
      }
    }
    std::fill(merged.begin(), merged.end(), 0.0f);
    for (const RowState& state : row_states) {
      if (top == -INFINITY || head < state.first_head || head >= state.first_head + state.heads) continue;
      const int64_t at = (head - state.first_head) * G + g;
      const float factor = std::exp2(state.top[at] - top);  // 0 from -inf
      sum += state.sum[at] * factor;
      for (int64_t d = 0; d < Dv; ++d) merged[d] += state.values[at * Dv + d] * factor;
    }
    global_lse[row] = sum == 0.0f ? -INFINITY : (top + std::log2(sum)) * kLn2;  // no key: output 0
    scale_row(merged.data(), Dv, sum == 0.0f ? 0.0f : 1.0f / sum, global_out + row * Dv);
  }
  return {output, logsumexp, global_output, global_logsumexp};
}

// Bfloat16 rows [D / 2, cols, 2] (VNNI pairs) -> [D, ld]: each pair of rows de-interleaved.
// cols: a multiple of 16.
void unpack_pairs(const BFloat16* packed, int64_t D, int64_t cols, int64_t ld, BFloat16* out) {
  alignas(64) int16_t even_index[32], odd_index[32];
  for (int i = 0; i < 32; ++i) {
    even_index[i] = static_cast<int16_t>(2 * i);
    odd_index[i] = static_cast<int16_t>(2 * i + 1);
  }
  const __m512i even = _mm512_load_si512(even_index), odd = _mm512_load_si512(odd_index);
  for (int64_t pair = 0; pair < D / 2; ++pair) {
    const BFloat16* source = packed + pair * cols * 2;
    int64_t x = 0;
    for (; x + 32 <= cols; x += 32) {
      const __m512i a = _mm512_loadu_si512(source + 2 * x), b = _mm512_loadu_si512(source + 2 * x + 32);
      _mm512_storeu_si512(out + 2 * pair * ld + x, _mm512_permutex2var_epi16(a, even, b));
      _mm512_storeu_si512(out + (2 * pair + 1) * ld + x, _mm512_permutex2var_epi16(a, odd, b));
    }
    if (x < cols) {  // the last 16 columns: the low halves
      const __m512i a = _mm512_loadu_si512(source + 2 * x), b = _mm512_setzero_si512();
      _mm512_mask_storeu_epi16(out + 2 * pair * ld + x, 0xFFFF, _mm512_permutex2var_epi16(a, even, b));
      _mm512_mask_storeu_epi16(out + (2 * pair + 1) * ld + x, 0xFFFF, _mm512_permutex2var_epi16(a, odd, b));
    }
  }
}

// Rows [rows, D] -> their transpose [D, ld] (columns from `valid` on are zeros).
void transpose_rows(const float* x, int64_t rows, int64_t valid, int64_t D, int64_t ld, float* out,
                    float* /*scratch*/) {
  pack_keys(x, rows, valid, D, ld, out);  // in float32 the packed keys are K^T
}

void transpose_rows(const BFloat16* x, int64_t rows, int64_t valid, int64_t D, int64_t ld, BFloat16* out,
                    BFloat16* scratch) {
  pack_keys(x, rows, valid, D, rows, scratch);  // [D / 2, rows, 2]
  unpack_pairs(scratch, D, rows, ld, out);
}

// x [rows, cols] as the right operand of a product (float32: itself; bfloat16: VNNI in scratch).
const float* right_operand(const float* x, int64_t, int64_t, float*) { return x; }

const BFloat16* right_operand(const BFloat16* x, int64_t rows, int64_t cols, BFloat16* scratch) {
  pack_values(x, rows, rows, cols, scratch);
  return scratch;
}

// out [L, D] <- the transpose of x [D, L] (float32), rounded to out's type.
template <typename T>
void store_transposed(const float* x, int64_t D, int64_t L, T* out) {
  __m512i tile[16];
  for (int64_t l = 0; l < L; l += 16) {  // 16 whole rows of out at a time: each cache line written once
    for (int64_t d = 0; d < D; d += 16) {
      for (int i = 0; i < 16; ++i) tile[i] = _mm512_loadu_si512(x + (d + i) * L + l);
      transpose_16x16(tile);
      for (int i = 0; i < 16; ++i) store16(out + (l + i) * D + d, _mm512_castsi512_ps(tile[i]));
    }
  }
}

// The softmax backward on rows of P^T: for row x (one key) and column y (one query),
// p = 2^(s c + bias[x] - lse2[y]) and ds = scale p (dp - term[y]), rounded to T. bias:
// base 2, one per row (nullptr: none); lse2 in base 2, +inf where a query has no key or
// is replaced (its probabilities are 0). width: a multiple of 16.
template <typename T>
void softmax_backward_rows(const float* scores, const float* probs_grad, int64_t rows, int64_t width,
                           const float* bias, const float* lse2, const float* term, float c, float scale,
                           T* probs, T* scores_grad) {
  const __m512 vc = _mm512_set1_ps(c), vs = _mm512_set1_ps(scale);
  for (int64_t x = 0; x < rows; ++x) {
    const float b = bias ? bias[x] : 0.0f;
    T* p_row = probs + x * width;
    T* ds_row = scores_grad + x * width;
    if (b == -INFINITY) {  // a key the rows may not attend
      std::memset(p_row, 0, width * sizeof(T));
      std::memset(ds_row, 0, width * sizeof(T));
      continue;
    }
    const __m512 vb = _mm512_set1_ps(b);
    const float* s_row = scores + x * width;
    const float* dp_row = probs_grad + x * width;
    for (int64_t y = 0; y < width; y += 16) {
      const __m512 t = _mm512_sub_ps(_mm512_fmadd_ps(_mm512_loadu_ps(s_row + y), vc, vb),
                                     _mm512_loadu_ps(lse2 + y));
      const __m512 p = exp2_nonpositive(t);
      const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, vs),
                                      _mm512_sub_ps(_mm512_loadu_ps(dp_row + y), _mm512_loadu_ps(term + y)));
      store16(p_row + y, p);
      store16(ds_row + y, ds);
    }
  }
}

// The global tokens' gradients summed by one thread over the heads of its blocks
// ([first_head, first_head + heads)), merged after the parallel loop: their keys' and
// values' [heads, Gp, D|Dv] and their rows' queries' (transposed) [heads, D, Gp], float32.
struct GlobalGradients {
  int64_t first_head = 0, heads = 0;
  std::vector<float> keys, values, queries_t;
};

// The gradients of block-sparse attention, given the forward's output and log-sum-exp:
// the window keys', the global keys' and the global tokens' rows' parts. Everything is
// computed key-major; for block i and its window keys:
//   S^T = K Q^T, P^T = 2^(S^T c + bias - lse), dP^T = V dO^T, dS^T = scale P^T (dP^T - rowsum(dO O)),
//   dV += P^T dO, dK += dS^T Q, dQ^T = K^T dS^T,
// so that only the small [L, D] blocks of Q and dO are transposed, never a [W, L] matrix.
// The global keys are Gp more rows of the same products (their dK, dV summed per head);
// the global tokens' rows, which attend every key, are Gp more queries of each block's own
// keys (their dQ summed per head). Window i adds to the key blocks i - w .. i + w: each
// chunk of C >= 2 * 2 w query blocks sums its windows' key and value gradients in a float32
// buffer of its own (C + 2 w blocks, in cache), writes the blocks no other chunk reaches
// straight to the output, and leaves the 2 w blocks it shares with each neighbour in edge
// buffers, added up after the parallel loop.
template <typename T>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_blocks(
    const Tensor& query,  // [n, L, D]
    const Tensor& key_source,  // [S, L, D]: window i is source blocks i + shift .. + spread
    const Tensor& value_source,  // [Sv, L, Dv]
    int64_t shift,
    int64_t value_shift,
    int64_t spread,
    int64_t heads,
    int64_t blocks,
    const Tensor& window_bias,  // [B N, W] float32
    const Tensor& biased,  // [B N] bool
    const Tensor& grad_output,  // [n, L, Dv]
    const Tensor& output,  // [n, L, Dv]
    const Tensor& logsumexp,  // [n, L] float32: -inf where a row has no key, +inf where it is replaced
    const Tensor& global_keys,  // [B H, G, D]
    const Tensor& global_values,  // [B H, G, Dv]
    const Tensor& global_bias,  // [B N, G] float32
    const Tensor& global_queries,  // [B H, G, D]: the global tokens' queries
    const Tensor& global_grad_output,  // [B H, G, Dv]: their rows' output gradient
    const Tensor& global_row_term,  // [B H, G] float32: rowsum(dO O) of their rows
    const Tensor& global_logsumexp,  // [B H, G] float32: their rows' log-sum-exp
    const Tensor& key_bias,  // [B, N L] float32: every key's bias for them
    double scale) {
  constexpr auto dtype = c10::CppTypeToScalarType<T>::value;
  TORCH_CHECK(key_source.scalar_type() == dtype && value_source.scalar_type() == dtype &&
              grad_output.scalar_type() == dtype && output.scalar_type() == dtype &&
              global_keys.scalar_type() == dtype && global_values.scalar_type() == dtype &&
              global_queries.scalar_type() == dtype && global_grad_output.scalar_type() == dtype,
              "block_window_backward: queries, keys, values, global tokens and gradients of one dtype");
  for (const Tensor* x : {&query, &key_source, &value_source, &window_bias, &biased, &grad_output, &output,
                          &logsumexp, &global_keys, &global_values, &global_bias, &global_queries,
                          &global_grad_output, &global_row_term, &global_logsumexp, &key_bias}) {
    TORCH_CHECK(x->is_contiguous(), "block_window_backward: contiguous inputs only");
  }
  TORCH_CHECK(window_bias.scalar_type() == at::kFloat && logsumexp.scalar_type() == at::kFloat &&
              global_bias.scalar_type() == at::kFloat && global_row_term.scalar_type() == at::kFloat &&
              global_logsumexp.scalar_type() == at::kFloat && key_bias.scalar_type() == at::kFloat &&
              biased.scalar_type() == at::kBool, "block_window_backward: float32 biases and sums, bool rows");
  const int64_t n = query.size(0), L = query.size(1), D = query.size(2);
  const int64_t S = key_source.size(0), Sv = value_source.size(0), Dv = value_source.size(2);
  const int64_t W = spread * L, w = (spread - 1) / 2, G = global_keys.size(1), Gp = round_up(G, kGlobalAlign);
  TORCH_CHECK(L % kAlign == 0 && D % kAlign == 0 && Dv % kAlign == 0,
              "block_window_backward: block size and head dims must be multiples of 32");
  TORCH_CHECK(scale > 0 && spread % 2 == 1, "block_window_backward: a positive scale and an odd spread only");
  TORCH_CHECK(heads > 0 && blocks > 0 && n % (heads * blocks) == 0 && window_bias.size(0) == n / heads &&
              biased.numel() == window_bias.size(0) && global_bias.size(0) == window_bias.size(0),
              "block_window_backward: heads and blocks do not match the queries and biases");
  const int64_t heads_total = n / blocks;  // B H
  TORCH_CHECK(key_source.size(1) == L && key_source.size(2) == D && value_source.size(1) == L &&
              grad_output.size(0) == n && grad_output.size(1) == L && grad_output.size(2) == Dv &&
              output.sizes() == grad_output.sizes() && logsumexp.size(0) == n && logsumexp.size(1) == L &&
              window_bias.size(1) == W && global_keys.size(0) == heads_total && global_keys.size(2) == D &&
              global_values.size(0) == heads_total && global_values.size(1) == G &&
              global_values.size(2) == Dv && global_queries.sizes() == global_keys.sizes() &&
              global_grad_output.sizes() == global_values.sizes() &&
              global_row_term.size(0) == heads_total && global_row_term.size(1) == G &&
              global_logsumexp.sizes() == global_row_term.sizes() && global_bias.size(1) == G &&
              key_bias.size(0) * heads * blocks == n && key_bias.size(1) == blocks * L,
              "block_window_backward: shapes do not match the queries");

  auto grad_query = at::empty({n, L, D}, query.options());
  auto grad_key = at::empty({n, L, D}, query.options());
  auto grad_value = at::empty({n, L, Dv}, query.options());
  const auto float_options = query.options().dtype(at::kFloat);

  // The global tokens, per head, laid out once as the products below take them (rows from
  // G to Gp are zeros): keys and values as left operands [Gp, D|Dv], keys transposed
  // [D, Gp]; their rows' queries and output gradients as right operands of K Q^T and
  // V dO^T (transposed) and of dS^T Q and P^T dO (as they are).
  auto global_keys_rows = at::zeros({heads_total, Gp, D}, query.options());
  auto global_values_rows = at::zeros({heads_total, Gp, Dv}, query.options());
  auto global_keys_t = at::empty({heads_total, D, Gp}, query.options());
  auto global_queries_t = at::empty({heads_total, D, Gp}, query.options());
  auto global_grad_t = at::empty({heads_total, Dv, Gp}, query.options());
  auto global_queries_right = at::empty({heads_total, Gp, D}, query.options());
  auto global_grad_right = at::empty({heads_total, Gp, Dv}, query.options());
  auto global_lse2 = at::full({heads_total, Gp}, INFINITY, float_options);  // padding rows: P = 0
  auto global_term = at::zeros({heads_total, Gp}, float_options);
  if (G) {
    global_keys_rows.narrow(1, 0, G).copy_(global_keys);
    global_values_rows.narrow(1, 0, G).copy_(global_values);
    global_term.narrow(1, 0, G).copy_(global_row_term);
    // in base 2; rows without any key: +inf (P = 0)
    global_lse2.narrow(1, 0, G).copy_(global_logsumexp.mul(kLog2e).masked_fill(global_logsumexp == -INFINITY,
                                                                                 INFINITY));
    auto queries_rows = at::zeros({heads_total, Gp, D}, query.options());
    auto grad_rows = at::zeros({heads_total, Gp, Dv}, query.options());
    queries_rows.narrow(1, 0, G).copy_(global_queries);
    grad_rows.narrow(1, 0, G).copy_(global_grad_output);
    at::parallel_for(0, heads_total, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> scratch(Gp * std::max(D, Dv));
      for (int64_t h = begin; h < end; ++h) {
        const T* keys_h = global_keys_rows.data_ptr<T>() + h * Gp * D;
        const T* queries_h = queries_rows.data_ptr<T>() + h * Gp * D;
        const T* grad_h = grad_rows.data_ptr<T>() + h * Gp * Dv;
        transpose_rows(keys_h, Gp, Gp, D, Gp, global_keys_t.data_ptr<T>() + h * D * Gp, scratch.data());
        pack_keys(queries_h, Gp, Gp, D, Gp, global_queries_t.data_ptr<T>() + h * D * Gp);
        pack_keys(grad_h, Gp, Gp, Dv, Gp, global_grad_t.data_ptr<T>() + h * Dv * Gp);
        T* queries_right = global_queries_right.data_ptr<T>() + h * Gp * D;
        T* grad_right = global_grad_right.data_ptr<T>() + h * Gp * Dv;
        const T* packed = right_operand(queries_h, Gp, D, queries_right);
        if (packed != queries_right) std::memcpy(queries_right, packed, Gp * D * sizeof(T));
        packed = right_operand(grad_h, Gp, Dv, grad_right);
        if (packed != grad_right) std::memcpy(grad_right, packed, Gp * Dv * sizeof(T));
      }
    });
  }

  const T* q = query.data_ptr<T>();
  const T* k = key_source.data_ptr<T>();
  const T* v = value_source.data_ptr<T>();
  const T* dout = grad_output.data_ptr<T>();
  const T* out = output.data_ptr<T>();
  const float* lse = logsumexp.data_ptr<float>();
  const float* window_bias_data = window_bias.data_ptr<float>();
  const bool* biased_data = biased.data_ptr<bool>();
  const float* global_bias_data = global_bias.data_ptr<float>();
  const float* key_bias_data = key_bias.data_ptr<float>();
  const T* g_keys = global_keys_rows.data_ptr<T>();
  const T* g_values = global_values_rows.data_ptr<T>();
  const T* g_keys_t = global_keys_t.data_ptr<T>();
  const T* g_queries_t = global_queries_t.data_ptr<T>();
  const T* g_grad_t = global_grad_t.data_ptr<T>();
  const T* g_queries_right = global_queries_right.data_ptr<T>();
  const T* g_grad_right = global_grad_right.data_ptr<T>();
  const float* g_lse2 = global_lse2.data_ptr<float>();
  const float* g_term = global_term.data_ptr<float>();
  T* dq = grad_query.data_ptr<T>();
  T* dk = grad_key.data_ptr<T>();
  T* dv = grad_value.data_ptr<T>();
  const float c = static_cast<float>(scale) * kLog2e;
  const float grad_scale = static_cast<float>(scale);

  // Chunks of kChunk blocks, fewer where that would leave threads idle, never fewer than
  // 2 * 2 w: a chunk then shares blocks with its two neighbours only, and the edge buffers
  // hold at most as many blocks as the sequence.
  const int64_t threads = at::get_num_threads(), shared = spread - 1;
  const int64_t per_thread = (n + threads - 1) / threads;
  const int64_t chunk_blocks = std::max({2 * shared, int64_t{1}, std::min(kChunk, per_thread)});
  const int64_t chunks = (n + chunk_blocks - 1) / chunk_blocks;
  // Key block j of the sequence is "padded" block j + w: window i reaches padded blocks
  // i .. i + 2 w, chunk c padded blocks c C .. c C + C + 2 w (local blocks 0 .. C + 2 w).
  // Of those, chunk c shares local blocks 0 .. 2 w with chunk c - 1 (its "head") and
  // C .. C + 2 w with chunk c + 1 (its "tail"); they wait in float32 edge buffers.
  const int64_t edge_size = shared * L * (D + Dv);  // one head or tail: keys then values per block
  auto edges = at::empty({chunks, 2, edge_size}, float_options);
  float* edge_data = edges.data_ptr<float>();
  // A block's sums to the output, where it is a block of the sequence.
  const auto emit = [&](const float* key_block, const float* value_block, int64_t padded) {
    if (padded < w || padded >= n + w) return;  // outside the sequence
    scale_row(key_block, L * D, 1.0f, dk + (padded - w) * L * D);
    scale_row(value_block, L * Dv, 1.0f, dv + (padded - w) * L * Dv);
  };
  std::vector<GlobalGradients> global_sums(threads);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t window_blocks = chunk_blocks + spread - 1, columns = window_blocks * L;
    const int64_t width = std::max(W, Gp);  // rows of the transposed products
    std::vector<T> keys(columns * D), values(columns * Dv), keys_t(D * columns);
    std::vector<T> query_t(D * L), grad_t(Dv * L), query_right(L * D), grad_right(L * Dv);
    std::vector<T> probs_t(width * L), scores_grad_t(width * L), scores_grad_right(width * L);
    std::vector<T> scratch(L * std::max(D, Dv));
    std::vector<float> scores_t(width * L), probs_grad_t(width * L), query_grad_t(D * L);
    std::vector<float> row_bias(std::max(W, std::max(Gp, L))), lse2(L), term(L);
    // The chunk's key and value gradient sums: local block t is padded block chunk + t.
    std::vector<float> key_sums(window_blocks * L * D), value_sums(window_blocks * L * Dv);
    TORCH_CHECK(at::get_thread_num() < threads, "block_window_backward: more threads than torch reports");
    GlobalGradients& sums = global_sums[at::get_thread_num()];
    if (G) {
      const int64_t first_chunk = begin * chunk_blocks;
      const int64_t last_block = std::min(n, end * chunk_blocks) - 1;
      sums.first_head = first_chunk / blocks;
      sums.heads = last_block / blocks - sums.first_head + 1;
      sums.keys.assign(sums.heads * Gp * D, 0.0f);
      sums.values.assign(sums.heads * Gp * Dv, 0.0f);
      sums.queries_t.assign(sums.heads * D * Gp, 0.0f);
    }
    for (int64_t index = begin; index < end; ++index) {
      const int64_t chunk = index * chunk_blocks;
      const int64_t chunk_end = std::min(n, chunk + chunk_blocks), count = chunk_end - chunk;
      std::fill(key_sums.begin(), key_sums.end(), 0.0f);
      std::fill(value_sums.begin(), value_sums.end(), 0.0f);
      for (int64_t t = 0; t < chunk_end - chunk + spread - 1; ++t) {  // the chunk's window keys and values
        const int64_t source = chunk + shift + t, value_block = chunk + value_shift + t;
        const bool inside = source >= 0 && source < S, value_inside = value_block >= 0 && value_block < Sv;
        T* key_rows = keys.data() + t * L * D;
        T* value_rows = values.data() + t * L * Dv;
        if (inside) {
          std::memcpy(key_rows, k + source * L * D, L * D * sizeof(T));
        } else {
          std::memset(key_rows, 0, L * D * sizeof(T));
        }
        if (value_inside) {
          std::memcpy(value_rows, v + value_block * L * Dv, L * Dv * sizeof(T));
        } else {
          std::memset(value_rows, 0, L * Dv * sizeof(T));
        }
        transpose_rows(key_rows, L, L, D, columns, keys_t.data() + t * L, scratch.data());
      }
      for (int64_t i = chunk; i < chunk_end; ++i) {
        const int64_t first = i - chunk;  // the window's first block in the chunk's buffers
        const int64_t own = first + w;  // block i's own keys there
        const int64_t row = (i / (heads * blocks)) * blocks + i % blocks;
        const int64_t head = i / blocks, slot = head - sums.first_head;
        const T* q_i = q + i * L * D;
        const T* dout_i = dout + i * L * Dv;
        for (int64_t r = 0; r < L; ++r) {  // rowsum(dO O) and the log-sum-exp in base 2
          // (a scalar loop here took ~7 % of the backward)
          term[r] = dot_row(dout_i + r * Dv, out + (i * L + r) * Dv, Dv);
          const float e = lse[i * L + r];
          lse2[r] = e == -INFINITY ? INFINITY : e * kLog2e;  // no key or replaced row: P = 0
        }
        pack_keys(q_i, L, L, D, L, query_t.data());  // right operands of K Q^T and V dO^T
        pack_keys(dout_i, L, L, Dv, L, grad_t.data());
        const T* query_b = right_operand(q_i, L, D, query_right.data());  // of dS^T Q and P^T dO
        const T* grad_b = right_operand(dout_i, L, Dv, grad_right.data());

        // The window keys.
        at::native::cpublas::brgemm(W, L, D, D, L, L, false, keys.data() + first * L * D, query_t.data(),
                                    scores_t.data());
        at::native::cpublas::brgemm(W, L, Dv, Dv, L, L, false, values.data() + first * L * Dv,
                                    grad_t.data(), probs_grad_t.data());
        const float* bias = nullptr;
        if (biased_data[row]) {
          for (int64_t x = 0; x < W; ++x) row_bias[x] = base2_bias(window_bias_data[row * W + x]);
          bias = row_bias.data();
        }
        softmax_backward_rows(scores_t.data(), probs_grad_t.data(), W, L, bias, lse2.data(), term.data(), c,
                              grad_scale, probs_t.data(), scores_grad_t.data());
        const T* ds_right = right_operand(scores_grad_t.data(), W, L, scores_grad_right.data());
        at::native::cpublas::brgemm(W, Dv, L, L, Dv, Dv, true, probs_t.data(), grad_b,
                                    value_sums.data() + first * L * Dv);
        at::native::cpublas::brgemm(W, D, L, L, D, D, true, scores_grad_t.data(), query_b,
                                    key_sums.data() + first * L * D);
        at::native::cpublas::brgemm(D, L, W, columns, L, L, false, keys_t.data() + first * L, ds_right,
                                    query_grad_t.data());
        if (G) {
          // The global keys: Gp more rows of the same products, summed per head.
          at::native::cpublas::brgemm(Gp, L, D, D, L, L, false, g_keys + head * Gp * D, query_t.data(),
                                      scores_t.data());
          at::native::cpublas::brgemm(Gp, L, Dv, Dv, L, L, false, g_values + head * Gp * Dv, grad_t.data(),
                                      probs_grad_t.data());
          for (int64_t g = 0; g < Gp; ++g) {
            row_bias[g] = g < G ? base2_bias(global_bias_data[row * G + g]) : -INFINITY;
          }
          softmax_backward_rows(scores_t.data(), probs_grad_t.data(), Gp, L, row_bias.data(), lse2.data(),
                                term.data(), c, grad_scale, probs_t.data(), scores_grad_t.data());
          const T* global_ds_right = right_operand(scores_grad_t.data(), Gp, L, scores_grad_right.data());
          at::native::cpublas::brgemm(D, L, Gp, Gp, L, L, true, g_keys_t + head * D * Gp, global_ds_right,
                                      query_grad_t.data());
          at::native::cpublas::brgemm(Gp, Dv, L, L, Dv, Dv, true, probs_t.data(), grad_b,
                                      sums.values.data() + slot * Gp * Dv);
          at::native::cpublas::brgemm(Gp, D, L, L, D, D, true, scores_grad_t.data(), query_b,
                                      sums.keys.data() + slot * Gp * D);
        }
        store_transposed(query_grad_t.data(), D, L, dq + i * L * D);
        if (G) {
          // The global tokens' rows over block i's own keys: Gp more queries, [L, Gp] products.
          at::native::cpublas::brgemm(L, Gp, D, D, Gp, Gp, false, keys.data() + own * L * D,
                                      g_queries_t + head * D * Gp, scores_t.data());
          at::native::cpublas::brgemm(L, Gp, Dv, Dv, Gp, Gp, false, values.data() + own * L * Dv,
                                      g_grad_t + head * Dv * Gp, probs_grad_t.data());
          const float* own_bias = key_bias_data + (i / (heads * blocks)) * blocks * L + (i % blocks) * L;
          for (int64_t x = 0; x < L; ++x) row_bias[x] = base2_bias(own_bias[x]);
          softmax_backward_rows(scores_t.data(), probs_grad_t.data(), L, Gp, row_bias.data(),
                                g_lse2 + head * Gp, g_term + head * Gp, c, grad_scale, probs_t.data(),
                                scores_grad_t.data());
          const T* rows_ds_right = right_operand(scores_grad_t.data(), L, Gp, scores_grad_right.data());
          at::native::cpublas::brgemm(L, Dv, Gp, Gp, Dv, Dv, true, probs_t.data(),
                                      g_grad_right + head * Gp * Dv, value_sums.data() + own * L * Dv);
          at::native::cpublas::brgemm(L, D, Gp, Gp, D, D, true, scores_grad_t.data(),
                                      g_queries_right + head * Gp * D, key_sums.data() + own * L * D);
          at::native::cpublas::brgemm(D, Gp, L, columns, Gp, Gp, true, keys_t.data() + own * L,
                                      rows_ds_right, sums.queries_t.data() + slot * D * Gp);
        }
      }
      // The sums out: the head to its edge buffer (the first chunk has no neighbour before
      // it), the tail likewise (the last has none after it), the rest to the output.
      const bool last = index == chunks - 1;
      float* head = edge_data + (index * 2) * edge_size;
      float* tail = edge_data + (index * 2 + 1) * edge_size;
      for (int64_t t = 0; t < count + shared; ++t) {
        const float* key_block = key_sums.data() + t * L * D;
        const float* value_block = value_sums.data() + t * L * Dv;
        float* edge = nullptr;
        if (t < shared && index > 0) {
          edge = head + t * L * (D + Dv);
        } else if (t >= count && !last) {
          edge = tail + (t - count) * L * (D + Dv);
        }
        if (edge) {
          std::memcpy(edge, key_block, L * D * sizeof(float));
          std::memcpy(edge + L * D, value_block, L * Dv * sizeof(float));
        } else {
          emit(key_block, value_block, chunk + t);
        }
      }
    }
    at::native::cpublas::brgemm_release();
  });
  // The blocks two chunks share: chunk c's head plus chunk c - 1's tail.
  at::parallel_for(1, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(L * (D + Dv));
    for (int64_t index = begin; index < end; ++index) {
      const float* head = edge_data + (index * 2) * edge_size;
      const float* tail = edge_data + ((index - 1) * 2 + 1) * edge_size;
      for (int64_t t = 0; t < shared; ++t) {
        const int64_t at = t * L * (D + Dv);
        for (int64_t x = 0; x < L * (D + Dv); ++x) sum[x] = head[at + x] + tail[at + x];
        emit(sum.data(), sum.data() + L * D, index * chunk_blocks + t);
      }
    }
  });

  // The global tokens' sums, merged over the threads.
  auto global_key_grad = at::zeros({heads_total, Gp, D}, float_options);
  auto global_value_grad = at::zeros({heads_total, Gp, Dv}, float_options);
  auto global_query_grad_t = at::zeros({heads_total, D, Gp}, float_options);
  for (const GlobalGradients& sums : global_sums) {
    if (!sums.heads) continue;
    const auto range = [&](const Tensor& x) { return x.narrow(0, sums.first_head, sums.heads); };
    range(global_key_grad).add_(at::from_blob(const_cast<float*>(sums.keys.data()), {sums.heads, Gp, D},
                                              float_options));
    range(global_value_grad).add_(at::from_blob(const_cast<float*>(sums.values.data()), {sums.heads, Gp, Dv},
                                                float_options));
    range(global_query_grad_t).add_(at::from_blob(const_cast<float*>(sums.queries_t.data()),
                                                  {sums.heads, D, Gp}, float_options));
  }
  return {grad_query, grad_key, grad_value, global_key_grad.narrow(1, 0, G),
          global_value_grad.narrow(1, 0, G), global_query_grad_t.transpose(1, 2).narrow(1, 0, G)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> block_window_forward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& global_keys, const Tensor& global_values, const Tensor& global_bias,
    const Tensor& global_queries, const Tensor& key_bias, double scale) {
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
              "block_window_forward: bfloat16 or float32 only");
  auto run = dtype == at::kBFloat16 ? forward_blocks<BFloat16> : forward_blocks<float>;
  return run(query, key_source, value_source, shift, value_shift, spread, heads, blocks, window_bias, biased,
             global_keys, global_values, global_bias, global_queries, key_bias, scale);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> block_window_backward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& grad_output, const Tensor& output, const Tensor& logsumexp,
    const Tensor& global_keys, const Tensor& global_values, const Tensor& global_bias,
    const Tensor& global_queries, const Tensor& global_grad_output, const Tensor& global_row_term,
    const Tensor& global_logsumexp, const Tensor& key_bias, double scale) {
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
              "block_window_backward: bfloat16 or float32 only");
  auto run = dtype == at::kBFloat16 ? backward_blocks<BFloat16> : backward_blocks<float>;
  return run(query, key_source, value_source, shift, value_shift, spread, heads, blocks, window_bias, biased,
             grad_output, output, logsumexp, global_keys, global_values, global_bias, global_queries,
             global_grad_output, global_row_term, global_logsumexp, key_bias, scale);
}

}  // namespace

TORCH_LIBRARY(attnlab_block_window_amx, m) {
  m.def(
      "forward(Tensor query, Tensor key_source, Tensor value_source, int shift, int value_shift, int spread, "
      "int heads, "
      "int blocks, Tensor window_bias, Tensor biased, Tensor global_keys, Tensor global_values, "
      "Tensor global_bias, Tensor global_queries, Tensor key_bias, float scale) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      &block_window_forward);
  m.def(
      "backward(Tensor query, Tensor key_source, Tensor value_source, int shift, int value_shift, "
      "int spread, int heads, int blocks, Tensor window_bias, Tensor biased, Tensor grad_output, "
      "Tensor output, Tensor logsumexp, Tensor global_keys, Tensor global_values, Tensor global_bias, "
      "Tensor global_queries, Tensor global_grad_output, Tensor global_row_term, Tensor global_logsumexp, "
      "Tensor key_bias, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
      &block_window_backward);
}
