// What int8_mm.h, w8a8_mm.h and w4a8_mm.h share: at their edge, the checks of the activations x [R, K] and the
// per-output scales s [N], and the call of a kernel's `mm` for each pair of scale and output dtypes (float32 or
// bfloat16 each), with x widened to float32 and y [R, N] in x's dtype; inside, `by_rows`, a run-time row count
// turned into the compile-time one of a register block; `tiled_rows`, the sweep of a kernel's tiles over the rows;
// `round_row`, a row of activations rounded to integers by its own scale, and `put_scaled`, the integer sums scaled
// back; for w8a8_mm.h and w4a8_mm.h, `prefetch_ahead`.

#pragma once

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

// mm(xp, sp, yp): the kernel on x's float32 rows, the scales (float* or BFloat16*) and y (float* or BFloat16*)
template <typename Mm>
static inline at::Tensor scaled_rows(const char* op, const at::Tensor& x, const at::Tensor& s, int64_t N, Mm mm) {
  TORCH_CHECK(s.dim() == 1 && s.size(0) == N && s.is_contiguous() &&
              (s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16), op, ": s [N] float32 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              op, ": x [R, K] float32 or bfloat16");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  const float* xp = xf.const_data_ptr<float>();
  const bool sf = s.scalar_type() == at::kFloat, yf = x.scalar_type() == at::kFloat;
  using c10::BFloat16;
  if (sf && yf) mm(xp, s.const_data_ptr<float>(), y.data_ptr<float>());
  else if (sf) mm(xp, s.const_data_ptr<float>(), y.data_ptr<BFloat16>());
  else if (yf) mm(xp, s.const_data_ptr<BFloat16>(), y.data_ptr<float>());
  else mm(xp, s.const_data_ptr<BFloat16>(), y.data_ptr<BFloat16>());
  return y;
}

// tile(std::integral_constant<int, n>{}) with n = rb for a run-time row count rb = 1..rbmax (more: rbmax): a
// kernel's register block takes its row count at compile time
template <int rbmax, typename Tile>
static inline void by_rows(int rb, Tile tile) {
  static_assert(rbmax >= 1 && rbmax <= 10, "one case per row count below");
  switch (rb) {
    case 1: return tile(std::integral_constant<int, 1>{});
    case 2: return tile(std::integral_constant<int, std::min(2, rbmax)>{});
    case 3: return tile(std::integral_constant<int, std::min(3, rbmax)>{});
    case 4: return tile(std::integral_constant<int, std::min(4, rbmax)>{});
    case 5: return tile(std::integral_constant<int, std::min(5, rbmax)>{});
    case 6: return tile(std::integral_constant<int, std::min(6, rbmax)>{});
    case 7: return tile(std::integral_constant<int, std::min(7, rbmax)>{});
    case 8: return tile(std::integral_constant<int, std::min(8, rbmax)>{});
    case 9: return tile(std::integral_constant<int, std::min(9, rbmax)>{});
    default: return tile(std::integral_constant<int, rbmax>{});
  }
}

// Prefetch the `bytes` (whole lines) at p of a run of weights that a thread streams: 4 KB ahead into L1
// (prefetcht0), which covers the start of a short run, and 64 KB ahead into L2 (prefetcht2), far enough for a pass
// of many rows, whose dot products read the weights slowly, to keep the memory busy while it computes. A 9-row
// W8A8 pass of Qwen2.5-Coder-1.5B on an AMD EPYC (2 threads): 71-74 ms with 4 KB into L1 alone, 52-60 with 64 KB
// into L2; a one-row step the same or faster (kernels/int8_mm.h: 76-96 -> 42-58 ms).
constexpr int64_t PREFETCH_NEAR = 4096, PREFETCH_FAR = 65536;
template <int bytes>
static inline void prefetch_ahead(const void* p) {
  const char* c = static_cast<const char*>(p);
  for (int line = 0; line < bytes; line += 64) {
    __builtin_prefetch(c + PREFETCH_NEAR + line, 0, 3);
    __builtin_prefetch(c + PREFETCH_FAR + line, 0, 1);
  }
}

// The sweep of a kernel's tiles of nt weight rows over the rows of x: tile(c, t, r, out), with c the compile-time
// row count rb of a block (by_rows: a std::integral_constant, rb <= rb_max), fills out[i * nt + j] for row r + i of
// x and weight row t * nt + j (j < nt; the last tile up to N); put(r + i, t * nt + j, out[i * nt + j]) then writes
// y. Rows in chunks of 64 (a long pass keeps its rows in L2), each chunk in blocks of rb_max rows; threads take
// tiles, 64 weight rows at least.
template <int nt, int rb_max, typename Out, typename Tile, typename Put>
static inline void tiled_rows(int64_t R, int64_t N, Tile tile, Put put) {
  constexpr int64_t ROW_CHUNK = 64;
  const int64_t tiles = (N + nt - 1) / nt;
  for (int64_t r0 = 0; r0 < R; r0 += ROW_CHUNK) {
    const int64_t rc = std::min(ROW_CHUNK, R - r0);
    at::parallel_for(0, tiles, std::max(1, 64 / nt), [&](int64_t lo, int64_t hi) {
      Out out[rb_max * nt];
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t n = t * nt, nn = std::min<int64_t>(nt, N - n);
        for (int64_t r = r0; r < r0 + rc; r += rb_max) {
          const int rb = static_cast<int>(std::min<int64_t>(rb_max, r0 + rc - r));
          by_rows<rb_max>(rb, [&](auto c) { tile(c, t, r, out); });
          for (int i = 0; i < rb; ++i)
            for (int64_t j = 0; j < nn; ++j) put(r + i, n + j, out[i * nt + j]);
        }
      }
    });
  }
}

// max_k |x[k]| (0 for none; a NaN is passed over): the same in any order, so in vectors of partial maxima. One
// float chain (the compiler does not reorder it) waited ~3 cycles an element, ~1 % of a SmolLM2 9-row W8A8 pass.
static inline float abs_max(const float* x, int64_t K) {
  int64_t k = 0;
  float amax = 0;
#if defined(__AVX512F__)
  __m512 m = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);  // NaN: m kept
  amax = _mm512_reduce_max_ps(m);
#elif defined(__AVX2__)
  __m256 m = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; k + 8 <= K; k += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (const float v : lanes) amax = std::max(amax, v);
#endif
  for (; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

// row x [K] -> xq [K] in [-levels, levels], round(x * levels / amax) (half to even), and its scale amax / levels
// (a row of zeros: zeros, scale 0; a row with a NaN or an infinity: scale NaN, so its outputs are NaN, as a float
// product's would be, not finite numbers from clamped integers); runtime/quant.py's `quantize_rows` computes the
// same, op for op
//
// In vectors where the build has them, the same operations lane by lane: the product, the rounding to the nearest
// even integer, max then min (vmaxps returns its second operand for a NaN, as std::max(-levels, NaN) does), so the
// vector and scalar loops give the same integers. One element at a time, the loop took ~1 ns an element on one
// thread while the other waited: ~2 % of a 9-row int8 pass of Qwen2.5-Coder-1.5B (~4 % of a W4A8 one, with its
// groups' sums).
template <typename T>
static inline float round_row(const float* x, int64_t K, float levels, T* xq) {
  static_assert(std::is_same_v<T, int8_t> || std::is_same_v<T, int16_t>, "int8 or int16 activations");
  const float amax = abs_max(x, K);
  const float inv = amax > 0 ? levels / amax : 0.0f;
  bool finite = true;
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(levels), lo = _mm512_set1_ps(-levels);
  __mmask16 fin = 0xFFFF;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    fin &= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);  // v - v == 0: v finite
    const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i i = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
    if constexpr (sizeof(T) == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k), _mm512_cvtsepi32_epi16(i));
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + k), _mm512_cvtsepi32_epi8(i));
  }
  finite = fin == 0xFFFF;
#elif defined(__AVX2__)
  const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(levels), lo = _mm256_set1_ps(-levels);
  __m256 bad = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));  // 8 int16, in order
    if constexpr (sizeof(T) == 2) _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + k), w);
    else _mm_storel_epi64(reinterpret_cast<__m128i*>(xq + k), _mm_packs_epi16(w, w));
  }
  finite = _mm256_movemask_ps(bad) == 0;
#endif
  for (; k < K; ++k) {
    finite &= std::isfinite(x[k]);
    xq[k] = static_cast<T>(std::min(levels, std::max(-levels, std::nearbyint(x[k] * inv))));
  }
  return finite ? amax / levels : std::numeric_limits<float>::quiet_NaN();
}

// tiled_rows' put for integer sums scaled by their row's and their output's scales: y[r, n] = float(v) sx[r] s[n]
template <typename S, typename Y>
static inline auto put_scaled(const float* sx, const S* s, int64_t N, Y* y) {
  return [=](int64_t r, int64_t n, auto v) {
    y[r * N + n] = Y(static_cast<float>(v) * sx[r] * static_cast<float>(s[n]));
  };
}
