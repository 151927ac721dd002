// The bfloat16 forward of block-sparse attention on CPUs with AMX.
//
// Dimension letters as in _block_window_kernel.py: L block size, D (Dv) head dim of keys
// (values), W = spread * L window keys, G global keys (Gp: G rounded up to 32), n blocks.
//
// Why a kernel of our own: torch's fused CPU attention splits a 128-query block into 32-row
// pieces and repacks each block's keys for every window that holds them, so on bfloat16
// its matrix products run far below the AMX units' speed. Here every query block is one
// 128-row product over its whole window, each key and value block is packed once per few
// windows (VNNI layout, into a buffer that stays in cache), and the softmax is one pass in
// base 2.
//
// Each thread walks a contiguous range of query blocks in chunks of kChunk: it packs the
// key and value blocks the chunk's windows cover (kChunk + spread - 1 of them), then for
// each block: S = Q K^T over the window (one GEMM), the softmax into bfloat16
// probabilities P with the log-sum-exp, O = P V (one GEMM). The global keys are one GEMM
// per chunk and head on each side (their scores join each row's softmax), and the global
// tokens' own rows, which attend every key, keep a running softmax per thread over the
// chunks' own key blocks, merged at the end. Key blocks outside the source tensor are
// packed as zeros; the window bias removes them, as it removes every key a block may not
// attend.

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

namespace {

using at::BFloat16;
using at::Tensor;

constexpr int64_t kChunk = 16;  // query blocks per packing round
constexpr int64_t kAlign = 32;  // columns and rows come in multiples of this
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A bias in base 2: -inf stays -inf, a finite one stays finite (a mask of the dtype's
// lowest value, as HuggingFace builds them, must not become -inf).
inline float base2_bias(float bias) {
  return bias == -INFINITY ? bias : std::max(bias * kLog2e, std::numeric_limits<float>::lowest());
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// 2^t for t <= 0 (-inf included); 0 where the result would be subnormal.
inline __m512 exp2_nonpositive(__m512 t) {
  const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 whole = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, whole);  // [-0.5, 0.5]
  // 2^f, least-squares fit on Chebyshev nodes: relative error 1.1e-7.
  __m512 p = _mm512_set1_ps(0.001340043731033802f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009676042012870312f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550327152013779f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402210682630539f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(normal, p, whole);
}

inline float row_max(const float* x, int64_t width) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 64 <= width; i += 64) {  // four chains: max has a latency of several cycles
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
    m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + i + 32));
    m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + i + 48));
  }
  for (; i < width; i += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

// x <- x * c + bias (base-2 scores); returns their maximum.
inline float add_bias_row(float* x, const float* bias, int64_t width, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  for (int64_t i = 0; i < width; i += 32) {
    const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), vc, _mm512_loadu_ps(bias + i));
    const __m512 b = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), vc, _mm512_loadu_ps(bias + i + 16));
    _mm512_storeu_ps(x + i, a);
    _mm512_storeu_ps(x + i + 16, b);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

// p <- 2^(x * c - top) in bfloat16; returns the sum of the float32 values.
inline float exp2_row(const float* x, int64_t width, float c, float top, BFloat16* p) {
  const __m512 vc = _mm512_set1_ps(c), vtop = _mm512_set1_ps(top);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  for (int64_t i = 0; i < width; i += 32) {
    const __m512 a = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), vc, vtop));
    const __m512 b = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(x + i + 16), vc, vtop));
    s0 = _mm512_add_ps(s0, a);
    s1 = _mm512_add_ps(s1, b);
    _mm512_storeu_si512(p + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// out <- x * factor in bfloat16.
inline void scale_row(const float* x, int64_t width, float factor, BFloat16* out) {
  const __m512 vf = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < width; i += 32) {
    const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), vf);
    const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), vf);
    _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

// Transposes a 16 x 16 matrix of 32-bit elements held one row per register.
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of elements
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: 8 x 8, then 16 x 16
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// Keys [rows, D] -> the right operand of Q K^T in VNNI layout: [D / 2, rows, 2] (a
// transpose of bfloat16 pairs, 16 x 16 pairs at a time). Rows from `valid` on are zeros.
// ld: the packed row count.
void pack_keys(const BFloat16* keys, int64_t rows, int64_t valid, int64_t D, int64_t ld, BFloat16* packed) {
  const int64_t pairs = D / 2;
  const uint32_t* source = reinterpret_cast<const uint32_t*>(keys);
  uint32_t* target = reinterpret_cast<uint32_t*>(packed);
  __m512i tile[16];
  for (int64_t r = 0; r < rows; r += 16) {
    for (int64_t d = 0; d < pairs; d += 16) {
      for (int i = 0; i < 16; ++i) {
        tile[i] = r + i < valid ? _mm512_loadu_si512(source + (r + i) * pairs + d) : _mm512_setzero_si512();
      }
      transpose_16x16(tile);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(target + (d + i) * ld + r, tile[i]);
    }
  }
}

// Values [rows, Dv] -> the right operand of P V in VNNI layout: [rows / 2, Dv, 2] (rows
// interleaved in pairs). Rows from `valid` on are zeros.
void pack_values(const BFloat16* values, int64_t rows, int64_t valid, int64_t Dv, BFloat16* packed) {
  const __m512i low = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_set_epi16(
      63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
      55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t r = 0; r < rows; r += 2) {
    const BFloat16* first = values + r * Dv;
    BFloat16* target = packed + r * Dv;
    for (int64_t d = 0; d < Dv; d += 32) {
      const __m512i a = r < valid ? _mm512_loadu_si512(first + d) : zero;
      const __m512i b = r + 1 < valid ? _mm512_loadu_si512(first + Dv + d) : zero;
      _mm512_storeu_si512(target + 2 * d, _mm512_permutex2var_epi16(a, low, b));
      _mm512_storeu_si512(target + 2 * d + 32, _mm512_permutex2var_epi16(a, high, b));
    }
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> block_window_forward(
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
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && key_source.scalar_type() == at::kBFloat16 &&
              value_source.scalar_type() == at::kBFloat16, "block_window_forward: bfloat16 inputs only");
  TORCH_CHECK(query.is_contiguous() && key_source.is_contiguous() && value_source.is_contiguous() &&
              window_bias.is_contiguous() && biased.is_contiguous() && global_keys.is_contiguous() &&
              global_values.is_contiguous() && global_bias.is_contiguous() &&
              global_queries.is_contiguous() &&
              key_bias.is_contiguous(),
              "block_window_forward: contiguous inputs only");
  TORCH_CHECK(window_bias.scalar_type() == at::kFloat && global_bias.scalar_type() == at::kFloat &&
              key_bias.scalar_type() == at::kFloat && global_queries.scalar_type() == at::kBFloat16 &&
              biased.scalar_type() == at::kBool, "block_window_forward: float32 biases, bool rows");
  const int64_t n = query.size(0), L = query.size(1), D = query.size(2);
  const int64_t S = key_source.size(0), Sv = value_source.size(0), Dv = value_source.size(2);
  const int64_t G = global_keys.size(1);
  const int64_t W = spread * L, Gp = round_up(G, kAlign);
  TORCH_CHECK(L % kAlign == 0 && D % kAlign == 0 && Dv % kAlign == 0 && scale > 0,
              "block_window_forward: block size and head dims must be multiples of 32");
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

  // The global keys and values of every head, packed once: [B H, D / 2, Gp, 2], [B H, Gp / 2, Dv, 2].
  auto packed_global_keys = at::empty({heads_total, D * Gp}, query.options());
  auto packed_global_values = at::empty({heads_total, Gp * Dv}, query.options());
  if (G) {
    at::parallel_for(0, heads_total, 1, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) {
        pack_keys(global_keys.data_ptr<BFloat16>() + h * G * D, Gp, G, D, Gp,
                  packed_global_keys.data_ptr<BFloat16>() + h * D * Gp);
        pack_values(global_values.data_ptr<BFloat16>() + h * G * Dv, Gp, G, Dv,
                    packed_global_values.data_ptr<BFloat16>() + h * Gp * Dv);
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
  const BFloat16* global_q = global_queries.data_ptr<BFloat16>();
  const float* key_bias_data = key_bias.data_ptr<float>();

  const BFloat16* q = query.data_ptr<BFloat16>();
  const BFloat16* k = key_source.data_ptr<BFloat16>();
  const BFloat16* v = value_source.data_ptr<BFloat16>();
  const float* window_bias_data = window_bias.data_ptr<float>();
  const bool* biased_data = biased.data_ptr<bool>();
  const float* global_bias_data = global_bias.data_ptr<float>();
  const BFloat16* global_k = packed_global_keys.data_ptr<BFloat16>();
  const BFloat16* global_v = packed_global_values.data_ptr<BFloat16>();
  BFloat16* out = output.data_ptr<BFloat16>();
  float* lse = logsumexp.data_ptr<float>();
  const float c = static_cast<float>(scale) * kLog2e;  // scores in base 2

  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    const int64_t packed_blocks = kChunk + spread - 1, packed_columns = packed_blocks * L;
    const int64_t chunk_rows = kChunk * L, own_offset = (spread - 1) / 2;  // a block's own keys in its window
    std::vector<BFloat16> packed_keys(packed_blocks * L * D), packed_values(packed_blocks * L * Dv);
    std::vector<float> scores(L * W), window_row_bias(W), global_row_bias(Gp);
    std::vector<BFloat16> probs(L * W);
    // Per chunk: the global keys' scores and probabilities, the weighted values, 1 / sum per row.
    std::vector<float> global_scores(chunk_rows * Gp), accumulator(chunk_rows * Dv), inverse(chunk_rows);
    std::vector<BFloat16> global_probs(chunk_rows * Gp);
    // The global rows over the chunk's own keys.
    std::vector<float> row_scores(G * chunk_rows), own_key_bias(chunk_rows);
    std::vector<BFloat16> row_probs(G * chunk_rows);
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
                  packed_keys.data() + t * L * 2);  // columns t L .. of [D / 2, packed_columns, 2]
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
                                    packed_keys.data() + first * L * 2, scores.data());
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
        for (int64_t r = 0; r < L; ++r) {
          const int64_t at = first * L + r;  // row of the chunk
          float* line = scores.data() + r * W;
          float* global_line = global_scores.data() + at * Gp;
          BFloat16* p = probs.data() + r * W;
          BFloat16* global_p = global_probs.data() + at * Gp;
          float top = window_biased ? add_bias_row(line, window_row_bias.data(), W, c) : row_max(line, W) * c;
          if (G) top = std::max(top, add_bias_row(global_line, global_row_bias.data(), Gp, c));
          float sum = 0.0f;
          if (top != -INFINITY) {
            sum = exp2_row(line, W, window_c, top, p);
            if (G) sum += exp2_row(global_line, Gp, 1.0f, top, global_p);
          }
          if (sum == 0.0f) {  // no key: probabilities, output and weight 0
            std::memset(p, 0, W * sizeof(BFloat16));
            if (G) std::memset(global_p, 0, Gp * sizeof(BFloat16));
            lse[i * L + r] = -INFINITY;
            inverse[at] = 0.0f;
          } else {
            lse[i * L + r] = (top + std::log2(sum)) * kLn2;
            inverse[at] = 1.0f / sum;
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
        at::native::cpublas::brgemm(G, columns, D, D, packed_columns, columns, false, global_q + head * G * D,
                                    packed_keys.data() + own * L * 2, row_scores.data());
        const float* bias = key_bias_data + (from / (heads * blocks)) * blocks * L + (from % blocks) * L;
        for (int64_t x = 0; x < columns; ++x) own_key_bias[x] = base2_bias(bias[x]);
        for (int64_t g = 0; g < G; ++g) {
          float* line = row_scores.data() + g * columns;
          BFloat16* p = row_probs.data() + g * columns;
          const float top = std::max(row_top[slot + g], add_bias_row(line, own_key_bias.data(), columns, c));
          if (top == -INFINITY) {  // no key so far
            std::memset(p, 0, columns * sizeof(BFloat16));
            continue;
          }
          const float factor = std::exp2(row_top[slot + g] - top);  // 0 from -inf
          row_sum[slot + g] = row_sum[slot + g] * factor + exp2_row(line, columns, 1.0f, top, p);
          row_top[slot + g] = top;
          float* values_row = row_values + (slot + g) * Dv;
          for (int64_t d = 0; d < Dv; ++d) values_row[d] *= factor;
        }
        at::native::cpublas::brgemm(G, Dv, columns, columns, Dv, Dv, true, row_probs.data(),
                                    packed_values.data() + own * L * Dv, row_values + slot * Dv);
      }
    }
    at::native::cpublas::brgemm_release();
  });

  auto global_output = at::empty({heads_total, G, Dv}, query.options());
  auto global_logsumexp = at::empty({heads_total, G}, query.options().dtype(at::kFloat));
  BFloat16* global_out = global_output.data_ptr<BFloat16>();
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

TORCH_LIBRARY(attnlab_block_window, m) {
  m.def(
      "forward(Tensor query, Tensor key_source, Tensor value_source, int shift, int value_shift, int spread, "
      "int heads, "
      "int blocks, Tensor window_bias, Tensor biased, Tensor global_keys, Tensor global_values, "
      "Tensor global_bias, Tensor global_queries, Tensor key_bias, float scale) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      &block_window_forward);
}
