// What block_window.cpp's forward and backward share: the problem as the caller lays it out
// (Problem: the blocks, their windows and biases, the global keys; problem_of checks the
// tensors), the GEMM and transpose they call, and the vector loops over a row of scores.
//
// Dimension letters as in block_window.cpp.

#pragma once

#include <ATen/ATen.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace attnlab_block_window {

using at::Tensor;
using Vec = at::vec::Vectorized<float>;

constexpr int64_t kChunk = 8;  // query blocks per task (at least spread - 1 in the backward)
constexpr float kInf = std::numeric_limits<float>::infinity();

// Row-major C[M, N] (+)= A[M, K] B[K, N].
inline void matmul(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float* c, int64_t ldc, bool accumulate) {
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, a, b, c, /*is_vnni=*/false);
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for an [M, N] src: 16 x 16 tiles in registers.
inline void transpose(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t M, int64_t N) {
  int64_t i = 0;
  for (; i + 16 <= M; i += 16) {
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) {
      at::vec::transpose_mxn<float, 16, 16>(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
    }
    for (; j < N; ++j) {
      for (int64_t r = i; r < i + 16; ++r) dst[j * ld_dst + r] = src[r * ld_src + j];
    }
  }
  for (; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
  }
}

// The offsets [first, stop) of a window whose blocks lie inside a source of `count` blocks.
struct Span {
  int64_t first, stop;
  int64_t width() const { return stop > first ? stop - first : 0; }
};

inline Span inside(int64_t start, int64_t spread, int64_t count) {
  return {std::max<int64_t>(0, -start), std::min(spread, count - start)};
}

inline float reduce_sum(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

// x <- x * scale (+ bias); returns the maximum (NaN if any is NaN).
inline float scale_max(float* x, const float* bias, float scale, int64_t size) {
  const Vec factor(scale);
  Vec top(-kInf);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size()) {
    Vec a = Vec::loadu(x + i) * factor;
    if (bias) a = a + Vec::loadu(bias + i);
    a.store(x + i);
    top = at::vec::maximum(top, a);
  }
  float result = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, top);
  for (; i < size; ++i) {
    x[i] = x[i] * scale + (bias ? bias[i] : 0.0f);
    result = std::isnan(x[i]) || std::isnan(result) ? NAN : std::max(result, x[i]);
  }
  return result;
}

// x <- exp(x - top); returns the sum.
inline float exp_sum(float* x, float top, int64_t size) {
  const Vec shift(top);
  Vec sum(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size()) {
    const Vec e = (Vec::loadu(x + i) - shift).exp_u20();
    e.store(x + i);
    sum = sum + e;
  }
  float total = reduce_sum(sum);
  for (; i < size; ++i) {
    x[i] = std::exp(x[i] - top);
    total += x[i];
  }
  return total;
}

inline float dot(const float* a, const float* b, int64_t size) {
  return at::vec::map2_reduce_all<float>([](Vec x, Vec y) { return x * y; },
                                         [](Vec x, Vec y) { return x + y; }, a, b, size);
}

struct Problem {
  const float *q, *k, *v;
  int64_t n, L, D, Dv, W, spread, key_shift, value_shift, key_count, value_count, heads, blocks;
  const float* window_bias;
  const bool* biased;
  float scale;
  // The G global keys of each head [B * H, G, D] (and transposed, [B * H, D, G]), their
  // values [B * H, G, Dv] and bias [B * N, G]: every block's queries attend them too.
  int64_t G = 0;
  const float *global_keys = nullptr, *global_keys_t = nullptr, *global_values = nullptr;
  const float* global_bias = nullptr;

  int64_t head_of(int64_t i) const { return i / blocks; }
  int64_t bias_row_of(int64_t i) const { return (i / (heads * blocks)) * blocks + i % blocks; }
  // out[0, columns + G) <- block i's bias over its window keys [first, first + columns) and
  // its global keys; returns null where there is none (no window bias, no global key).
  const float* keys_bias(int64_t i, Span span, float* out) const {
    const float* window = bias_of(i);
    const int64_t columns = span.width() * L;
    if (!window && !G) return nullptr;
    if (window) {
      std::memcpy(out, window + span.first * L, columns * sizeof(float));
    } else {
      std::fill(out, out + columns, 0.0f);
    }
    if (G) std::memcpy(out + columns, global_bias + bias_row_of(i) * G, G * sizeof(float));
    return out;
  }

  // Block i's row of the window bias (the heads of a sequence share it), or null.
  const float* bias_of(int64_t i) const {
    const int64_t row = (i / (heads * blocks)) * blocks + i % blocks;
    return biased[row] ? window_bias + row * W : nullptr;
  }
  // Window offsets whose key and value blocks both lie inside their sources: the others
  // carry probability 0 (the bias removes them), so every product skips them.
  Span span(int64_t i) const {
    const Span keys = inside(i + key_shift, spread, key_count);
    const Span values = inside(i + value_shift, spread, value_count);
    return {std::max(keys.first, values.first), std::min(keys.stop, values.stop)};
  }
  // keys_t [D, ld] <- the keys of the padded blocks chunk .. chunk + count + spread - 2
  // (block t of the chunk in columns [t L, (t + 1) L)), transposed; zeros outside the source.
  void transpose_keys(int64_t chunk, int64_t count, float* keys_t, int64_t ld) const {
    for (int64_t t = 0; t < count + spread - 1; ++t) {
      const int64_t source = chunk + key_shift + t;
      if (source >= 0 && source < key_count) {
        transpose(k + source * L * D, D, keys_t + t * L, ld, L, D);
      } else {
        for (int64_t d = 0; d < D; ++d) {
          std::fill(keys_t + d * ld + t * L, keys_t + d * ld + (t + 1) * L, 0.0f);
        }
      }
    }
  }
};

inline Problem problem_of(const Tensor& query, const Tensor& key_source, const Tensor& value_source,
                          int64_t key_shift, int64_t value_shift, int64_t spread, int64_t heads,
                          int64_t blocks, const Tensor& window_bias, const Tensor& biased,
                          const Tensor& global_keys, const Tensor& global_keys_t, const Tensor& global_values,
                          const Tensor& global_bias, double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key_source.scalar_type() == at::kFloat &&
                  value_source.scalar_type() == at::kFloat && window_bias.scalar_type() == at::kFloat,
              "block_window: float32 inputs only");
  TORCH_CHECK(biased.scalar_type() == at::kBool, "block_window: `biased` must be bool");
  TORCH_CHECK(query.dim() == 3 && key_source.dim() == 3 && value_source.dim() == 3,
              "block_window: blocks must be [count, L, D]");
  TORCH_CHECK(query.is_contiguous() && key_source.is_contiguous() && value_source.is_contiguous() &&
                  window_bias.is_contiguous() && biased.is_contiguous(),
              "block_window: contiguous inputs only");
  TORCH_CHECK(spread >= 1 && spread % 2 == 1 && heads >= 1 && blocks >= 1, "block_window: bad sizes");
  Problem p;
  p.n = query.size(0);
  p.L = query.size(1);
  p.D = query.size(2);
  p.Dv = value_source.size(2);
  p.spread = spread;
  p.W = spread * p.L;
  TORCH_CHECK(key_source.size(1) == p.L && key_source.size(2) == p.D && value_source.size(1) == p.L,
              "block_window: key and value blocks must match the query blocks");
  TORCH_CHECK(p.n % (heads * blocks) == 0, "block_window: blocks do not divide into heads");
  TORCH_CHECK(window_bias.dim() == 2 && window_bias.size(0) == p.n / heads && window_bias.size(1) == p.W,
              "block_window: window_bias must be [B * N, W]");
  TORCH_CHECK(biased.numel() == window_bias.size(0), "block_window: `biased` must be [B * N]");
  p.q = query.data_ptr<float>();
  p.k = key_source.data_ptr<float>();
  p.v = value_source.data_ptr<float>();
  p.key_shift = key_shift;
  p.value_shift = value_shift;
  p.key_count = key_source.size(0);
  p.value_count = value_source.size(0);
  p.heads = heads;
  p.blocks = blocks;
  p.window_bias = window_bias.data_ptr<float>();
  p.biased = biased.data_ptr<bool>();
  p.scale = static_cast<float>(scale);
  p.G = global_values.size(1);
  const int64_t heads_total = p.n / blocks;
  for (const Tensor* x : {&global_keys_t, &global_values, &global_bias}) {  // global_keys: the backward's
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->is_contiguous(),
                "block_window: contiguous float32 global keys, values and bias");
  }
  TORCH_CHECK(global_keys.sizes() == at::IntArrayRef({heads_total, p.G, p.D}) &&
                  global_keys_t.sizes() == at::IntArrayRef({heads_total, p.D, p.G}) &&
                  global_values.sizes() == at::IntArrayRef({heads_total, p.G, p.Dv}) &&
                  global_bias.sizes() == at::IntArrayRef({window_bias.size(0), p.G}),
              "block_window: global keys [B * H, G, D], transposed [B * H, D, G], values [B * H, G, Dv], "
              "bias [B * N, G]");
  if (p.G) {
    p.global_keys = global_keys.data_ptr<float>();
    p.global_keys_t = global_keys_t.data_ptr<float>();
    p.global_values = global_values.data_ptr<float>();
    p.global_bias = global_bias.data_ptr<float>();
  }
  return p;
}

}  // namespace attnlab_block_window
