// The AMX kernel's backward. The forward, and why a kernel of our own: _block_window_amx.cpp;
// the building blocks both use: _block_window_amx.h. Dimension letters as in
// _block_window_amx.cpp.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "_block_window_amx.h"

namespace attnlab_block_window_amx {
namespace {

// Bfloat16 rows [D / 2, cols, 2] (VNNI pairs) -> [D, ld]: each pair of rows de-interleaved.
// cols: a multiple of 16.
void unpack_pairs(const BFloat16* packed, int64_t D, int64_t cols, int64_t ld, BFloat16* out) {
  alignas(64) int16_t even_index[32], odd_index[32];
  for (int i = 0; i < 32; ++i) {
    even_index[i] = static_cast<int16_t>(2 * i);
    odd_index[i] = static_cast<int16_t>(2 * i + 1);
  }
  const __m512i even = _mm512_load_si512(even_index), odd = _mm512_load_si512(odd_index);
  for (int64_t pair = 0; pair < D / 2; ++pair) {
    const BFloat16* source = packed + pair * cols * 2;
    int64_t x = 0;
    for (; x + 32 <= cols; x += 32) {
      const __m512i a = _mm512_loadu_si512(source + 2 * x), b = _mm512_loadu_si512(source + 2 * x + 32);
      _mm512_storeu_si512(out + 2 * pair * ld + x, _mm512_permutex2var_epi16(a, even, b));
      _mm512_storeu_si512(out + (2 * pair + 1) * ld + x, _mm512_permutex2var_epi16(a, odd, b));
    }
    if (x < cols) {  // the last 16 columns: the low halves
      const __m512i a = _mm512_loadu_si512(source + 2 * x), b = _mm512_setzero_si512();
      _mm512_mask_storeu_epi16(out + 2 * pair * ld + x, 0xFFFF, _mm512_permutex2var_epi16(a, even, b));
      _mm512_mask_storeu_epi16(out + (2 * pair + 1) * ld + x, 0xFFFF, _mm512_permutex2var_epi16(a, odd, b));
    }
  }
}

// Rows [rows, D] -> their transpose [D, ld] (columns from `valid` on are zeros).
void transpose_rows(const float* x, int64_t rows, int64_t valid, int64_t D, int64_t ld, float* out,
                    float* /*scratch*/) {
  pack_keys(x, rows, valid, D, ld, out);  // in float32 the packed keys are K^T
}

void transpose_rows(const BFloat16* x, int64_t rows, int64_t valid, int64_t D, int64_t ld, BFloat16* out,
                    BFloat16* scratch) {
  pack_keys(x, rows, valid, D, rows, scratch);  // [D / 2, rows, 2]
  unpack_pairs(scratch, D, rows, ld, out);
}

// x [rows, cols] as the right operand of a product (float32: itself; bfloat16: VNNI in scratch).
const float* right_operand(const float* x, int64_t, int64_t, float*) { return x; }

const BFloat16* right_operand(const BFloat16* x, int64_t rows, int64_t cols, BFloat16* scratch) {
  pack_values(x, rows, rows, cols, scratch);
  return scratch;
}

// out [L, D] <- the transpose of x [D, L] (float32), rounded to out's type.
template <typename T>
void store_transposed(const float* x, int64_t D, int64_t L, T* out) {
  __m512i tile[16];
  for (int64_t l = 0; l < L; l += 16) {  // 16 whole rows of out at a time: each cache line written once
    for (int64_t d = 0; d < D; d += 16) {
      for (int i = 0; i < 16; ++i) tile[i] = _mm512_loadu_si512(x + (d + i) * L + l);
      transpose_16x16(tile);
      for (int i = 0; i < 16; ++i) store16(out + (l + i) * D + d, _mm512_castsi512_ps(tile[i]));
    }
  }
}

// The softmax backward on rows of P^T: for row x (one key) and column y (one query),
// p = 2^(s c + bias[x] - lse2[y]) and ds = scale p (dp - term[y]), rounded to T. bias:
// base 2, one per row (nullptr: none); lse2 in base 2, +inf where a query has no key or
// is replaced (its probabilities are 0). width: a multiple of 16.
template <typename T>
void softmax_backward_rows(const float* scores, const float* probs_grad, int64_t rows, int64_t width,
                           const float* bias, const float* lse2, const float* term, float c, float scale,
                           T* probs, T* scores_grad) {
  const __m512 vc = _mm512_set1_ps(c), vs = _mm512_set1_ps(scale);
  for (int64_t x = 0; x < rows; ++x) {
    const float b = bias ? bias[x] : 0.0f;
    T* p_row = probs + x * width;
    T* ds_row = scores_grad + x * width;
    if (b == -INFINITY) {  // a key the rows may not attend
      std::memset(p_row, 0, width * sizeof(T));
      std::memset(ds_row, 0, width * sizeof(T));
      continue;
    }
    const __m512 vb = _mm512_set1_ps(b);
    const float* s_row = scores + x * width;
    const float* dp_row = probs_grad + x * width;
    for (int64_t y = 0; y < width; y += 16) {
      const __m512 t = _mm512_sub_ps(_mm512_fmadd_ps(_mm512_loadu_ps(s_row + y), vc, vb),
                                     _mm512_loadu_ps(lse2 + y));
      const __m512 p = exp2_nonpositive(t);
      const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, vs),
                                      _mm512_sub_ps(_mm512_loadu_ps(dp_row + y), _mm512_loadu_ps(term + y)));
      store16(p_row + y, p);
      store16(ds_row + y, ds);
    }
  }
}

// The global tokens' gradients summed by one thread over the heads of its blocks
// ([first_head, first_head + heads)), merged after the parallel loop: their keys' and
// values' [heads, Gp, D|Dv] and their rows' queries' (transposed) [heads, D, Gp], float32.
struct GlobalGradients {
  int64_t first_head = 0, heads = 0;
  std::vector<float> keys, values, queries_t;
};

// The gradients of block-sparse attention, given the forward's output and log-sum-exp:
// the window keys', the global keys' and the global tokens' rows' parts. Everything is
// computed key-major; for block i and its window keys:
//   S^T = K Q^T, P^T = 2^(S^T c + bias - lse), dP^T = V dO^T, dS^T = scale P^T (dP^T - rowsum(dO O)),
//   dV += P^T dO, dK += dS^T Q, dQ^T = K^T dS^T,
// so that only the small [L, D] blocks of Q and dO are transposed, never a [W, L] matrix.
// The global keys are Gp more rows of the same products (their dK, dV summed per head);
// the global tokens' rows, which attend every key, are Gp more queries of each block's own
// keys (their dQ summed per head). Window i adds to the key blocks i - w .. i + w: each
// chunk of C >= 2 * 2 w query blocks sums its windows' key and value gradients in a float32
// buffer of its own (C + 2 w blocks, in cache), writes the blocks no other chunk reaches
// straight to the output, and leaves the 2 w blocks it shares with each neighbour in edge
// buffers, added up after the parallel loop.
template <typename T>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> backward_blocks(
    const Tensor& query,  // [n, L, D]
    const Tensor& key_source,  // [S, L, D]: window i is source blocks i + shift .. + spread
    const Tensor& value_source,  // [Sv, L, Dv]
    int64_t shift,
    int64_t value_shift,
    int64_t spread,
    int64_t heads,
    int64_t blocks,
    const Tensor& window_bias,  // [B N, W] float32
    const Tensor& biased,  // [B N] bool
    const Tensor& grad_output,  // [n, L, Dv]
    const Tensor& output,  // [n, L, Dv]
    const Tensor& logsumexp,  // [n, L] float32: -inf where a row has no key, +inf where it is replaced
    const Tensor& global_keys,  // [B H, G, D]
    const Tensor& global_values,  // [B H, G, Dv]
    const Tensor& global_bias,  // [B N, G] float32
    const Tensor& global_queries,  // [B H, G, D]: the global tokens' queries
    const Tensor& global_grad_output,  // [B H, G, Dv]: their rows' output gradient
    const Tensor& global_row_term,  // [B H, G] float32: rowsum(dO O) of their rows
    const Tensor& global_logsumexp,  // [B H, G] float32: their rows' log-sum-exp
    const Tensor& key_bias,  // [B, N L] float32: every key's bias for them
    double scale) {
  constexpr auto dtype = c10::CppTypeToScalarType<T>::value;
  TORCH_CHECK(key_source.scalar_type() == dtype && value_source.scalar_type() == dtype &&
              grad_output.scalar_type() == dtype && output.scalar_type() == dtype &&
              global_keys.scalar_type() == dtype && global_values.scalar_type() == dtype &&
              global_queries.scalar_type() == dtype && global_grad_output.scalar_type() == dtype,
              "block_window_backward: queries, keys, values, global tokens and gradients of one dtype");
  for (const Tensor* x : {&query, &key_source, &value_source, &window_bias, &biased, &grad_output, &output,
                          &logsumexp, &global_keys, &global_values, &global_bias, &global_queries,
                          &global_grad_output, &global_row_term, &global_logsumexp, &key_bias}) {
    TORCH_CHECK(x->is_contiguous(), "block_window_backward: contiguous inputs only");
  }
  TORCH_CHECK(window_bias.scalar_type() == at::kFloat && logsumexp.scalar_type() == at::kFloat &&
              global_bias.scalar_type() == at::kFloat && global_row_term.scalar_type() == at::kFloat &&
              global_logsumexp.scalar_type() == at::kFloat && key_bias.scalar_type() == at::kFloat &&
              biased.scalar_type() == at::kBool, "block_window_backward: float32 biases and sums, bool rows");
  const int64_t n = query.size(0), L = query.size(1), D = query.size(2);
  const int64_t S = key_source.size(0), Sv = value_source.size(0), Dv = value_source.size(2);
  const int64_t W = spread * L, w = (spread - 1) / 2, G = global_keys.size(1), Gp = round_up(G, kGlobalAlign);
  TORCH_CHECK(L % kAlign == 0 && D % kAlign == 0 && Dv % kAlign == 0,
              "block_window_backward: block size and head dims must be multiples of 32");
  TORCH_CHECK(scale > 0 && spread % 2 == 1, "block_window_backward: a positive scale and an odd spread only");
  TORCH_CHECK(heads > 0 && blocks > 0 && n % (heads * blocks) == 0 && window_bias.size(0) == n / heads &&
              biased.numel() == window_bias.size(0) && global_bias.size(0) == window_bias.size(0),
              "block_window_backward: heads and blocks do not match the queries and biases");
  const int64_t heads_total = n / blocks;  // B H
  TORCH_CHECK(key_source.size(1) == L && key_source.size(2) == D && value_source.size(1) == L &&
              grad_output.size(0) == n && grad_output.size(1) == L && grad_output.size(2) == Dv &&
              output.sizes() == grad_output.sizes() && logsumexp.size(0) == n && logsumexp.size(1) == L &&
              window_bias.size(1) == W && global_keys.size(0) == heads_total && global_keys.size(2) == D &&
              global_values.size(0) == heads_total && global_values.size(1) == G &&
              global_values.size(2) == Dv && global_queries.sizes() == global_keys.sizes() &&
              global_grad_output.sizes() == global_values.sizes() &&
              global_row_term.size(0) == heads_total && global_row_term.size(1) == G &&
              global_logsumexp.sizes() == global_row_term.sizes() && global_bias.size(1) == G &&
              key_bias.size(0) * heads * blocks == n && key_bias.size(1) == blocks * L,
              "block_window_backward: shapes do not match the queries");

  auto grad_query = at::empty({n, L, D}, query.options());
  auto grad_key = at::empty({n, L, D}, query.options());
  auto grad_value = at::empty({n, L, Dv}, query.options());
  const auto float_options = query.options().dtype(at::kFloat);

  // The global tokens, per head, laid out once as the products below take them (rows from
  // G to Gp are zeros): keys and values as left operands [Gp, D|Dv], keys transposed
  // [D, Gp]; their rows' queries and output gradients as right operands of K Q^T and
  // V dO^T (transposed) and of dS^T Q and P^T dO (as they are).
  auto global_keys_rows = at::zeros({heads_total, Gp, D}, query.options());
  auto global_values_rows = at::zeros({heads_total, Gp, Dv}, query.options());
  auto global_keys_t = at::empty({heads_total, D, Gp}, query.options());
  auto global_queries_t = at::empty({heads_total, D, Gp}, query.options());
  auto global_grad_t = at::empty({heads_total, Dv, Gp}, query.options());
  auto global_queries_right = at::empty({heads_total, Gp, D}, query.options());
  auto global_grad_right = at::empty({heads_total, Gp, Dv}, query.options());
  auto global_lse2 = at::full({heads_total, Gp}, INFINITY, float_options);  // padding rows: P = 0
  auto global_term = at::zeros({heads_total, Gp}, float_options);
  if (G) {
    global_keys_rows.narrow(1, 0, G).copy_(global_keys);
    global_values_rows.narrow(1, 0, G).copy_(global_values);
    global_term.narrow(1, 0, G).copy_(global_row_term);
    // in base 2; rows without any key: +inf (P = 0)
    global_lse2.narrow(1, 0, G).copy_(global_logsumexp.mul(kLog2e).masked_fill(global_logsumexp == -INFINITY,
                                                                                 INFINITY));
    auto queries_rows = at::zeros({heads_total, Gp, D}, query.options());
    auto grad_rows = at::zeros({heads_total, Gp, Dv}, query.options());
    queries_rows.narrow(1, 0, G).copy_(global_queries);
    grad_rows.narrow(1, 0, G).copy_(global_grad_output);
    at::parallel_for(0, heads_total, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> scratch(Gp * std::max(D, Dv));
      for (int64_t h = begin; h < end; ++h) {
        const T* keys_h = global_keys_rows.data_ptr<T>() + h * Gp * D;
        const T* queries_h = queries_rows.data_ptr<T>() + h * Gp * D;
        const T* grad_h = grad_rows.data_ptr<T>() + h * Gp * Dv;
        transpose_rows(keys_h, Gp, Gp, D, Gp, global_keys_t.data_ptr<T>() + h * D * Gp, scratch.data());
        pack_keys(queries_h, Gp, Gp, D, Gp, global_queries_t.data_ptr<T>() + h * D * Gp);
        pack_keys(grad_h, Gp, Gp, Dv, Gp, global_grad_t.data_ptr<T>() + h * Dv * Gp);
        T* queries_right = global_queries_right.data_ptr<T>() + h * Gp * D;
        T* grad_right = global_grad_right.data_ptr<T>() + h * Gp * Dv;
        const T* packed = right_operand(queries_h, Gp, D, queries_right);
        if (packed != queries_right) std::memcpy(queries_right, packed, Gp * D * sizeof(T));
        packed = right_operand(grad_h, Gp, Dv, grad_right);
        if (packed != grad_right) std::memcpy(grad_right, packed, Gp * Dv * sizeof(T));
      }
    });
  }

  const T* q = query.data_ptr<T>();
  const T* k = key_source.data_ptr<T>();
  const T* v = value_source.data_ptr<T>();
  const T* dout = grad_output.data_ptr<T>();
  const T* out = output.data_ptr<T>();
  const float* lse = logsumexp.data_ptr<float>();
  const float* window_bias_data = window_bias.data_ptr<float>();
  const bool* biased_data = biased.data_ptr<bool>();
  const float* global_bias_data = global_bias.data_ptr<float>();
  const float* key_bias_data = key_bias.data_ptr<float>();
  const T* g_keys = global_keys_rows.data_ptr<T>();
  const T* g_values = global_values_rows.data_ptr<T>();
  const T* g_keys_t = global_keys_t.data_ptr<T>();
  const T* g_queries_t = global_queries_t.data_ptr<T>();
  const T* g_grad_t = global_grad_t.data_ptr<T>();
  const T* g_queries_right = global_queries_right.data_ptr<T>();
  const T* g_grad_right = global_grad_right.data_ptr<T>();
  const float* g_lse2 = global_lse2.data_ptr<float>();
  const float* g_term = global_term.data_ptr<float>();
  T* dq = grad_query.data_ptr<T>();
  T* dk = grad_key.data_ptr<T>();
  T* dv = grad_value.data_ptr<T>();
  const float c = static_cast<float>(scale) * kLog2e;
  const float grad_scale = static_cast<float>(scale);

  // Chunks of kChunk blocks, fewer where that would leave threads idle, never fewer than
  // 2 * 2 w: a chunk then shares blocks with its two neighbours only, and the edge buffers
  // hold at most as many blocks as the sequence.
  const int64_t threads = at::get_num_threads(), shared = spread - 1;
  const int64_t per_thread = (n + threads - 1) / threads;
  const int64_t chunk_blocks = std::max({2 * shared, int64_t{1}, std::min(kChunk, per_thread)});
  const int64_t chunks = (n + chunk_blocks - 1) / chunk_blocks;
  // Key block j of the sequence is "padded" block j + w: window i reaches padded blocks
  // i .. i + 2 w, chunk c padded blocks c C .. c C + C + 2 w (local blocks 0 .. C + 2 w).
  // Of those, chunk c shares local blocks 0 .. 2 w with chunk c - 1 (its "head") and
  // C .. C + 2 w with chunk c + 1 (its "tail"); they wait in float32 edge buffers.
  const int64_t edge_size = shared * L * (D + Dv);  // one head or tail: keys then values per block
  auto edges = at::empty({chunks, 2, edge_size}, float_options);
  float* edge_data = edges.data_ptr<float>();
  // A block's sums to the output, where it is a block of the sequence.
  const auto emit = [&](const float* key_block, const float* value_block, int64_t padded) {
    if (padded < w || padded >= n + w) return;  // outside the sequence
    scale_row(key_block, L * D, 1.0f, dk + (padded - w) * L * D);
    scale_row(value_block, L * Dv, 1.0f, dv + (padded - w) * L * Dv);
  };
  std::vector<GlobalGradients> global_sums(threads);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t window_blocks = chunk_blocks + spread - 1, columns = window_blocks * L;
    const int64_t width = std::max(W, Gp);  // rows of the transposed products
    std::vector<T> keys(columns * D), values(columns * Dv), keys_t(D * columns);
    std::vector<T> query_t(D * L), grad_t(Dv * L), query_right(L * D), grad_right(L * Dv);
    std::vector<T> probs_t(width * L), scores_grad_t(width * L), scores_grad_right(width * L);
    std::vector<T> scratch(L * std::max(D, Dv));
    std::vector<float> scores_t(width * L), probs_grad_t(width * L), query_grad_t(D * L);
    std::vector<float> row_bias(std::max(W, std::max(Gp, L))), lse2(L), term(L);
    // The chunk's key and value gradient sums: local block t is padded block chunk + t.
    std::vector<float> key_sums(window_blocks * L * D), value_sums(window_blocks * L * Dv);
    TORCH_CHECK(at::get_thread_num() < threads, "block_window_backward: more threads than torch reports");
    GlobalGradients& sums = global_sums[at::get_thread_num()];
    if (G) {
      const int64_t first_chunk = begin * chunk_blocks;
      const int64_t last_block = std::min(n, end * chunk_blocks) - 1;
      sums.first_head = first_chunk / blocks;
      sums.heads = last_block / blocks - sums.first_head + 1;
      sums.keys.assign(sums.heads * Gp * D, 0.0f);
      sums.values.assign(sums.heads * Gp * Dv, 0.0f);
      sums.queries_t.assign(sums.heads * D * Gp, 0.0f);
    }
    for (int64_t index = begin; index < end; ++index) {
      const int64_t chunk = index * chunk_blocks;
      const int64_t chunk_end = std::min(n, chunk + chunk_blocks), count = chunk_end - chunk;
      std::fill(key_sums.begin(), key_sums.end(), 0.0f);
      std::fill(value_sums.begin(), value_sums.end(), 0.0f);
      for (int64_t t = 0; t < chunk_end - chunk + spread - 1; ++t) {  // the chunk's window keys and values
        const int64_t source = chunk + shift + t, value_block = chunk + value_shift + t;
        const bool inside = source >= 0 && source < S, value_inside = value_block >= 0 && value_block < Sv;
        T* key_rows = keys.data() + t * L * D;
        T* value_rows = values.data() + t * L * Dv;
        if (inside) {
          std::memcpy(key_rows, k + source * L * D, L * D * sizeof(T));
        } else {
          std::memset(key_rows, 0, L * D * sizeof(T));
        }
        if (value_inside) {
          std::memcpy(value_rows, v + value_block * L * Dv, L * Dv * sizeof(T));
        } else {
          std::memset(value_rows, 0, L * Dv * sizeof(T));
        }
        transpose_rows(key_rows, L, L, D, columns, keys_t.data() + t * L, scratch.data());
      }
      for (int64_t i = chunk; i < chunk_end; ++i) {
        const int64_t first = i - chunk;  // the window's first block in the chunk's buffers
        const int64_t own = first + w;  // block i's own keys there
        const int64_t row = (i / (heads * blocks)) * blocks + i % blocks;
        const int64_t head = i / blocks, slot = head - sums.first_head;
        const T* q_i = q + i * L * D;
        const T* dout_i = dout + i * L * Dv;
        for (int64_t r = 0; r < L; ++r) {  // rowsum(dO O) and the log-sum-exp in base 2
          // (a scalar loop here took ~7 % of the backward)
          term[r] = dot_row(dout_i + r * Dv, out + (i * L + r) * Dv, Dv);
          const float e = lse[i * L + r];
          lse2[r] = e == -INFINITY ? INFINITY : e * kLog2e;  // no key or replaced row: P = 0
        }
        pack_keys(q_i, L, L, D, L, query_t.data());  // right operands of K Q^T and V dO^T
        pack_keys(dout_i, L, L, Dv, L, grad_t.data());
        const T* query_b = right_operand(q_i, L, D, query_right.data());  // of dS^T Q and P^T dO
        const T* grad_b = right_operand(dout_i, L, Dv, grad_right.data());

        // The window keys.
        at::native::cpublas::brgemm(W, L, D, D, L, L, false, keys.data() + first * L * D, query_t.data(),
                                    scores_t.data());
        at::native::cpublas::brgemm(W, L, Dv, Dv, L, L, false, values.data() + first * L * Dv,
                                    grad_t.data(), probs_grad_t.data());
        const float* bias = nullptr;
        if (biased_data[row]) {
          for (int64_t x = 0; x < W; ++x) row_bias[x] = base2_bias(window_bias_data[row * W + x]);
          bias = row_bias.data();
        }
        softmax_backward_rows(scores_t.data(), probs_grad_t.data(), W, L, bias, lse2.data(), term.data(), c,
                              grad_scale, probs_t.data(), scores_grad_t.data());
        const T* ds_right = right_operand(scores_grad_t.data(), W, L, scores_grad_right.data());
        at::native::cpublas::brgemm(W, Dv, L, L, Dv, Dv, true, probs_t.data(), grad_b,
                                    value_sums.data() + first * L * Dv);
        at::native::cpublas::brgemm(W, D, L, L, D, D, true, scores_grad_t.data(), query_b,
                                    key_sums.data() + first * L * D);
        at::native::cpublas::brgemm(D, L, W, columns, L, L, false, keys_t.data() + first * L, ds_right,
                                    query_grad_t.data());
        if (G) {
          // The global keys: Gp more rows of the same products, summed per head.
          at::native::cpublas::brgemm(Gp, L, D, D, L, L, false, g_keys + head * Gp * D, query_t.data(),
                                      scores_t.data());
          at::native::cpublas::brgemm(Gp, L, Dv, Dv, L, L, false, g_values + head * Gp * Dv, grad_t.data(),
                                      probs_grad_t.data());
          for (int64_t g = 0; g < Gp; ++g) {
            row_bias[g] = g < G ? base2_bias(global_bias_data[row * G + g]) : -INFINITY;
          }
          softmax_backward_rows(scores_t.data(), probs_grad_t.data(), Gp, L, row_bias.data(), lse2.data(),
                                term.data(), c, grad_scale, probs_t.data(), scores_grad_t.data());
          const T* global_ds_right = right_operand(scores_grad_t.data(), Gp, L, scores_grad_right.data());
          at::native::cpublas::brgemm(D, L, Gp, Gp, L, L, true, g_keys_t + head * D * Gp, global_ds_right,
                                      query_grad_t.data());
          at::native::cpublas::brgemm(Gp, Dv, L, L, Dv, Dv, true, probs_t.data(), grad_b,
                                      sums.values.data() + slot * Gp * Dv);
          at::native::cpublas::brgemm(Gp, D, L, L, D, D, true, scores_grad_t.data(), query_b,
                                      sums.keys.data() + slot * Gp * D);
        }
        store_transposed(query_grad_t.data(), D, L, dq + i * L * D);
        if (G) {
          // The global tokens' rows over block i's own keys: Gp more queries, [L, Gp] products.
          at::native::cpublas::brgemm(L, Gp, D, D, Gp, Gp, false, keys.data() + own * L * D,
                                      g_queries_t + head * D * Gp, scores_t.data());
          at::native::cpublas::brgemm(L, Gp, Dv, Dv, Gp, Gp, false, values.data() + own * L * Dv,
                                      g_grad_t + head * Dv * Gp, probs_grad_t.data());
          const float* own_bias = key_bias_data + (i / (heads * blocks)) * blocks * L + (i % blocks) * L;
          for (int64_t x = 0; x < L; ++x) row_bias[x] = base2_bias(own_bias[x]);
          softmax_backward_rows(scores_t.data(), probs_grad_t.data(), L, Gp, row_bias.data(),
                                g_lse2 + head * Gp, g_term + head * Gp, c, grad_scale, probs_t.data(),
                                scores_grad_t.data());
          const T* rows_ds_right = right_operand(scores_grad_t.data(), L, Gp, scores_grad_right.data());
          at::native::cpublas::brgemm(L, Dv, Gp, Gp, Dv, Dv, true, probs_t.data(),
                                      g_grad_right + head * Gp * Dv, value_sums.data() + own * L * Dv);
          at::native::cpublas::brgemm(L, D, Gp, Gp, D, D, true, scores_grad_t.data(),
                                      g_queries_right + head * Gp * D, key_sums.data() + own * L * D);
          at::native::cpublas::brgemm(D, Gp, L, columns, Gp, Gp, true, keys_t.data() + own * L,
                                      rows_ds_right, sums.queries_t.data() + slot * D * Gp);
        }
      }
      // The sums out: the head to its edge buffer (the first chunk has no neighbour before
      // it), the tail likewise (the last has none after it), the rest to the output.
      const bool last = index == chunks - 1;
      float* head = edge_data + (index * 2) * edge_size;
      float* tail = edge_data + (index * 2 + 1) * edge_size;
      for (int64_t t = 0; t < count + shared; ++t) {
        const float* key_block = key_sums.data() + t * L * D;
        const float* value_block = value_sums.data() + t * L * Dv;
        float* edge = nullptr;
        if (t < shared && index > 0) {
          edge = head + t * L * (D + Dv);
        } else if (t >= count && !last) {
          edge = tail + (t - count) * L * (D + Dv);
        }
        if (edge) {
          std::memcpy(edge, key_block, L * D * sizeof(float));
          std::memcpy(edge + L * D, value_block, L * Dv * sizeof(float));
        } else {
          emit(key_block, value_block, chunk + t);
        }
      }
    }
    at::native::cpublas::brgemm_release();
  });
  // The blocks two chunks share: chunk c's head plus chunk c - 1's tail.
  at::parallel_for(1, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(L * (D + Dv));
    for (int64_t index = begin; index < end; ++index) {
      const float* head = edge_data + (index * 2) * edge_size;
      const float* tail = edge_data + ((index - 1) * 2 + 1) * edge_size;
      for (int64_t t = 0; t < shared; ++t) {
        const int64_t at = t * L * (D + Dv);
        for (int64_t x = 0; x < L * (D + Dv); ++x) sum[x] = head[at + x] + tail[at + x];
        emit(sum.data(), sum.data() + L * D, index * chunk_blocks + t);
      }
    }
  });

  // The global tokens' sums, merged over the threads.
  auto global_key_grad = at::zeros({heads_total, Gp, D}, float_options);
  auto global_value_grad = at::zeros({heads_total, Gp, Dv}, float_options);
  auto global_query_grad_t = at::zeros({heads_total, D, Gp}, float_options);
  for (const GlobalGradients& sums : global_sums) {
    if (!sums.heads) continue;
    const auto range = [&](const Tensor& x) { return x.narrow(0, sums.first_head, sums.heads); };
    range(global_key_grad).add_(at::from_blob(const_cast<float*>(sums.keys.data()), {sums.heads, Gp, D},
                                              float_options));
    range(global_value_grad).add_(at::from_blob(const_cast<float*>(sums.values.data()), {sums.heads, Gp, Dv},
                                                float_options));
    range(global_query_grad_t).add_(at::from_blob(const_cast<float*>(sums.queries_t.data()),
                                                  {sums.heads, D, Gp}, float_options));
  }
  return {grad_query, grad_key, grad_value, global_key_grad.narrow(1, 0, G),
          global_value_grad.narrow(1, 0, G), global_query_grad_t.transpose(1, 2).narrow(1, 0, G)};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> block_window_backward(
    const Tensor& query, const Tensor& key_source, const Tensor& value_source, int64_t shift,
    int64_t value_shift, int64_t spread, int64_t heads, int64_t blocks, const Tensor& window_bias,
    const Tensor& biased, const Tensor& grad_output, const Tensor& output, const Tensor& logsumexp,
    const Tensor& global_keys, const Tensor& global_values, const Tensor& global_bias,
    const Tensor& global_queries, const Tensor& global_grad_output, const Tensor& global_row_term,
    const Tensor& global_logsumexp, const Tensor& key_bias, double scale) {
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat,
              "block_window_backward: bfloat16 or float32 only");
  auto run = dtype == at::kBFloat16 ? backward_blocks<BFloat16> : backward_blocks<float>;
  return run(query, key_source, value_source, shift, value_shift, spread, heads, blocks, window_bias, biased,
             grad_output, output, logsumexp, global_keys, global_values, global_bias, global_queries,
             global_grad_output, global_row_term, global_logsumexp, key_bias, scale);
}

}  // namespace attnlab_block_window_amx
