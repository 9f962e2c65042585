// Weight-only int8 matmul for the short passes of decoding: y [R, N] = x [R, K] (q [N, K] int8 * s [N])^T.
//
// Why not aten::_weight_int8pack_mm: it reads the weights again for every block of four rows, so a verify pass of
// 5 rows cost ~2x a one-row decode step (9 rows ~3.4x) where the weights' bytes, not the arithmetic, set the
// time. Here each tile of NT weight rows is read from memory once, widened to float32 in registers, and multiplied
// with every row of x (RB rows at a time; further row blocks find the tile in L1/L2).
//
// Row-exact by construction: each output y[r, n] is one float32 sum over k in the same order whatever R is (W
// lanes of fused multiply-adds over k in steps of W, the lanes reduced in a fixed order, then the tail k in
// order, then times s[n]); which rows share a call, and which thread computes which tile, never enters a row's
// arithmetic. Activations are float32 (bfloat16 inputs are widened exactly), so int8 rows are not rounded to
// bf16 before they are multiplied.
//
// Kernels by the CPU this is compiled for (runtime/fused.py builds with -march=native, once per CPU): AVX-512
// (16 lanes), AVX2 + FMA (8 lanes), else plain loops (8 partial sums). AVX2 takes 6 rows a sweep (12 of its 16
// registers accumulate): a verify pass of 5 rows, K = 4, in one read of the weights (Qwen2.5-Coder-1.5B, the AVX2
// stand-in of docs/qwen.md: 1.72x a one-row step, against 2.15x with 4 rows a sweep).

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "scaled_rows.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

// internal linkage throughout: a process may load builds of this header for other instruction sets (the tests)
namespace trtspec_int8 {
namespace {

#if defined(__AVX512F__)
using vec = __m512;
constexpr int W = 16, NT = 4, RB = 6;  // 24 accumulators + 4 weight vectors + 1 input vector of 32 registers
inline vec zero() { return _mm512_setzero_ps(); }
inline vec load_x(const float* p) { return _mm512_loadu_ps(p); }
inline vec load_w(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int W = 8, NT = 2, RB = 6;  // 12 accumulators + 2 weight vectors + 1 input vector of 16 registers
inline vec zero() { return _mm256_setzero_ps(); }
inline vec load_x(const float* p) { return _mm256_loadu_ps(p); }
inline vec load_w(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
#else
struct vec {
  float v[8];
};
constexpr int W = 8, NT = 2, RB = 4;
inline vec zero() { return vec{{0, 0, 0, 0, 0, 0, 0, 0}}; }
inline vec load_x(const float* p) {
  vec r;
  for (int i = 0; i < 8; ++i) r.v[i] = p[i];
  return r;
}
inline vec load_w(const int8_t* p) {
  vec r;
  for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline vec fma(vec a, vec b, vec c) {
  for (int i = 0; i < 8; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline void store(float* p, vec v) {
  for (int i = 0; i < 8; ++i) p[i] = v.v[i];
}
#endif

// the lanes of an accumulator summed, in one order for every row (what keeps rows exact): a fixed tree of halves
// where there are vectors (a sum in lane order, through memory, was a chain of 16 dependent adds per output and
// row: ~half of a 5-row tile of SmolLM2's 576 columns), in lane order in the plain loops
inline float hsum(vec v) {
#if defined(__AVX512F__)
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));  // (AVX-512 F alone)
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 h = v;
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
#else
  float s = 0;
  for (int i = 0; i < W; ++i) s += v.v[i];
  return s;
#endif
}

// A row's vector of x is loaded once into a register for the nt fmadds of its weight rows: left to itself the
// compiler folded the load into each fmadd, 24 loads of x a step instead of 6, and a pass of several rows waited on
// the loads (Qwen2.5-Coder-1.5B on an AMD EPYC, 2 threads: 5 / 9 / 16 rows 98 / 182 / 309 ms -> 84 / 149 / 258;
// AVX2 build 119 / 208 -> 94 / 181 for 5 / 9; a one-row step the same).
//
// Each weight row is prefetched PREFETCH_FAR (scaled_rows.h) ahead into L2 (prefetcht2) alone: the hardware
// prefetcher stops at 4 KB pages. Qwen2.5-Coder-1.5B on an AMD EPYC, 2 threads: a one-row step 76-96 ms at 8 KB into
// L1 (once the best of 0.5-16 KB into L1), 42-58 ms at 64 KB into L2; passes of 5 and 9 rows, bound by their float
// multiply-adds, the same within noise.

// out[r * nt + j] = sum_k x[r, k] q[j, k] for rb rows of x (stride K) and nt weight rows (stride K)
template <int rb, int nt>
inline void tile(const float* x, const int8_t* q, int64_t K, float* out) {
  const int64_t Kv = K - K % W;
  vec acc[rb][nt];  // (the loops over rb and nt unrolled: the accumulators stay in registers)
#pragma GCC unroll 8
  for (int r = 0; r < rb; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < nt; ++j) acc[r][j] = zero();
  for (int64_t k = 0; k < Kv; k += W) {
    vec w[nt];
#pragma GCC unroll 8
    for (int j = 0; j < nt; ++j) {
      __builtin_prefetch(q + j * K + k + PREFETCH_FAR, 0, 1);
      w[j] = load_w(q + j * K + k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) {
      vec xv = load_x(x + r * K + k);
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
      asm("" : "+v"(xv));  // one load of x a row, in a register: not folded into each of the nt fmadds
#endif
#pragma GCC unroll 8
      for (int j = 0; j < nt; ++j) acc[r][j] = fma(xv, w[j], acc[r][j]);
    }
  }
  for (int r = 0; r < rb; ++r)
    for (int j = 0; j < nt; ++j) {
      float s = hsum(acc[r][j]);
      for (int64_t k = Kv; k < K; ++k) s += x[r * K + k] * static_cast<float>(q[j * K + k]);
      out[r * nt + j] = s;
    }
}

// y[r, n] = Y(s[n] * sum_k x[r, k] q[n, k]); x [R, K] float32, q [N, K] int8, s [N] (S), y [R, N] (Y). Passes of
// more than RB rows take further row blocks, which widen each tile of weights again (from L1). Tiles half as
// wide and blocks twice as tall were measured: 8-9 rows ~8 % faster, 12-16 rows up to 1.7x slower (x no longer
// fits L1, and each load of it then serves 2 weight rows instead of 4).
template <typename S, typename Y>
void mm(const float* x, int64_t R, int64_t K, const int8_t* q, const S* s, int64_t N, Y* y) {
  tiled_rows<NT, RB, float>(R, N, [&](auto c, int64_t t, int64_t r, float* out) {
    constexpr int rb = decltype(c)::value;
    const int64_t n = t * NT;
    if (N - n >= NT) return tile<rb, NT>(x + r * K, q + n * K, K, out);
    for (int64_t j = 0; j < N - n; ++j) {  // the last tile's weight rows one at a time
      float col[rb];
      tile<rb, 1>(x + r * K, q + (n + j) * K, K, col);
      for (int i = 0; i < rb; ++i) out[i * NT + j] = col[i];
    }
  }, [&](int64_t r, int64_t n, float v) { y[r * N + n] = Y(v * static_cast<float>(s[n])); });
}

}  // namespace
}  // namespace trtspec_int8

// y [R, N] in x's dtype (bfloat16 or float32) = x [R, K] times (q [N, K] int8 * s [N] (bfloat16 or float32))^T
static inline at::Tensor int8_rows_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "int8_mm: x [R, K], q [N, K]");
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous(), "int8_mm: q int8, contiguous");
  const int64_t R = x.size(0), K = x.size(1), N = q.size(0);
  const int8_t* qp = q.const_data_ptr<int8_t>();
  return scaled_rows("int8_mm", x, s, N, [&](const float* xp, const auto* sp, auto* yp) {
    trtspec_int8::mm(xp, R, K, qp, sp, N, yp);
  });
}
