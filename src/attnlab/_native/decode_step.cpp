// One decoding step of a Llama-family decoder in one call: for every layer, RMSNorm, the
// query/key/value product, rotary positions, the cache write, attention over the cache,
// the output product and residual, RMSNorm, the SwiGLU feed-forward net and residual; then
// the final norm and the LM head.
//
// A step of a small model spends much of its time outside its matrix products: about 35
// torch operations per layer, each paying Python's and torch's dispatch and each running a
// few thousand elements. Here the products go to the few-row kernel (skinny.h), the rest is
// a few loops over the step's B rows, and the whole step is one call. Written on at::vec,
// so one source serves AVX2, AVX-512 and ARM.
//
// float32 throughout. The operations are the module path's, in its order (RMSNorm as
// x * rsqrt(mean(x^2) + eps) then times the weight; rotary as x * cos + rotate_half(x) *
// sin; scores times the scale; softmax over the allowed slots; SiLU as x / (1 + e^-x));
// sums run in another order than torch's, so results agree to float32 rounding.
//
// Dimension letters: B rows (sequences), H query heads, K key/value heads, G = H / K query
// heads per key/value head, C cache slots, D head dim, E model dim, F feed-forward width,
// V vocabulary.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "skinny.h"

namespace {

using Vec = at::vec::Vectorized<float>;

const float* optional_data(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined() ? tensor->data_ptr<float>() : nullptr;
}

// out [rows, width] = x [rows, depth] weight^T + bias
void product(const float* x, int64_t rows, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
             float* out) {
  attnlab_skinny::skinny(x, rows, weight.data_ptr<float>(), weight.size(0), weight.size(1),
                         optional_data(bias), out);
}

inline float dot(const float* a, const float* b, int64_t size) {
  Vec sum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size())
    sum = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), sum);
  float total = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
  for (; i < size; ++i) total += a[i] * b[i];
  return total;
}

// out[r] = (x[r] * rsqrt(mean(x[r]^2) + eps)) * weight, row by row.
void rms_norm(const float* x, int64_t rows, int64_t width, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    float* normed = out + r * width;
    const float scale = 1.f / std::sqrt(dot(row, row, width) / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i) normed[i] = (row[i] * scale) * weight[i];
  }
}

// A head's D values rotated in place: x * cos + rotate_half(x) * sin, pairs (i, i + D/2).
void rotate(float* head, const float* cos, const float* sin, int64_t head_dim, float* scratch) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) scratch[i] = -head[i + half];
  for (int64_t i = half; i < head_dim; ++i) scratch[i] = head[i - half];
  for (int64_t i = 0; i < head_dim; ++i) head[i] = head[i] * cos[i] + scratch[i] * sin[i];
}

// values[i] = e^(values[i] - shift) in place; returns their sum.
float exp_minus(float* values, int64_t size, float shift) {
  Vec sums(0.f);
  const Vec shifts(shift);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size()) {
    const Vec e = (Vec::loadu(values + i) - shifts).exp();
    e.store(values + i);
    sums = sums + e;
  }
  float total = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sums);
  for (; i < size; ++i) {
    values[i] = std::exp(values[i] - shift);
    total += values[i];
  }
  return total;
}

// gate[i] = SiLU(gate[i]) * up[i], SiLU(x) = x / (1 + e^-x).
void silu_times(float* gate, const float* up, int64_t size) {
  const Vec one(1.f);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size()) {
    const Vec g = Vec::loadu(gate + i);
    (g / (one + g.neg().exp()) * Vec::loadu(up + i)).store(gate + i);
  }
  for (; i < size; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

struct Shape {
  int64_t B, H, K, D, C, slot;
};

// The new token's attention over slots [0, slot] of one layer's cache, for every row and
// head: attended [B, H*D]; weights [B, H, 1, slot + 1] when given (nullptr: not kept).
void attend(const float* qkv, const float* keys, const float* values, const bool* allowed, const Shape& s,
            float scale, float* attended, float* weights) {
  const int64_t group = s.H / s.K, width = (s.H + 2 * s.K) * s.D, S = s.slot + 1;
  // Each (row, key/value head) pair reads S keys and values of D floats: enough pairs per
  // thread that a parallel region pays for itself.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, group * S * s.D));
  at::parallel_for(0, s.B * s.K, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> probabilities(S);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / s.K, k = pair % s.K;
      const float* key_rows = keys + (b * s.K + k) * s.C * s.D;
      const float* value_rows = values + (b * s.K + k) * s.C * s.D;
      const bool* row_allowed = allowed + b * s.C;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = k * group + g;
        const float* query = qkv + b * width + h * s.D;
        const float excluded = -std::numeric_limits<float>::infinity();
        float largest = excluded;
        for (int64_t j = 0; j < S; ++j) {
          probabilities[j] = row_allowed[j] ? dot(query, key_rows + j * s.D, s.D) * scale : excluded;
          largest = std::max(largest, probabilities[j]);
        }
        const float total = exp_minus(probabilities.data(), S, largest);  // e^-inf: 0 where excluded
        const float inverse = 1.f / total;
        float* out = attended + b * s.H * s.D + h * s.D;
        for (int64_t d = 0; d < s.D; ++d) out[d] = 0.f;
        for (int64_t j = 0; j < S; ++j) {
          probabilities[j] *= inverse;
          if (probabilities[j] == 0.f) continue;
          const Vec p(probabilities[j]);
          const float* value = value_rows + j * s.D;
          int64_t d = 0;
          for (; d + Vec::size() <= s.D; d += Vec::size())
            at::vec::fmadd(p, Vec::loadu(value + d), Vec::loadu(out + d)).store(out + d);
          for (; d < s.D; ++d) out[d] += probabilities[j] * value[d];
        }
        if (weights != nullptr) std::copy(probabilities.begin(), probabilities.end(), weights + (b * s.H + h) * S);
      }
    }
  });
}

void check_float(const at::Tensor& tensor, const char* what) {
  TORCH_CHECK(tensor.scalar_type() == at::kFloat && tensor.is_contiguous() && tensor.device().is_cpu(),
              "decode step: ", what, " must be a contiguous float32 CPU tensor");
}

// x [B, E]: the new tokens' embeddings. cos, sin [B, D] or None (no rotary). allowed [B, C]
// bool: the slots each row may attend (the new token's slot included). Per layer: the norms'
// weights, the products' weights [out, in] and optional biases, the cache's keys and values
// [B, K, C, D] (slot `slot` is written), the score scale. -> logits [B, V] and, with
// need_weights, each layer's weights [B, H, 1, slot + 1].
std::tuple<at::Tensor, std::vector<at::Tensor>> step(
    const at::Tensor& x_in, const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
    const at::Tensor& allowed, int64_t slot, at::TensorList attn_norm, at::TensorList qkv_weight,
    const c10::List<std::optional<at::Tensor>>& qkv_bias, at::TensorList o_weight,
    const c10::List<std::optional<at::Tensor>>& o_bias, at::TensorList ffn_norm, at::TensorList gate_weight,
    const c10::List<std::optional<at::Tensor>>& gate_bias, at::TensorList up_weight,
    const c10::List<std::optional<at::Tensor>>& up_bias, at::TensorList down_weight,
    const c10::List<std::optional<at::Tensor>>& down_bias, at::TensorList keys, at::TensorList values,
    at::ArrayRef<double> scales, int64_t num_heads, int64_t num_kv_heads, double eps, const at::Tensor& final_norm,
    const at::Tensor& lm_head, const std::optional<at::Tensor>& lm_head_bias, bool need_weights) {
  const int64_t layers = static_cast<int64_t>(qkv_weight.size());
  TORCH_CHECK(x_in.dim() == 2, "decode step: x must be [B, E]");
  check_float(x_in, "x");
  const size_t count = qkv_weight.size();
  TORCH_CHECK(attn_norm.size() == count && qkv_bias.size() == count && o_weight.size() == count &&
                  o_bias.size() == count && ffn_norm.size() == count && gate_weight.size() == count &&
                  gate_bias.size() == count && up_weight.size() == count && up_bias.size() == count &&
                  down_weight.size() == count && down_bias.size() == count && keys.size() == count &&
                  values.size() == count && scales.size() == count,
              "decode step: one of each weight, bias, cache and scale per layer expected");
  TORCH_CHECK(layers > 0, "decode step: at least one layer expected");
  const int64_t B = x_in.size(0), E = x_in.size(1);
  const int64_t H = num_heads, K = num_kv_heads;
  TORCH_CHECK(K > 0 && H % K == 0, "decode step: num_kv_heads must divide num_heads");
  const int64_t D = keys[0].size(3), C = keys[0].size(2);
  TORCH_CHECK(allowed.scalar_type() == at::kBool && allowed.is_contiguous() && allowed.size(0) == B &&
                  allowed.size(1) == C,
              "decode step: allowed must be a contiguous bool [B, C]");
  TORCH_CHECK(0 <= slot && slot < C, "decode step: slot outside the cache");
  const bool rotary = cos.has_value() && cos->defined();
  if (rotary) {
    check_float(*cos, "cos");
    check_float(*sin, "sin");
    TORCH_CHECK(cos->numel() == B * D && sin->numel() == B * D && D % 2 == 0,
                "decode step: cos and sin must be [B, D] with an even D");
  }
  const Shape shape{B, H, K, D, C, slot};
  const int64_t qkv_width = (H + 2 * K) * D;
  int64_t F = 0;  // the widest feed-forward net
  for (int64_t l = 0; l < layers; ++l) {
    TORCH_CHECK(qkv_weight[l].size(0) == qkv_width && qkv_weight[l].size(1) == E &&
                    o_weight[l].size(0) == E && o_weight[l].size(1) == H * D,
                "decode step: layer ", l, "'s attention products do not match the heads");
    TORCH_CHECK(keys[l].sizes() == at::IntArrayRef({B, K, C, D}) && values[l].sizes() == keys[l].sizes(),
                "decode step: layer ", l, "'s cache must be [B, K, C, D]");
    for (const at::Tensor& t : {attn_norm[l], qkv_weight[l], o_weight[l], ffn_norm[l], gate_weight[l],
                                up_weight[l], down_weight[l], keys[l], values[l]})
      check_float(t, "every weight and cache");
    const int64_t hidden = gate_weight[l].size(0);
    TORCH_CHECK(attn_norm[l].numel() == E && ffn_norm[l].numel() == E && gate_weight[l].size(1) == E &&
                    up_weight[l].sizes() == gate_weight[l].sizes() && down_weight[l].size(0) == E &&
                    down_weight[l].size(1) == hidden,
                "decode step: layer ", l, "'s norms or feed-forward products do not match the model width");
    F = std::max(F, hidden);
    for (const auto& [bias, rows] : {std::pair{qkv_bias.get(l), qkv_width}, std::pair{o_bias.get(l), E},
                                     std::pair{gate_bias.get(l), hidden}, std::pair{up_bias.get(l), hidden},
                                     std::pair{down_bias.get(l), E}})
      if (bias.has_value() && bias->defined()) {
        check_float(*bias, "every bias");
        TORCH_CHECK(bias->numel() == rows, "decode step: layer ", l, " has a bias of the wrong size");
      }
  }
  check_float(final_norm, "the final norm");
  check_float(lm_head, "the LM head");
  TORCH_CHECK(final_norm.numel() == E && lm_head.dim() == 2 && lm_head.size(1) == E,
              "decode step: the final norm or the LM head does not match the model width");
  if (lm_head_bias.has_value() && lm_head_bias->defined()) {
    check_float(*lm_head_bias, "the LM head's bias");
    TORCH_CHECK(lm_head_bias->numel() == lm_head.size(0), "decode step: the LM head's bias has the wrong size");
  }

  at::Tensor x = x_in.clone();  // the residual stream [B, E]
  auto options = x_in.options();
  at::Tensor normed = at::empty({B, E}, options), projected = at::empty({B, std::max(qkv_width, E)}, options);
  at::Tensor attended = at::empty({B, H * D}, options);
  at::Tensor gate = at::empty({B, F}, options), up = at::empty({B, F}, options);
  std::vector<float> scratch(D);
  std::vector<at::Tensor> recorded;
  float* xs = x.data_ptr<float>();
  float* ns = normed.data_ptr<float>();
  float* ps = projected.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);

  for (int64_t l = 0; l < layers; ++l) {
    rms_norm(xs, B, E, attn_norm[l].data_ptr<float>(), epsilon, ns);
    product(ns, B, qkv_weight[l], qkv_bias.get(l), ps);  // [B, (H + 2K) * D]
    float* key_store = keys[l].data_ptr<float>();
    float* value_store = values[l].data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      float* row = ps + b * qkv_width;
      if (rotary)
        for (int64_t h = 0; h < H + K; ++h)  // the query heads, then the key heads
          rotate(row + h * D, cos->data_ptr<float>() + b * D, sin->data_ptr<float>() + b * D, D, scratch.data());
      for (int64_t k = 0; k < K; ++k) {
        std::copy(row + (H + k) * D, row + (H + k + 1) * D, key_store + ((b * K + k) * C + slot) * D);
        std::copy(row + (H + K + k) * D, row + (H + K + k + 1) * D, value_store + ((b * K + k) * C + slot) * D);
      }
    }
    float* weights = nullptr;
    if (need_weights) {
      recorded.push_back(at::empty({B, H, 1, slot + 1}, options));
      weights = recorded.back().data_ptr<float>();
    }
    attend(ps, key_store, value_store, allowed.data_ptr<bool>(), shape, static_cast<float>(scales[l]),
           attended.data_ptr<float>(), weights);
    product(attended.data_ptr<float>(), B, o_weight[l], o_bias.get(l), ps);  // [B, E]
    for (int64_t i = 0; i < B * E; ++i) xs[i] += ps[i];
    rms_norm(xs, B, E, ffn_norm[l].data_ptr<float>(), epsilon, ns);
    product(ns, B, gate_weight[l], gate_bias.get(l), gate.data_ptr<float>());  // [B, F]
    product(ns, B, up_weight[l], up_bias.get(l), up.data_ptr<float>());  // [B, F]
    float* gs = gate.data_ptr<float>();
    const float* us = up.data_ptr<float>();
    silu_times(gs, us, B * gate_weight[l].size(0));
    product(gs, B, down_weight[l], down_bias.get(l), ps);  // [B, E]
    for (int64_t i = 0; i < B * E; ++i) xs[i] += ps[i];
  }
  rms_norm(xs, B, E, final_norm.data_ptr<float>(), epsilon, ns);
  at::Tensor logits = at::empty({B, lm_head.size(0)}, options);
  product(ns, B, lm_head, lm_head_bias, logits.data_ptr<float>());
  return {logits, recorded};
}

}  // namespace

TORCH_LIBRARY(attnlab_decode_step, m) {
  m.def(
      "step(Tensor x, Tensor? cos, Tensor? sin, Tensor allowed, int slot, Tensor[] attn_norm, "
      "Tensor[] qkv_weight, Tensor?[] qkv_bias, Tensor[] o_weight, Tensor?[] o_bias, Tensor[] ffn_norm, "
      "Tensor[] gate_weight, Tensor?[] gate_bias, Tensor[] up_weight, Tensor?[] up_bias, Tensor[] down_weight, "
      "Tensor?[] down_bias, Tensor[] keys, Tensor[] values, float[] scales, int num_heads, int num_kv_heads, "
      "float eps, Tensor final_norm, Tensor lm_head, Tensor? lm_head_bias, bool need_weights) "
      "-> (Tensor, Tensor[])");
  m.impl("step", c10::DispatchKey::CPU, &step);
}
