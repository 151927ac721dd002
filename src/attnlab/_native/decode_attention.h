// A decoding step's attention over one layer's cache (decode_step.cpp): the new token's
// query heads against every cached key and value, in float32, the cache in its dtype
// (float32, bfloat16 or float16, widened in registers by skinny.h's load_weights).
//
// The query heads that share a key/value head (a group, under grouped-query attention) go
// together: each cached key and value is loaded and widened once for the whole group, and
// each head's dot products and weighted sums run in their own vector accumulators (the
// sums stay in registers over all keys), so that several independent chains of
// multiply-adds are in flight. Against one dot per key and head with the sums kept in
// memory, whole steps took 2-5 % less (12 x 768 Llama, 144 and 520 cached positions, 1 and
// 8 rows, float32 and bfloat16, interleaved runs on an AVX2 EPYC): the products dominate.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "skinny.h"

namespace attnlab_decode {

using Vec = at::vec::Vectorized<float>;
using attnlab_skinny::load_weights;

// values[i] = e^(values[i] - shift) in place; returns their sum.
inline float exp_minus(float* values, int64_t size, float shift) {
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

struct Shape {
  int64_t B, H, K, D, C, slot;
};

// f(N, first head) for the heads [0, count) in blocks of up to 4 (N a compile-time count).
template <typename F>
inline void in_blocks_of_heads(int64_t count, F&& f) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) f(std::integral_constant<int64_t, 4>(), i);
  switch (count - i) {
    case 3: f(std::integral_constant<int64_t, 3>(), i); break;
    case 2: f(std::integral_constant<int64_t, 2>(), i); break;
    case 1: f(std::integral_constant<int64_t, 1>(), i); break;
    default: break;
  }
}

// out[i * stride] = dot(query i, key) for N queries D floats apart.
template <int64_t N, typename T>
inline void head_dots(const float* queries, int64_t D, const T* key, float* out, int64_t stride) {
  Vec acc[N];
  for (int64_t i = 0; i < N; ++i) acc[i] = Vec(0.f);
  for (int64_t d = 0; d < D; d += Vec::size()) {
    const int64_t size = std::min<int64_t>(Vec::size(), D - d);
    const Vec k = load_weights(key + d, size);  // zeros past `size`
    for (int64_t i = 0; i < N; ++i) acc[i] = at::vec::fmadd(Vec::loadu(queries + i * D + d, size), k, acc[i]);
  }
  for (int64_t i = 0; i < N; ++i)
    out[i * stride] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc[i]);
}

// out[i * D + d] = sum over j in [first, S) of p[i * S + j] * value j [d], for N heads; D in
// slices of two vectors, each slice's 2N sums in registers over all j.
template <int64_t N, typename T>
inline void head_values(const float* p, int64_t S, int64_t first, const T* values, int64_t D, float* out) {
  for (int64_t d = 0; d < D; d += 2 * Vec::size()) {
    const int64_t low = std::min<int64_t>(Vec::size(), D - d), high = std::min<int64_t>(Vec::size(), D - d - low);
    Vec acc[N][2];
    for (int64_t i = 0; i < N; ++i) acc[i][0] = acc[i][1] = Vec(0.f);
    for (int64_t j = first; j < S; ++j) {
      const T* value = values + j * D + d;
      const Vec v0 = load_weights(value, low);
      const Vec v1 = high > 0 ? load_weights(value + Vec::size(), high) : Vec(0.f);
      for (int64_t i = 0; i < N; ++i) {
        const Vec weight(p[i * S + j]);
        acc[i][0] = at::vec::fmadd(weight, v0, acc[i][0]);
        acc[i][1] = at::vec::fmadd(weight, v1, acc[i][1]);
      }
    }
    for (int64_t i = 0; i < N; ++i) {
      acc[i][0].store(out + i * D + d, low);
      if (high > 0) acc[i][1].store(out + i * D + d + Vec::size(), high);
    }
  }
}

// The new token's attention over slots [first, slot] of one layer's cache (T: its dtype),
// for every row and head: attended [B, H*D]; weights [B, H, 1, slot + 1] when given
// (nullptr: not kept). softcap > 0: scores become tanh(score / softcap) * softcap.
template <typename T>
void attend(const float* qkv, const T* keys, const T* values, const bool* allowed, const Shape& s,
            float scale, float* attended, float* weights, int64_t first, float softcap) {
  const int64_t group = s.H / s.K, width = (s.H + 2 * s.K) * s.D, S = s.slot + 1, D = s.D;
  // Each (row, key/value head) pair reads S keys and values of D floats: enough pairs per
  // thread that a parallel region pays for itself.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, group * S * D));
  const float excluded = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, s.B * s.K, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> probabilities(group * S);  // [group, S]
    float* p = probabilities.data();
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / s.K, k = pair % s.K;
      const T* key_rows = keys + (b * s.K + k) * s.C * D;
      const T* value_rows = values + (b * s.K + k) * s.C * D;
      const bool* row_allowed = allowed + b * s.C;
      const float* queries = qkv + b * width + k * group * D;  // the group's heads, D apart
      for (int64_t j = 0; j < S; ++j) {
        if (!row_allowed[j] || j < first) {
          for (int64_t g = 0; g < group; ++g) p[g * S + j] = excluded;
          continue;
        }
        in_blocks_of_heads(group, [&](auto n, int64_t g) {
          head_dots<decltype(n)::value>(queries + g * D, D, key_rows + j * D, p + g * S + j, S);
        });
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = p + g * S;
        float largest = excluded;
        for (int64_t j = 0; j < S; ++j) {
          if (row[j] == excluded) continue;
          row[j] *= scale;
          if (softcap > 0.f) row[j] = std::tanh(row[j] / softcap) * softcap;  // tanh(score / cap) * cap
          largest = std::max(largest, row[j]);
        }
        const float inverse = 1.f / exp_minus(row, S, largest);  // e^-inf: 0 where excluded
        for (int64_t j = 0; j < S; ++j) row[j] *= inverse;
      }
      float* out = attended + b * s.H * D + k * group * D;
      in_blocks_of_heads(group, [&](auto n, int64_t g) {
        head_values<decltype(n)::value>(p + g * S, S, first, value_rows, D, out + g * D);
      });
      if (weights != nullptr)
        for (int64_t g = 0; g < group; ++g)
          std::copy(p + g * S, p + (g + 1) * S, weights + (b * s.H + k * group + g) * S);
    }
  });
}

}  // namespace attnlab_decode
