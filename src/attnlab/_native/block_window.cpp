// Block-sparse attention's windows in float32, forward and backward, on any CPU torch runs on.
//
// Dimension letters as in attention/sparse/_block_window_kernel.py: L block size, D (Dv)
// head dim of keys (values), W = spread * L window keys of a block, n query blocks.
//
// Why a kernel of our own: without it every chunk of blocks costs a dozen torch calls
// (GEMMs, bias, exp, sums), each a parallel region over buffers that leave the caches, and
// torch's fused attention cuts a block into pieces and repacks its window for each. Here
// each block is one pass: S = Q K^T over its whole window (one GEMM), the softmax on rows
// that are still in cache, O = P V (one GEMM), the 1 / sum applied to the [L, Dv] output
// rather than to the [L, W] probabilities. Written on at::vec and torch's CPU GEMM
// (cpublas::brgemm: oneDNN's small-matrix kernels, for AVX2 and AVX-512 alike), so one
// source serves every vector width; where that GEMM is missing (cpublas raises), the
// caller's check against float64 fails and torch's path serves.
//
// The G global keys join every block's softmax as G more columns (their scores and
// products beside the window's, one small GEMM each), so a padding mask and global tokens
// cost little more than the plain windows; their gradients are summed per head by each
// task and added up at the end. The global tokens' own rows (G queries over every key)
// are the caller's.
//
// Keys and values come as [blocks, L, D] sources; window offset o of query block i is
// source block i + shift + o. Offsets outside the source take no part in any product
// (the window bias removes their keys anyway: they lie outside the batch). Blocks are
// taken kChunk at a time: the keys their windows cover are transposed once per chunk
// (the GEMM takes no transposed operand), not once per window.
// Log-sum-exps are natural logs; -inf for a row without any key (output 0).
//
// Backward: see window_backward.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "block_window.h"

namespace {

using namespace attnlab_block_window;

std::tuple<Tensor, Tensor> window_forward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t key_shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& global_keys_t, const Tensor& global_values, const Tensor& global_bias,
    double scale) {
  const Problem p = problem_of(query, key_source, value_source, key_shift, value_shift, spread, heads, blocks,
                               window_bias, biased, global_keys_t.transpose(1, 2), global_keys_t,
                               global_values, global_bias, scale);
  const int64_t n = p.n, L = p.L, D = p.D, Dv = p.Dv, W = p.W, G = p.G;
  auto output = at::empty({n, L, Dv}, query.options());
  auto logsumexp = at::empty({n, L}, query.options());
  float* out = output.data_ptr<float>();
  float* lse = logsumexp.data_ptr<float>();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t ld = (kChunk + spread - 1) * L;  // columns of the transposed keys
    std::vector<float> keys_t(D * ld), scores(L * (W + G)), row_bias(W + G), inverse(L);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t chunk = index * kChunk, count = std::min(n, chunk + kChunk) - chunk;
      p.transpose_keys(chunk, count, keys_t.data(), ld);
      for (int64_t i = chunk; i < chunk + count; ++i) {
        const Span span = p.span(i);
        const int64_t columns = span.width() * L, width = columns + G;  // window keys, then global keys
        float* out_i = out + i * L * Dv;
        float* lse_i = lse + i * L;
        if (width == 0) {
          std::fill(out_i, out_i + L * Dv, 0.0f);
          std::fill(lse_i, lse_i + L, -kInf);
          continue;
        }
        const float* q_i = p.q + i * L * D;
        const float* bias = p.keys_bias(i, span, row_bias.data());
        // S = Q K^T over the window's keys and the global keys: [L, width].
        if (columns) {
          matmul(L, columns, D, q_i, D, keys_t.data() + (i - chunk + span.first) * L, ld, scores.data(),
                 width, false);
        }
        if (G) {
          matmul(L, G, D, q_i, D, p.global_keys_t + p.head_of(i) * D * G, G, scores.data() + columns, width,
                 false);
        }
        for (int64_t r = 0; r < L; ++r) {
          float* row = scores.data() + r * width;
          const float top = scale_max(row, bias, p.scale, width);
          if (top == -kInf || std::isnan(top)) {  // no key; or NaN scores, whose output is NaN
            std::fill(row, row + width, top == -kInf ? 0.0f : top);
            inverse[r] = top == -kInf ? 0.0f : top;
            lse_i[r] = top;
            continue;
          }
          const float sum = exp_sum(row, top, width);
          inverse[r] = 1.0f / sum;
          lse_i[r] = top + std::log(sum);
        }
        // O = P V, then each row divided by its sum.
        if (columns) {
          matmul(L, Dv, columns, scores.data(), width, p.v + (i + p.value_shift + span.first) * L * Dv, Dv,
                 out_i, Dv, false);
        }
        if (G) {
          matmul(L, Dv, G, scores.data() + columns, width, p.global_values + p.head_of(i) * G * Dv, Dv, out_i,
                 Dv, columns > 0);
        }
        for (int64_t r = 0; r < L; ++r) {
          const Vec factor(inverse[r]);
          at::vec::map([factor](Vec x) { return x * factor; }, out_i + r * Dv, out_i + r * Dv, Dv);
        }
      }
    }
    at::native::cpublas::brgemm_release(/*is_vnni=*/false);
  });
  return {output, logsumexp};
}

// Backward, in the transposed layout (window keys, then global keys, as rows; the block's
// queries as columns), where every product takes its operands as they lie: per block,
// S^T = K Q^T and dP^T = V dO^T; P^T = exp(scale S^T + bias - lse) from the forward's
// log-sum-exp (+inf: probability 0); dS^T = scale P^T * (dP^T - rowsum(dO * O)); then
// dV += P^T dO, dK += dS^T Q, dQ^T = K^T dS^T. Each task takes kChunk consecutive blocks
// and adds into its own sums of the key and value blocks its windows cover (padded block
// t = i + offset). Its first and last spread - 1 padded blocks are shared with its
// neighbours: they wait in edge buffers and are added after all tasks; the others go
// straight to the gradients.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> window_backward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t key_shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& global_keys, const Tensor& global_keys_t, const Tensor& global_values,
    const Tensor& global_bias, const Tensor& grad_output, const Tensor& output, const Tensor& logsumexp,
    double scale) {
  const Problem p = problem_of(query, key_source, value_source, key_shift, value_shift, spread, heads, blocks,
                               window_bias, biased, global_keys, global_keys_t, global_values, global_bias,
                               scale);
  const int64_t n = p.n, L = p.L, D = p.D, Dv = p.Dv, W = p.W, G = p.G, w = (spread - 1) / 2;
  TORCH_CHECK(global_keys.is_contiguous(), "block_window_backward: contiguous global keys");
  TORCH_CHECK(grad_output.is_contiguous() && output.is_contiguous() && logsumexp.is_contiguous() &&
                  grad_output.scalar_type() == at::kFloat && output.scalar_type() == at::kFloat &&
                  logsumexp.scalar_type() == at::kFloat,
              "block_window_backward: contiguous float32 gradient, output and log-sum-exp");
  TORCH_CHECK(grad_output.numel() == n * L * Dv && output.numel() == n * L * Dv && logsumexp.numel() == n * L,
              "block_window_backward: gradient, output or log-sum-exp of the wrong size");
  const float* dout = grad_output.data_ptr<float>();
  const float* out = output.data_ptr<float>();
  const float* lse = logsumexp.data_ptr<float>();
  auto grad_query = at::empty({n, L, D}, query.options());
  auto grad_key = at::empty({n, L, D}, query.options());
  auto grad_value = at::empty({n, L, Dv}, query.options());
  auto row_terms = at::empty({n, L}, query.options());
  const int64_t heads_total = n / blocks;
  auto global_key_grad = at::zeros({heads_total, G, D}, query.options());
  auto global_value_grad = at::zeros({heads_total, G, Dv}, query.options());
  float* dq = grad_query.data_ptr<float>();
  float* dk = grad_key.data_ptr<float>();
  float* dv = grad_value.data_ptr<float>();
  float* row_term_data = row_terms.data_ptr<float>();
  std::mutex global_sums_lock;

  const int64_t shared = spread - 1;  // padded blocks a task shares with each neighbour
  const int64_t chunk_blocks = std::max(kChunk, shared);
  const int64_t chunks = (n + chunk_blocks - 1) / chunk_blocks;
  const int64_t block_size = L * (D + Dv);  // one block's key then value sums
  const int64_t edge_size = std::max<int64_t>(shared, 1) * block_size;
  auto edges = at::empty({chunks, 2, edge_size}, query.options());
  float* edge_data = edges.data_ptr<float>();
  // Padded block t is block t - w of the sequence; those outside it are discarded.
  const auto emit = [&](const float* key_block, const float* value_block, int64_t padded) {
    if (padded < w || padded >= n + w) return;
    std::memcpy(dk + (padded - w) * L * D, key_block, L * D * sizeof(float));
    std::memcpy(dv + (padded - w) * L * Dv, value_block, L * Dv * sizeof(float));
  };

  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t local_blocks = chunk_blocks + shared, ld = local_blocks * L;
    std::vector<float> keys_t(D * ld), query_t(D * L), grad_t(Dv * L), query_grad_t(D * L);
    std::vector<float> probs_t((W + G) * L), scores_grad_t((W + G) * L), row_bias(W + G), term(L), row_lse(L);
    std::vector<float> key_sums(local_blocks * L * D), value_sums(local_blocks * L * Dv);
    // This task's sums of the global keys' and values' gradients, per head.
    std::vector<float> global_key_sums(G ? heads_total * G * D : 0);
    std::vector<float> global_value_sums(G ? heads_total * G * Dv : 0);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t chunk = index * chunk_blocks, count = std::min(n, chunk + chunk_blocks) - chunk;
      std::fill(key_sums.begin(), key_sums.end(), 0.0f);
      std::fill(value_sums.begin(), value_sums.end(), 0.0f);
      p.transpose_keys(chunk, count, keys_t.data(), ld);
      for (int64_t i = chunk; i < chunk + count; ++i) {
        float* dq_i = dq + i * L * D;
        const float* q_i = p.q + i * L * D;
        const float* dout_i = dout + i * L * Dv;
        for (int64_t r = 0; r < L; ++r) {
          term[r] = dot(dout_i + r * Dv, out + (i * L + r) * Dv, Dv);
          row_term_data[i * L + r] = term[r];
          const float e = lse[i * L + r];
          row_lse[r] = e == -kInf ? kInf : e;  // no key: probability 0
        }
        const Span span = p.span(i);
        const int64_t columns = span.width() * L, rows = columns + G;  // window keys, then global keys
        if (rows == 0) {
          std::fill(dq_i, dq_i + L * D, 0.0f);
          continue;
        }
        const int64_t head = p.head_of(i);
        const float* bias = p.keys_bias(i, span, row_bias.data());
        transpose(q_i, D, query_t.data(), L, L, D);
        transpose(dout_i, Dv, grad_t.data(), L, L, Dv);
        const int64_t local = i - chunk + span.first;  // the window's first block in the chunk's buffers
        if (columns) {
          matmul(columns, L, D, p.k + (i + p.key_shift + span.first) * L * D, D, query_t.data(), L,
                 probs_t.data(), L, false);
          matmul(columns, L, Dv, p.v + (i + p.value_shift + span.first) * L * Dv, Dv, grad_t.data(), L,
                 scores_grad_t.data(), L, false);
        }
        if (G) {
          matmul(G, L, D, p.global_keys + head * G * D, D, query_t.data(), L, probs_t.data() + columns * L, L,
                 false);
          matmul(G, L, Dv, p.global_values + head * G * Dv, Dv, grad_t.data(), L,
                 scores_grad_t.data() + columns * L, L, false);
        }
        const Vec factor(p.scale);
        for (int64_t c = 0; c < rows; ++c) {
          const float key_bias = bias ? bias[c] : 0.0f;
          const Vec key_bias_vec(key_bias);
          float* prob = probs_t.data() + c * L;
          float* ds = scores_grad_t.data() + c * L;
          int64_t r = 0;
          for (; r + Vec::size() <= L; r += Vec::size()) {
            const Vec exponent =
                Vec::loadu(prob + r) * factor + key_bias_vec - Vec::loadu(row_lse.data() + r);
            const Vec x = exponent.exp_u20();
            x.store(prob + r);
            ((Vec::loadu(ds + r) - Vec::loadu(term.data() + r)) * x * factor).store(ds + r);
          }
          for (; r < L; ++r) {
            prob[r] = std::exp(prob[r] * p.scale + key_bias - row_lse[r]);
            ds[r] = (ds[r] - term[r]) * prob[r] * p.scale;
          }
        }
        if (columns) {
          matmul(columns, Dv, L, probs_t.data(), L, dout_i, Dv, value_sums.data() + local * L * Dv, Dv, true);
          matmul(columns, D, L, scores_grad_t.data(), L, q_i, D, key_sums.data() + local * L * D, D, true);
          matmul(D, L, columns, keys_t.data() + local * L, ld, scores_grad_t.data(), L, query_grad_t.data(),
                 L, false);
        }
        if (G) {
          matmul(G, Dv, L, probs_t.data() + columns * L, L, dout_i, Dv,
                 global_value_sums.data() + head * G * Dv, Dv, true);
          matmul(G, D, L, scores_grad_t.data() + columns * L, L, q_i, D,
                 global_key_sums.data() + head * G * D, D, true);
          matmul(D, L, G, p.global_keys_t + head * D * G, G, scores_grad_t.data() + columns * L, L,
                 query_grad_t.data(), L, columns > 0);
        }
        transpose(query_grad_t.data(), L, dq_i, D, D, L);
      }
      // The sums out: the first `shared` padded blocks to this task's head buffer (the
      // first task has no neighbour before it), the last `shared` to its tail buffer (the
      // last task has none after it), the rest to the gradients.
      const bool last = index == chunks - 1;
      float* head = edge_data + (index * 2) * edge_size;
      float* tail = edge_data + (index * 2 + 1) * edge_size;
      for (int64_t t = 0; t < count + shared; ++t) {
        const float* key_block = key_sums.data() + t * L * D;
        const float* value_block = value_sums.data() + t * L * Dv;
        float* edge = nullptr;
        if (t < shared && index > 0) {
          edge = head + t * block_size;
        } else if (t >= count && !last) {
          edge = tail + (t - count) * block_size;
        }
        if (edge) {
          std::memcpy(edge, key_block, L * D * sizeof(float));
          std::memcpy(edge + L * D, value_block, L * Dv * sizeof(float));
        } else {
          emit(key_block, value_block, chunk + t);
        }
      }
    }
    at::native::cpublas::brgemm_release(/*is_vnni=*/false);
    if (G) {
      std::lock_guard<std::mutex> guard(global_sums_lock);
      float* keys_out = global_key_grad.data_ptr<float>();
      float* values_out = global_value_grad.data_ptr<float>();
      at::vec::map2<float>([](Vec a, Vec b) { return a + b; }, keys_out, keys_out, global_key_sums.data(),
                           heads_total * G * D);
      at::vec::map2<float>([](Vec a, Vec b) { return a + b; }, values_out, values_out,
                           global_value_sums.data(), heads_total * G * Dv);
    }
  });
  // The padded blocks two tasks share: task c's head plus task c - 1's tail (every task
  // but the last has chunk_blocks >= shared blocks, so no block is shared by three).
  at::parallel_for(1, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(block_size);
    for (int64_t index = begin; index < end; ++index) {
      const float* head = edge_data + (index * 2) * edge_size;
      const float* tail = edge_data + ((index - 1) * 2 + 1) * edge_size;
      for (int64_t t = 0; t < shared; ++t) {
        at::vec::map2<float>([](Vec a, Vec b) { return a + b; }, sum.data(), head + t * block_size,
                             tail + t * block_size, block_size);
        emit(sum.data(), sum.data() + L * D, index * chunk_blocks + t);
      }
    }
  });
  return {grad_query, grad_key, grad_value, global_key_grad, global_value_grad, row_terms};
}

}  // namespace

TORCH_LIBRARY(attnlab_block_window, m) {
  m.def(
      "forward(Tensor query, Tensor key_source, Tensor value_source, int key_shift, int value_shift, "
      "int spread, int heads, int blocks, Tensor window_bias, Tensor biased, Tensor global_keys_t, "
      "Tensor global_values, Tensor global_bias, float scale) -> (Tensor, Tensor)",
      &window_forward);
  m.def(
      "backward(Tensor query, Tensor key_source, Tensor value_source, int key_shift, int value_shift, "
      "int spread, int heads, int blocks, Tensor window_bias, Tensor biased, Tensor global_keys, "
      "Tensor global_keys_t, Tensor global_values, Tensor global_bias, Tensor grad_output, Tensor output, "
      "Tensor logsumexp, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
      &window_backward);
}
