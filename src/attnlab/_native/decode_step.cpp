// One decoding step of a pre-norm decoder (the Llama family, GPT-2) in one call: for every
// layer, the norm, the query/key/value product, rotary positions, the cache write,
// attention over the cache, the output product and residual, the norm, the feed-forward
// net (gated, as SwiGLU, or plain, as GPT-2's) and residual; then the final norm and the
// LM head.
//
// A step of a small model spends much of its time outside its matrix products: about 35
// torch operations per layer, each paying Python's and torch's dispatch and each running a
// few thousand elements. Here the products go to the few-row kernel (skinny.h), the rest is
// a few loops over the step's B rows, and the whole step is one call. Written on at::vec,
// so one source serves AVX2, AVX-512 and ARM.
//
// The weight matrices and the cache in float32, bfloat16 or float16 (the model's dtype: one
// for all), read as they are and widened to float32 in registers (skinny.h's load_weights:
// the same widening on every vector width; no BF16 dot-product instructions: AVX2 and NEON
// lack them, and the AVX-512 build's flags, torch's, do not enable AVX512-BF16). Everything
// else in float32: the residual stream, the norms' weights and the biases (the caller
// widens them once), the products' sums, attention; new keys and values are rounded to the
// cache's dtype when written. The operations are the module path's, in its order (RMSNorm as
// x * rsqrt(mean(x^2) + eps) then times the weight; LayerNorm as (x - mean) * rstd * weight
// + bias; rotary as x * cos + rotate_half(x) * sin; scores times the scale; softmax over the
// allowed slots; SiLU as x / (1 + e^-x), GELU with erf or its tanh form, ReLU); sums run in
// another order than torch's, so results agree to float32 rounding.
//
// Optional pieces, off by default, for the transformers families whose layers add to that
// step (each switched on by an argument): RMSNorms of the queries and keys before rotary
// positions, per head or over all heads (Qwen3, Gemma 3, OLMo 2); norms of the attention's
// and the feed-forward net's outputs before their residual adds (Gemma 2 and 3, OLMo 2),
// with either pre-norm left out (OLMo 2); a sliding window per layer, with its own rotary
// angles (Gemma 2 and 3); tanh soft-capping of the scores and of the logits (Gemma 2).
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
#include <vector>

#include "decode_attention.h"
#include "skinny.h"

namespace {

using Vec = at::vec::Vectorized<float>;
using attnlab_skinny::load_weights;  // float32, or bfloat16/float16 widened
using attnlab_decode::attend;
using attnlab_decode::Shape;

// The dot product of two float32 rows (a norm's sum of squares).
inline float dot(const float* a, const float* b, int64_t size) {
  Vec sum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size())
    sum = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), sum);
  float total = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
  for (; i < size; ++i) total += a[i] * b[i];
  return total;
}

enum Norm : int64_t { kRmsNorm = 0, kLayerNorm = 1 };

// Row by row: RMSNorm, out = (x * rsqrt(mean(x^2) + eps)) * weight; LayerNorm,
// out = (x - mean) * rsqrt(var + eps) * weight + bias (bias: nullptr for none).
void norm(int64_t kind, const float* x, int64_t rows, int64_t width, const float* weight, const float* bias,
          float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    float* normed = out + r * width;
    if (kind == kRmsNorm) {
      const float scale = 1.f / std::sqrt(dot(row, row, width) / static_cast<float>(width) + eps);
      for (int64_t i = 0; i < width; ++i) normed[i] = (row[i] * scale) * weight[i];
      continue;
    }
    float mean = 0.f;
    for (int64_t i = 0; i < width; ++i) mean += row[i];
    mean /= static_cast<float>(width);
    float variance = 0.f;
    for (int64_t i = 0; i < width; ++i) variance += (row[i] - mean) * (row[i] - mean);
    const float scale = 1.f / std::sqrt(variance / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i)
      normed[i] = (row[i] - mean) * scale * weight[i] + (bias != nullptr ? bias[i] : 0.f);
  }
}

// A head's D values rotated in place: x * cos + rotate_half(x) * sin, pairs (i, i + D/2).
void rotate(float* head, const float* cos, const float* sin, int64_t head_dim, float* scratch) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) scratch[i] = -head[i + half];
  for (int64_t i = half; i < head_dim; ++i) scratch[i] = head[i - half];
  for (int64_t i = 0; i < head_dim; ++i) head[i] = head[i] * cos[i] + scratch[i] * sin[i];
}

enum Activation : int64_t { kSilu = 0, kGelu = 1, kGeluTanh = 2, kRelu = 3 };

template <int64_t kind, typename T>
inline T activate(const T& x) {
  const T half(0.5f), one(1.f);
  if constexpr (kind == kSilu) {
    return x / (one + (T(0.f) - x).exp());
  } else if constexpr (kind == kGelu) {
    return half * x * (one + (x * T(static_cast<float>(M_SQRT1_2))).erf());
  } else if constexpr (kind == kGeluTanh) {
    const T inner = T(0.7978845608028654f) * (x + T(0.044715f) * x * x * x);  // sqrt(2 / pi)
    return half * x * (one + inner.tanh());
  } else {
    return at::vec::maximum(x, T(0.f));
  }
}

// hidden[i] = activation(hidden[i]) * (up[i], when given): the feed-forward net's middle,
// gated (SwiGLU and its kin) or plain.
template <int64_t kind>
void activation_times(float* hidden, const float* up, int64_t size) {
  int64_t i = 0;
  for (; i + Vec::size() <= size; i += Vec::size()) {
    Vec h = activate<kind>(Vec::loadu(hidden + i));
    if (up != nullptr) h = h * Vec::loadu(up + i);
    h.store(hidden + i);
  }
  if (i < size) {  // the tail, through a zero-padded vector
    const int64_t rest = size - i;
    Vec h = activate<kind>(Vec::loadu(hidden + i, rest));
    if (up != nullptr) h = h * Vec::loadu(up + i, rest);
    h.store(hidden + i, rest);
  }
}

void activation_times(int64_t kind, float* hidden, const float* up, int64_t size) {
  switch (kind) {
    case kSilu: return activation_times<kSilu>(hidden, up, size);
    case kGelu: return activation_times<kGelu>(hidden, up, size);
    case kGeluTanh: return activation_times<kGeluTanh>(hidden, up, size);
    default: return activation_times<kRelu>(hidden, up, size);
  }
}

// Calls f(T()) with T the C++ type of `dtype`: float, at::BFloat16 or at::Half.
template <typename F>
void with_type(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kBFloat16: return f(at::BFloat16());
    case at::kHalf: return f(at::Half());
    default: return f(0.f);
  }
}

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
}

void check_type(const at::Tensor& tensor, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(tensor.scalar_type() == dtype && tensor.is_contiguous() && tensor.device().is_cpu(),
              "decode step: ", what, " must be a contiguous ", dtype_name(dtype), " CPU tensor");
}

void check_float(const at::Tensor& tensor, const char* what) { check_type(tensor, at::kFloat, what); }

// The new token's key or value [count] into a cache at `offset`, rounded to its dtype.
void write_slot(const float* from, const at::Tensor& cache, int64_t offset, int64_t count) {
  with_type(cache.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    std::copy(from, from + count, cache.data_ptr<T>() + offset);
  });
}

void attend(const float* qkv, const at::Tensor& keys, const at::Tensor& values, const bool* allowed,
            const Shape& s, float scale, float* attended, float* weights, int64_t first = 0,
            float softcap = 0.f) {
  with_type(keys.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    attend<T>(qkv, keys.data_ptr<T>(), values.data_ptr<T>(), allowed, s, scale, attended, weights, first,
              softcap);
  });
}

// The entries of `weights` for each layer, in this order; after the last layer's, the final
// norm's weight and bias and the LM head's weight and bias. Biases may be None, and so may
// the gate's weight (a plain feed-forward net: activation(in(x)); gated:
// activation(gate(x)) * in(x)). The matrices (2-d entries) in the dtype of the LM head's
// weight, the rest (norms' weights, biases: 1-d) in float32.
enum Entry : int64_t {
  kAttnNormWeight, kAttnNormBias, kQkvWeight, kQkvBias, kOutWeight, kOutBias, kFfnNormWeight, kFfnNormBias,
  kInWeight, kInBias, kGateWeight, kGateBias, kDownWeight, kDownBias, kPerLayer
};

// The entries of `extras` for each layer, each None or a float32 weight (1-d, as every
// norm's weight): the queries' and the keys' RMSNorm ([D]: per head; [H*D] or [K*D]: over
// all heads), the attention output's and the feed-forward output's norm ([E], before the
// residual add).
enum Extra : int64_t { kQueryNorm, kKeyNorm, kPostAttnNorm, kPostFfnNorm, kExtrasPerLayer };

// x [B, E]: the new tokens' embeddings (float32). cos, sin [B, D] (float32) or None (no
// rotary). allowed [B, C] bool: the slots each row may attend (the new token's slot
// included). weights: see Entry. keys, values: each layer's cache [B, K, C, D] in the
// matrices' dtype (slot `slot` is written). scales: each layer's score scale. -> logits
// [B, V] (float32) and, with need_weights, each layer's weights [B, H, 1, slot + 1] (float32).
// The optional pieces: extras (see Extra; empty: none), windows (per layer; 0: none; empty:
// none), cos_local and sin_local (float32: the angles of the layers with a window),
// attention_softcap and logit_softcap (0: none).
std::tuple<at::Tensor, std::vector<at::Tensor>> step(
    const at::Tensor& x_in, const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
    const at::Tensor& allowed, int64_t slot, const c10::List<std::optional<at::Tensor>>& weight_list,
    at::TensorList keys, at::TensorList values, at::ArrayRef<double> scales, int64_t num_heads,
    int64_t num_kv_heads, int64_t norm_kind, double eps, int64_t activation, bool need_weights,
    const std::optional<c10::List<std::optional<at::Tensor>>>& extra_list, at::IntArrayRef windows,
    const std::optional<at::Tensor>& cos_local, const std::optional<at::Tensor>& sin_local,
    double attention_softcap, double logit_softcap) {
  std::vector<at::Tensor> weights;  // undefined tensors for the None entries
  weights.reserve(weight_list.size());
  for (const std::optional<at::Tensor>& entry : weight_list) weights.push_back(entry.value_or(at::Tensor()));
  std::vector<at::Tensor> extras;
  if (extra_list.has_value())
    for (const std::optional<at::Tensor>& entry : *extra_list) extras.push_back(entry.value_or(at::Tensor()));
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(extras.empty() || static_cast<int64_t>(extras.size()) == layers * kExtrasPerLayer,
              "decode step: no extras, or ", kExtrasPerLayer, " per layer");
  TORCH_CHECK(windows.empty() || static_cast<int64_t>(windows.size()) == layers,
              "decode step: no windows, or one per layer");
  TORCH_CHECK(layers > 0 && values.size() == keys.size() && scales.size() == keys.size() &&
                  static_cast<int64_t>(weights.size()) == layers * kPerLayer + 4,
              "decode step: one cache, one scale and ", kPerLayer, " weights per layer expected, then 4");
  TORCH_CHECK(norm_kind == kRmsNorm || norm_kind == kLayerNorm, "decode step: unknown norm ", norm_kind);
  TORCH_CHECK(kSilu <= activation && activation <= kRelu, "decode step: unknown activation ", activation);
  TORCH_CHECK(x_in.dim() == 2, "decode step: x must be [B, E]");
  check_float(x_in, "x");
  const int64_t B = x_in.size(0), E = x_in.size(1);
  const int64_t H = num_heads, K = num_kv_heads;
  TORCH_CHECK(K > 0 && H % K == 0, "decode step: num_kv_heads must divide num_heads");
  TORCH_CHECK(keys[0].dim() == 4, "decode step: the cache must be [B, K, C, D]");
  const int64_t D = keys[0].size(3), C = keys[0].size(2);
  TORCH_CHECK(allowed.scalar_type() == at::kBool && allowed.is_contiguous() && allowed.dim() == 2 &&
                  allowed.size(0) == B && allowed.size(1) == C,
              "decode step: allowed must be a contiguous bool [B, C]");
  TORCH_CHECK(0 <= slot && slot < C, "decode step: slot outside the cache");
  const bool rotary = cos.has_value() && cos->defined();
  TORCH_CHECK(rotary == (sin.has_value() && sin->defined()), "decode step: cos and sin come together, or neither");
  if (rotary) {
    check_float(*cos, "cos");
    check_float(*sin, "sin");
    TORCH_CHECK(cos->numel() == B * D && sin->numel() == B * D && D % 2 == 0,
                "decode step: cos and sin must be [B, D] with an even D");
  }
  const bool local = cos_local.has_value() && cos_local->defined();
  TORCH_CHECK(local == (sin_local.has_value() && sin_local->defined()) && (!local || rotary),
              "decode step: cos_local and sin_local come together, with cos and sin");
  if (local) {
    check_float(*cos_local, "cos_local");
    check_float(*sin_local, "sin_local");
    TORCH_CHECK(cos_local->numel() == B * D && sin_local->numel() == B * D,
                "decode step: cos_local and sin_local must be [B, D]");
  }
  const Shape shape{B, H, K, D, C, slot};
  const int64_t qkv_width = (H + 2 * K) * D;
  const bool gated = weights[kGateWeight].defined();
  const at::Tensor& head = weights[layers * kPerLayer + 2];  // the LM head's weight: the matrices' dtype
  const at::ScalarType dtype = head.defined() ? head.scalar_type() : at::kFloat;
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "decode step: float32, bfloat16 or float16 weights expected, got ", dtype);

  // Every entry a contiguous CPU tensor of the size the model's widths give it: matrices in
  // `dtype`, vectors in float32.
  auto check = [&](int64_t layer, int64_t entry, at::IntArrayRef sizes, bool optional) {
    const at::Tensor& t = weights[layer * kPerLayer + entry];
    if (!t.defined()) {
      TORCH_CHECK(optional, "decode step: layer ", layer, " lacks weight entry ", entry);
      return;
    }
    if (sizes.size() == 2)
      check_type(t, dtype, "every weight matrix and cache");
    else
      check_float(t, "every norm weight and bias");
    TORCH_CHECK(t.sizes() == sizes, "decode step: layer ", layer, "'s weight entry ", entry, " is ", t.sizes(),
                ", expected ", sizes);
  };
  int64_t F = 0;  // the widest feed-forward net
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor& in = weights[l * kPerLayer + kInWeight];
    TORCH_CHECK(in.defined() && in.dim() == 2, "decode step: layer ", l, " lacks its feed-forward product");
    const int64_t hidden = in.size(0);
    F = std::max(F, hidden);
    check(l, kAttnNormWeight, {E}, true);  // None: no norm before attention (OLMo 2)
    check(l, kAttnNormBias, {E}, true);
    check(l, kQkvWeight, {qkv_width, E}, false);
    check(l, kQkvBias, {qkv_width}, true);
    check(l, kOutWeight, {E, H * D}, false);
    check(l, kOutBias, {E}, true);
    check(l, kFfnNormWeight, {E}, true);
    check(l, kFfnNormBias, {E}, true);
    check(l, kInWeight, {hidden, E}, false);
    check(l, kInBias, {hidden}, true);
    TORCH_CHECK(weights[l * kPerLayer + kGateWeight].defined() == gated,
                "decode step: every layer's feed-forward net must be gated, or none");
    check(l, kGateWeight, {hidden, E}, true);
    check(l, kGateBias, {hidden}, true);
    check(l, kDownWeight, {E, hidden}, false);
    check(l, kDownBias, {E}, true);
    for (int64_t e = 0; e < static_cast<int64_t>(extras.empty() ? 0 : kExtrasPerLayer); ++e) {
      const at::Tensor& t = extras[l * kExtrasPerLayer + e];
      if (!t.defined()) continue;
      check_float(t, "every extra weight");
      const int64_t heads = e == kQueryNorm ? H : K;
      const bool fits = e >= kPostAttnNorm ? t.size(0) == E : (t.size(0) == D || t.size(0) == heads * D);
      TORCH_CHECK(t.dim() == 1 && fits, "decode step: layer ", l, "'s extra entry ", e,
                  " has a size the model's widths do not give it");
    }
    for (const at::Tensor& store : {keys[l], values[l]}) {
      check_type(store, dtype, "every weight matrix and cache");
      TORCH_CHECK(store.sizes() == at::IntArrayRef({B, K, C, D}), "decode step: layer ", l,
                  "'s cache must be [B, K, C, D]");
    }
  }
  const at::Tensor* last = weights.data() + layers * kPerLayer;  // final norm weight, bias; LM head weight, bias
  TORCH_CHECK(last[2].defined() && last[2].dim() == 2, "decode step: the LM head's weight is missing");
  const int64_t V = last[2].size(0);
  check(layers, 0, {E}, false);
  check(layers, 1, {E}, true);
  check(layers, 2, {V, E}, false);
  check(layers, 3, {V}, true);

  auto data = [](const at::Tensor& t) -> float* { return t.defined() ? t.data_ptr<float>() : nullptr; };
  auto product = [&](const float* x, const at::Tensor& weight, const at::Tensor& bias, float* out) {
    // out [B, rows of weight] = x [B, depth] weight^T + bias
    with_type(dtype, [&](auto zero) {
      using W = decltype(zero);
      attnlab_skinny::skinny(x, B, weight.data_ptr<W>(), weight.size(0), weight.size(1), data(bias), out);
    });
  };
  at::Tensor x = x_in.clone();  // the residual stream [B, E]
  auto options = x_in.options();
  at::Tensor normed = at::empty({B, E}, options), projected = at::empty({B, std::max(qkv_width, E)}, options);
  at::Tensor attended = at::empty({B, H * D}, options);
  at::Tensor hidden = at::empty({B, F}, options), gate = at::empty({B, gated ? F : 0}, options);
  std::vector<float> scratch(D);
  std::vector<at::Tensor> recorded;
  float* xs = x.data_ptr<float>();
  float* ns = normed.data_ptr<float>();
  float* ps = projected.data_ptr<float>();
  float* hs = hidden.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  // normed = norm(x), or x itself where the layer has no norm there
  auto pre_norm = [&](const at::Tensor& weight, const at::Tensor& bias) {
    if (weight.defined())
      norm(norm_kind, xs, B, E, data(weight), data(bias), epsilon, ns);
    else
      std::copy(xs, xs + B * E, ns);
  };
  // x += the sublayer's output [B, E] (in projected), normed first where a weight is given
  auto add_residual = [&](const float* post_weight) {
    if (post_weight != nullptr) norm(kRmsNorm, ps, B, E, post_weight, nullptr, epsilon, ps);
    for (int64_t i = 0; i < B * E; ++i) xs[i] += ps[i];
  };

  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + l * kPerLayer;
    const at::Tensor* extra = extras.empty() ? nullptr : extras.data() + l * kExtrasPerLayer;
    auto extra_data = [&](int64_t e) -> const float* { return extra == nullptr ? nullptr : data(extra[e]); };
    pre_norm(w[kAttnNormWeight], w[kAttnNormBias]);
    product(ns, w[kQkvWeight], w[kQkvBias], ps);  // [B, (H + 2K) * D]
    for (int64_t e : {kQueryNorm, kKeyNorm}) {  // groups of D (per head) or of all heads' features
      const float* weight = extra_data(e);
      if (weight == nullptr) continue;
      const int64_t group = extra[e].size(0), offset = e == kQueryNorm ? 0 : H * D;
      const int64_t count = (e == kQueryNorm ? H : K) * D / group;
      for (int64_t b = 0; b < B; ++b) {
        float* part = ps + b * qkv_width + offset;
        norm(kRmsNorm, part, count, group, weight, nullptr, epsilon, part);
      }
    }
    const bool use_local = local && !windows.empty() && windows[l] > 0;
    const float* layer_cos = rotary ? (use_local ? cos_local : cos)->data_ptr<float>() : nullptr;
    const float* layer_sin = rotary ? (use_local ? sin_local : sin)->data_ptr<float>() : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      float* row = ps + b * qkv_width;
      if (rotary)
        for (int64_t h = 0; h < H + K; ++h)  // the query heads, then the key heads
          rotate(row + h * D, layer_cos + b * D, layer_sin + b * D, D, scratch.data());
      for (int64_t k = 0; k < K; ++k) {
        write_slot(row + (H + k) * D, keys[l], ((b * K + k) * C + slot) * D, D);
        write_slot(row + (H + K + k) * D, values[l], ((b * K + k) * C + slot) * D, D);
      }
    }
    float* kept = nullptr;
    if (need_weights) {
      recorded.push_back(at::empty({B, H, 1, slot + 1}, options));
      kept = recorded.back().data_ptr<float>();
    }
    const int64_t window = windows.empty() ? 0 : windows[l];
    attend(ps, keys[l], values[l], allowed.data_ptr<bool>(), shape, static_cast<float>(scales[l]),
           attended.data_ptr<float>(), kept, window > 0 ? std::max<int64_t>(0, slot - window + 1) : 0,
           static_cast<float>(attention_softcap));
    product(attended.data_ptr<float>(), w[kOutWeight], w[kOutBias], ps);  // [B, E]
    add_residual(extra_data(kPostAttnNorm));
    pre_norm(w[kFfnNormWeight], w[kFfnNormBias]);
    const int64_t width = w[kInWeight].size(0);
    product(ns, w[kInWeight], w[kInBias], hs);  // [B, F]
    if (gated) {
      float* gs = gate.data_ptr<float>();
      product(ns, w[kGateWeight], w[kGateBias], gs);  // [B, F]
      activation_times(activation, gs, hs, B * width);
      product(gs, w[kDownWeight], w[kDownBias], ps);  // [B, E]
    } else {
      activation_times(activation, hs, nullptr, B * width);
      product(hs, w[kDownWeight], w[kDownBias], ps);  // [B, E]
    }
    add_residual(extra_data(kPostFfnNorm));
  }
  norm(norm_kind, xs, B, E, data(last[0]), data(last[1]), epsilon, ns);
  at::Tensor logits = at::empty({B, V}, options);
  product(ns, last[2], last[3], logits.data_ptr<float>());
  if (logit_softcap > 0) logits = at::tanh(logits / logit_softcap) * logit_softcap;
  return {logits, recorded};
}

}  // namespace

TORCH_LIBRARY(attnlab_decode_step, m) {
  m.def(
      "step(Tensor x, Tensor? cos, Tensor? sin, Tensor allowed, int slot, Tensor?[] weights, Tensor[] keys, "
      "Tensor[] values, float[] scales, int num_heads, int num_kv_heads, int norm, float eps, int activation, "
      "bool need_weights, Tensor?[]? extras=None, int[] windows=[], Tensor? cos_local=None, "
      "Tensor? sin_local=None, float attention_softcap=0., float logit_softcap=0.) -> (Tensor, Tensor[])");
  m.impl("step", c10::DispatchKey::CPU, &step);
}
