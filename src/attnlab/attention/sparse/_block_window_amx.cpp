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
// Backward: see backward_blocks (_block_window_amx_backward.cpp). The building blocks both
// use are in _block_window_amx.h.

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

#include "_block_window_amx.h"

namespace attnlab_block_window_amx {
namespace {

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

}  // namespace

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

}  // namespace attnlab_block_window_amx

TORCH_LIBRARY(attnlab_block_window_amx, m) {
  m.def(
      "forward(Tensor query, Tensor key_source, Tensor value_source, int shift, int value_shift, int spread, "
      "int heads, "
      "int blocks, Tensor window_bias, Tensor biased, Tensor global_keys, Tensor global_values, "
      "Tensor global_bias, Tensor global_queries, Tensor key_bias, float scale) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      &attnlab_block_window_amx::block_window_forward);
  m.def(
      "backward(Tensor query, Tensor key_source, Tensor value_source, int shift, int value_shift, "
      "int spread, int heads, int blocks, Tensor window_bias, Tensor biased, Tensor grad_output, "
      "Tensor output, Tensor logsumexp, Tensor global_keys, Tensor global_values, Tensor global_bias, "
      "Tensor global_queries, Tensor global_grad_output, Tensor global_row_term, Tensor global_logsumexp, "
      "Tensor key_bias, float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
      &attnlab_block_window_amx::block_window_backward);
}
