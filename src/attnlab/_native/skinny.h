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

// A hint to bring the cache line at `address` into the caches: kLocality 0 for a line used
// once (not to be kept past its use), 3 for one read again soon. A prefetch never faults.
template <int kLocality>
inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, 0, kLocality);
#else
  (void)address;
#endif
}

// out[r * out_stride + o] = dot(x row r, w row o) for R rows of x and O rows of w, each of
// `depth` elements; the vectors' lanes are summed at the end (one reduction per output).
//
// While it reads its rows, a pass asks for the next group's rows ahead of their use
// (`next`: the first of them, further rows w_stride apart): one cache line of each per
// kEvery lines of its own, from the start of `next`, so that memory streams at an even rate
// while the cores compute. The hardware's prefetcher alone follows O short interleaved rows
// poorly, and the passes came in bursts: one or two rows of x read bfloat16 weights at
// 10-15 GB/s where float32 reached 17-30, and 8 rows read float32 at 17 GB/s (2 cores, AVX2
// EPYC). With the hints one or two rows read bfloat16 at 20-29 GB/s (float32 at 25-35), and
// 8 rows are 1.4-1.5x faster in both dtypes. kEvery 0 asks for nothing.
template <int64_t R, int64_t O, int64_t kEvery, int kLocality, typename W>
inline void dots(const float* x, int64_t x_stride, const W* w, int64_t w_stride, int64_t depth,
                 float* out, int64_t out_stride, const W* next = nullptr) {
  Vec acc[R][O];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) acc[r][o] = Vec(0.f);
  // `size` elements of each row at k (the tail's loads of fewer lanes fill the rest with zeros)
  const auto step = [&](int64_t k, int64_t size) {
    Vec weights[O];
    for (int64_t o = 0; o < O; ++o) weights[o] = load_weights(w + o * w_stride + k, size);
    for (int64_t r = 0; r < R; ++r) {
      const float* row_at = x + r * x_stride + k;
      const Vec row = size == Vec::size() ? Vec::loadu(row_at) : Vec::loadu(row_at, size);
      for (int64_t o = 0; o < O; ++o) acc[r][o] = at::vec::fmadd(row, weights[o], acc[r][o]);
    }
  };
  int64_t k = 0;
  if constexpr (kEvery > 0) {
    // kEvery cache lines of each of its rows per line asked for (a whole number of vectors)
    constexpr int64_t kSpan = kEvery * 64 / static_cast<int64_t>(sizeof(W));
    for (; k + kSpan <= depth; k += kSpan) {
      for (int64_t o = 0; o < O; ++o) prefetch<kLocality>(next + o * w_stride + k / kEvery);
#pragma GCC unroll 16
      for (int64_t u = 0; u < kSpan / Vec::size(); ++u) step(k + u * Vec::size(), Vec::size());
    }
  }
  for (; k + Vec::size() <= depth; k += Vec::size()) step(k, Vec::size());
  if (k < depth) step(k, depth - k);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o)
      out[r * out_stride + o] =
          at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc[r][o]);
}

// Weight rows [o, o + O) against every row of x, asking for the next O rows as it goes.
template <int64_t O, typename W>
inline void weight_rows_times_x(const float* x, int64_t rows, const W* w, int64_t depth, int64_t o,
                                float* out, int64_t width) {
  const W* group = w + o * depth;
  const W* next = group + O * depth;
  if (rows <= 2) {  // one pass, bounded by memory: each line of the next rows once, not kept
    if (rows == 2) dots<2, O, 1, 0>(x, depth, group, depth, depth, out + o, width, next);
    else dots<1, O, 1, 0>(x, depth, group, depth, depth, out + o, width, next);
    return;
  }
  // kRows rows of x per pass: the first pass reads the group's rows from memory, the later
  // ones from the caches, so the next rows are kept (locality 3). One pass asks for them
  // line by line; with several, the last two ask for half each, one line per two.
  const int64_t passes = rows / kRows;
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(W));
  const int64_t half = depth / 2 / kLine * kLine;
  for (int64_t pass = 0; pass < passes; ++pass) {
    const float* xs = x + pass * kRows * depth;
    float* outs = out + pass * kRows * width + o;
    if (passes == 1) dots<kRows, O, 1, 3>(xs, depth, group, depth, depth, outs, width, next);
    else if (pass == passes - 2) dots<kRows, O, 2, 3>(xs, depth, group, depth, depth, outs, width, next);
    else if (pass == passes - 1)
      dots<kRows, O, 2, 3>(xs, depth, group, depth, depth, outs, width, next + half);
    else dots<kRows, O, 0, 3>(xs, depth, group, depth, depth, outs, width);
  }
  // the rows left (fewer than kRows): in twos, then one; three rows ask in their first pass
  int64_t r = passes * kRows;
  if (rows == 3) {
    dots<2, O, 1, 3>(x, depth, group, depth, depth, out + o, width, next);
    r = 2;
  }
  for (; r + 2 <= rows; r += 2)
    dots<2, O, 0, 3>(x + r * depth, depth, group, depth, depth, out + r * width + o, width);
  if (r < rows) dots<1, O, 0, 3>(x + r * depth, depth, group, depth, depth, out + r * width + o, width);
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
