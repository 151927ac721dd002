// The few-row product y = x W^T + b, shared by the kernels that multiply a decoding step's
// rows by weight matrices (skinny_linear.cpp, decode_step.cpp). See skinny_linear.cpp.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>

namespace attnlab_skinny {

using Vec = at::vec::Vectorized<float>;
// Weight rows and rows of x per pass: kWeightRows * kRows accumulators, kWeightRows weight
// vectors and one row vector must fit the vector registers: 16 with AVX2 and NEON (4 x 3:
// 16, which measured 1.3-1.5x faster at 4 and 8 rows than 2 x 4 on AVX2), 32 with
// AVX-512 (4 x 4: 21; 8 x 3 measured slower).
constexpr int64_t kWeightRows = Vec::size() >= 16 ? 4 : 3;
constexpr int64_t kRows = 4;

// A vector of float32 from `size` consecutive weights (size <= Vec::size()): float32 ones as
// they are, bfloat16 and float16 ones widened in registers (half the bytes read, which is the
// point: the products are bounded by memory; the sums stay float32).
inline Vec load_weights(const float* w, int64_t size) {
  return size == Vec::size() ? Vec::loadu(w) : Vec::loadu(w, size);
}

template <typename W, typename = std::enable_if_t<at::vec::is_reduced_floating_point_v<W>>>
inline Vec load_weights(const W* w, int64_t size) {
  Vec widened;
  if (size == Vec::size()) {
    at::vec::load_to_float(w, widened);  // Vec::size() elements: one load and a widening
    return widened;
  }
  __at_align__ float tail[Vec::size()] = {};  // the tail: zeros past `size`
  for (int64_t i = 0; i < size; ++i) tail[i] = static_cast<float>(w[i]);
  return Vec::loadu(tail);
}

// A hint to bring the cache line at `address` in, not to be kept past its use.
inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 0, 0);
#else
  (void)address;
#endif
}

// out[r * out_stride + o] = dot(x row r, w row o) for R rows of x and O rows of w, each of
// `depth` elements; the vectors' lanes are summed at the end (one reduction per output).
template <int64_t R, int64_t O, bool kPrefetch, typename W>
inline void dots(const float* x, int64_t x_stride, const W* w, int64_t w_stride, int64_t depth,
                 float* out, int64_t out_stride) {
  Vec acc[R][O];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) acc[r][o] = Vec(0.f);
  const int64_t step = Vec::size();
  int64_t k = 0;
  for (; k + step <= depth; k += step) {
    // Once per cache line, ask for the same line of the next group's rows (the next O rows):
    // the hardware's prefetcher alone follows the O interleaved rows poorly, which held
    // bfloat16 rows to 10-15 GB/s where float32 rows reached 17-30 (one or two rows of x, 2
    // cores, AVX2 EPYC); with it bfloat16 reads at float32's rate, so half the bytes take
    // about half the time. With more rows of x the loop is busy enough for the hardware's
    // prefetcher, and the hints slowed 8 rows by 1.1-1.5x: they are for one or two rows.
    // A prefetch never faults, so the rows past the matrix's end need no guard.
    if (kPrefetch && (k * static_cast<int64_t>(sizeof(W))) % 64 == 0)
      for (int64_t o = 0; o < O; ++o) prefetch(w + (o + O) * w_stride + k);
    Vec weights[O];
    for (int64_t o = 0; o < O; ++o) weights[o] = load_weights(w + o * w_stride + k, step);
    for (int64_t r = 0; r < R; ++r) {
      const Vec row = Vec::loadu(x + r * x_stride + k);
      for (int64_t o = 0; o < O; ++o) acc[r][o] = at::vec::fmadd(row, weights[o], acc[r][o]);
    }
  }
  if (k < depth) {  // the tail: loads of fewer lanes fill the rest with zeros
    const int64_t rest = depth - k;
    Vec weights[O];
    for (int64_t o = 0; o < O; ++o) weights[o] = load_weights(w + o * w_stride + k, rest);
    for (int64_t r = 0; r < R; ++r) {
      const Vec row = Vec::loadu(x + r * x_stride + k, rest);
      for (int64_t o = 0; o < O; ++o) acc[r][o] = at::vec::fmadd(row, weights[o], acc[r][o]);
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o)
      out[r * out_stride + o] =
          at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc[r][o]);
}

// Weight rows [begin, end) against every row of x.
template <int64_t O, typename W>
inline void weight_rows_times_x(const float* x, int64_t rows, const W* w, int64_t depth, int64_t o,
                                float* out, int64_t width) {
  if (rows <= 2) {  // memory-bound: prefetch (see dots)
    if (rows == 2) dots<2, O, true>(x, depth, w + o * depth, depth, depth, out + o, width);
    else dots<1, O, true>(x, depth, w + o * depth, depth, depth, out + o, width);
    return;
  }
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    dots<kRows, O, false>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
  // the rows left (fewer than kRows): in twos, then one
  for (; r + 2 <= rows; r += 2)
    dots<2, O, false>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
  if (r < rows)
    dots<1, O, false>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
}

template <typename W>
void skinny(const float* x, int64_t rows, const W* w, int64_t width, int64_t depth, const float* bias,
            float* out) {
  // Each thread gets whole groups of weight rows; a group of a few hundred KiB keeps the
  // number of parallel regions per product at one.
  const int64_t grain = std::max<int64_t>(kWeightRows, (64 * 1024) / std::max<int64_t>(depth, 1));
  at::parallel_for(0, width, grain, [&](int64_t begin, int64_t end) {
    int64_t o = begin;
    for (; o + kWeightRows <= end; o += kWeightRows)
      weight_rows_times_x<kWeightRows>(x, rows, w, depth, o, out, width);
    for (; o < end; ++o) weight_rows_times_x<1>(x, rows, w, depth, o, out, width);
    if (bias != nullptr)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = begin; i < end; ++i) out[r * width + i] += bias[i];
  });
}

}  // namespace attnlab_skinny
