// y = x W^T + b for a few rows of x: the products of a decoding step, at memory speed.
//
// A decoding step multiplies every weight matrix by one row per sequence. Such a product
// reads each weight once and does 2 flops per weight per row, so memory bounds it; yet
// torch's float32 product (MKL's gemv/gemm) reads the weights at 10-15 GB/s on a 2-core
// machine whose cores read at 40 GB/s. Here each thread takes a range of weight rows and,
// for kWeightRows of them at a time, computes their dot products with every row of x (x
// stays in the caches; kRows of its rows at a time, so that kWeightRows * kRows vector
// accumulators live in registers while each weight vector is loaded once per group of
// kRows rows). Written on at::vec, so one source serves AVX2, AVX-512 and ARM.
//
// float32 weights, or bfloat16 ones (converted to float32 in registers; x is float32 and
// the sums are float32 either way). The order of the additions differs from MKL's, as it
// does between any two GEMM kernels: results agree to float32 rounding.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>

namespace {

using Vec = at::vec::Vectorized<float>;
// Weight rows and rows of x per pass: kWeightRows * kRows accumulators, kWeightRows weight
// vectors and one row vector must fit the vector registers: 16 with AVX2 and NEON (4 x 3:
// 16, which measured 1.3-1.5x faster at 4 and 8 rows than 2 x 4 on AVX2), 32 with
// AVX-512 (4 x 4: 21; 8 x 3 measured slower).
constexpr int64_t kWeightRows = Vec::size() >= 16 ? 4 : 3;
constexpr int64_t kRows = 4;

// A vector of float32 from `size` consecutive weights (size <= Vec::size()).
inline Vec load_weights(const float* w, int64_t size) {
  return size == Vec::size() ? Vec::loadu(w) : Vec::loadu(w, size);
}

inline Vec load_weights(const at::BFloat16* w, int64_t size) {
  auto [low, high] = at::vec::convert_to_float<at::BFloat16>(
      at::vec::Vectorized<at::BFloat16>::loadu(w, std::min<int64_t>(size, Vec::size())));
  (void)high;  // only the first Vec::size() elements were loaded
  return low;
}

// out[r * out_stride + o] = dot(x row r, w row o) for R rows of x and O rows of w, each of
// `depth` elements; the vectors' lanes are summed at the end (one reduction per output).
template <int64_t R, int64_t O, typename W>
inline void dots(const float* x, int64_t x_stride, const W* w, int64_t w_stride, int64_t depth,
                 float* out, int64_t out_stride) {
  Vec acc[R][O];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < O; ++o) acc[r][o] = Vec(0.f);
  const int64_t step = Vec::size();
  int64_t k = 0;
  for (; k + step <= depth; k += step) {
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
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    dots<kRows, O>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
  // the rows left (fewer than kRows): in twos, then one
  for (; r + 2 <= rows; r += 2)
    dots<2, O>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
  if (r < rows)
    dots<1, O>(x + r * depth, depth, w + o * depth, depth, depth, out + r * width + o, width);
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

// x [rows, depth] float32, weight [width, depth] float32 or bfloat16, bias [width] or None
// (float32) -> [rows, width] float32. All contiguous.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "skinny linear: x [rows, depth] and weight [width, depth] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && weight.is_contiguous(),
              "skinny linear: contiguous float32 x expected");
  const int64_t rows = x.size(0), depth = x.size(1), width = weight.size(0);
  at::Tensor out = at::empty({rows, width}, x.options());
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == width,
                "skinny linear: contiguous float32 bias of the weight's rows expected");
    bias_data = bias->data_ptr<float>();
  }
  if (weight.scalar_type() == at::kFloat) {
    skinny(x.data_ptr<float>(), rows, weight.data_ptr<float>(), width, depth, bias_data,
           out.data_ptr<float>());
  } else {
    TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "skinny linear: float32 or bfloat16 weight expected");
    skinny(x.data_ptr<float>(), rows, weight.data_ptr<at::BFloat16>(), width, depth, bias_data,
           out.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(attnlab_skinny_linear, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.impl("linear", c10::DispatchKey::CPU, &linear);
}
