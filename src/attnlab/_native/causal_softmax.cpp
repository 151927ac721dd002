// Causal softmax of a block of score rows, in place: the weights of a causal map whose
// rows are computed a block at a time and kept.
//
// `scores` is [B, H, t, keys], float32, contiguous along keys and of any other strides (a
// view into the [B, H, T, S] map that keeps every block's weights: the block's products
// are written there by the GEMM and become weights where they lie, with no second buffer
// and no copy). Row r of the block may attend keys 0 .. first_row + r (torch's top-left
// `is_causal`); it becomes the softmax over those keys and zeros past them. A row with no
// key to attend (first_row + r < 0) becomes zeros. Each row is short enough (a few
// thousand keys) to stay in the L1/L2 cache across its three passes (maximum, exponentials
// and their sum, scaling), so memory sees one read and one write of the block. Written on
// at::vec, so one source serves AVX2, AVX-512 and ARM; the exponential is at::vec's
// (Sleef's, 1-ulp), as torch's own softmax uses.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

namespace {

using Vec = at::vec::Vectorized<float>;

void softmax_row(float* row, int64_t allowed, int64_t keys) {
  const int64_t width = Vec::size();
  const int64_t whole = allowed - allowed % width;
  Vec max_vec(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j < whole; j += width) {
    max_vec = at::vec::maximum(max_vec, Vec::loadu(row + j));
  }
  float max_value = at::vec::vec_reduce_all<float>(
      [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, max_vec);
  for (; j < allowed; ++j) {
    max_value = std::max(max_value, row[j]);
  }
  const Vec max_b(max_value);
  Vec sum_vec(0.0f);
  for (j = 0; j < whole; j += width) {
    Vec e = (Vec::loadu(row + j) - max_b).exp();
    e.store(row + j);
    sum_vec = sum_vec + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum_vec);
  if (j < allowed) {  // the tail, through a partial vector: the same exponential as the rest
    Vec e = (Vec::loadu(row + j, allowed - j) - max_b).exp();
    float tail[Vec::size()];
    e.store(tail, allowed - j);
    for (int64_t k = 0; k < allowed - j; ++k) {
      row[j + k] = tail[k];
      sum += tail[k];
    }
  }
  const Vec scale(1.0f / sum);
  for (j = 0; j < whole; j += width) {
    (Vec::loadu(row + j) * scale).store(row + j);
  }
  for (; j < allowed; ++j) {
    row[j] *= 1.0f / sum;
  }
  std::fill(row + std::max<int64_t>(allowed, 0), row + keys, 0.0f);
}

at::Tensor causal_softmax_(at::Tensor scores, int64_t first_row) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat,
              "causal_softmax_: float32 CPU scores only, got ", scores.scalar_type(), " on ", scores.device());
  TORCH_CHECK(scores.dim() == 4 && scores.stride(3) == 1,
              "causal_softmax_: scores must be [B, H, t, keys], contiguous along keys");
  const int64_t B = scores.size(0), H = scores.size(1), t = scores.size(2), keys = scores.size(3);
  const int64_t sb = scores.stride(0), sh = scores.stride(1), st = scores.stride(2);
  float* data = scores.data_ptr<float>();
  const int64_t rows = B * H * t;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(keys, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i % t, h = (i / t) % H, b = i / (t * H);
      const int64_t allowed = std::min<int64_t>(keys, first_row + r + 1);
      float* row = data + b * sb + h * sh + r * st;
      if (allowed <= 0) {
        std::fill(row, row + keys, 0.0f);
      } else {
        softmax_row(row, allowed, keys);
      }
    }
  });
  return scores;
}

}  // namespace

TORCH_LIBRARY(attnlab_causal_softmax, m) {
  m.def("causal_softmax_(Tensor(a!) scores, int first_row) -> Tensor(a!)");
  m.impl("causal_softmax_", c10::DispatchKey::CPU, &causal_softmax_);
}
