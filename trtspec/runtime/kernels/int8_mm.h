// Weight-only int8 matmul for the short passes of decoding: y [R, N] = x [R, K] (q [N, K] int8 * s [N])^T, with each
// row of x rounded to int16 by its own scale (dynamic, per token): xq[r] = round(x[r] * L / amax(|x[r]|)) in
// [-L, L], L = LEVELS = 32767, sx[r] = amax / L, and y[r, n] = float(sum_k xq[r, k] q[n, k]) * sx[r] * s[n].
//
// Why not aten::_weight_int8pack_mm: it reads the weights again for every block of four rows, so a verify pass of
// 5 rows cost ~2x a one-row decode step (9 rows ~3.4x) where the weights' bytes, not the arithmetic, set the
// time. Here each tile of NT weight rows is read from memory once, widened in registers, and multiplied with
// every row of x (RB rows at a time; further row blocks find the tile in L1/L2).
//
// Why int16 activations: with float32 ones the multiply-adds, not the memory, set a pass of several rows' time (16
// a fused multiply-add, and a widening of each weight to float32). An int16 dot product takes twice the pairs an
// instruction at the same rate (AVX-512 VNNI vpdpwssd: 32; AVX2 vpmaddwd + vpaddd: 16, against 8 fmadds), and a
// weight only sign-extends to int16. Qwen2.5-Coder-1.5B's matmuls (1.54 GB) on an AMD EPYC (Zen 4), 2 threads, in
// one process, 1 / 5 / 9 rows: float32 activations 49 / 80 / 139 ms, int16 51 / 52 / 82; the AVX2 build 63 / 92 /
// 173 -> 49 / 67 / 118 (its one-row step was bound by the widening too). Rounding a row to 32767 levels of its
// largest magnitude moves each activation by at most amax / 65534 (bfloat16's rounding: up to |x| / 256), far
// below the weights' own int8 rounding: the int8 SmolLM2 target's greedy texts did not move.
//
// Row-exact by construction, and the same bits on every instruction set: a row's sum is an exact integer (no
// rounding, so no order to keep), its rounding to xq and the products at the end are the row's own; which rows
// share a call, the tiling and the threads never enter. runtime/quant.py's `int8_mm_reference` computes the same
// bits in torch. No int32 can overflow: each lane takes at most CHUNK / 8 products of |q| <= 128 and |xq| <= 32767
// (AVX2; CHUNK / 16 on AVX-512), and the end of a chunk adds two lanes (AVX2) or four (AVX-512) in int32, at most
// 2^9 * 128 * 32767 < 2^31, before the rest of the sum goes on in int64.
//
// Kernels by the CPU this is compiled for (runtime/fused.py builds with -march=native, once per CPU): AVX-512 BW
// (32 pairs a vector; vpdpwssd with VNNI), AVX2 (16 pairs; vpdpwssd with AVX-VNNI), else plain loops (8 partial
// sums).

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "scaled_rows.h"

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

// internal linkage throughout: a process may load builds of this header for other instruction sets (the tests)
namespace trtspec_int8 {
namespace {

constexpr float LEVELS = 32767;
constexpr int64_t CHUNK = 2048;  // columns summed in int32 lanes before they join a row's int64 sum

#if defined(__AVX512F__) && defined(__AVX512BW__)
using vec = __m512i;
constexpr int W = 32, NT = 4, RB = 6;  // 24 accumulators + 4 weight vectors + 1 input vector of 32 registers
inline vec zero() { return _mm512_setzero_si512(); }
inline vec load_x(const int16_t* p) { return _mm512_loadu_si512(p); }
inline vec load_w(const int8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline vec dot(vec x, vec w, vec acc) {  // acc + in each int32 lane the sum of its two products
#if defined(__AVX512VNNI__)
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));  // (the intrinsic: gcc copied and spilled accumulators)
#else
  vec p;
  asm("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+v"(acc), "=&v"(p) : "v"(x), "v"(w));
#endif
  return acc;
}
inline int64_t hsum(vec v) {  // the lanes widened to int64 and summed
  const __m512i h = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),
                                     _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1)));
  return _mm512_reduce_add_epi64(h);
}
// out[0..3] += hsum(a), hsum(b), hsum(c), hsum(d), in one pass over the four: each sum of four lanes of one vector
// stays in int32 (a lane holds at most CHUNK / 16 products of |q| <= 128 and |xq| <= 32767, so four lanes at most
// 2^16 * 32767 < 2^31), then the rest in int64. One at a time, a tile's 4 x rb sums took ~10 instructions each:
// at SmolLM2-135M's K = 576 (18 vectors a row) a fifth of a tile's. Its matmuls streamed, side by side in one
// process (AMD EPYC Zen 4, 2 threads): 5 / 9 / 16 rows in 0.92-0.96 / 0.90-0.92 / 0.87-0.91x the time.
inline void hsum4(vec a, vec b, vec c, vec d, int64_t* out) {
  // per 128-bit block: a0+a2 b0+b2 a1+a3 b1+b3, then c d alike, then the four sums of four lanes a b c d
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m512i h = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(u)),
                                     _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(u, 1)));
  const __m256i s = _mm256_add_epi64(_mm512_castsi512_si256(h), _mm512_extracti64x4_epi64(h, 1));
  __m256i* o = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(o, _mm256_add_epi64(_mm256_loadu_si256(o), s));
}
#elif defined(__AVX2__)
using vec = __m256i;
constexpr int W = 16, NT = 2, RB = 6;  // 12 accumulators + 2 weight vectors + 1 input vector of 16 registers
inline vec zero() { return _mm256_setzero_si256(); }
inline vec load_x(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline vec load_w(const int8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vec dot(vec x, vec w, vec acc) {
#if defined(__AVXVNNI__)
  asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(x), "x"(w));  // AVX-VNNI's VEX form, not AVX-512's
#else
  vec p;  // (the intrinsics: gcc hoisted the loads of x and spilled most accumulators)
  asm("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(p) : "x"(x), "x"(w));
#endif
  return acc;
}
inline int64_t hsum(vec v) {
  const __m256i h = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                     _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
  const __m128i q = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  return _mm_cvtsi128_si64(q) + _mm_extract_epi64(q, 1);
}
// out[0..1] += hsum(a), hsum(b) in one pass over the two: each sum of two lanes of one vector stays in int32 (a
// lane holds at most CHUNK / 8 products of |q| <= 128 and |xq| <= 32767, so two at most 2^16 * 32767 < 2^31)
inline void hsum2(vec a, vec b, int64_t* out) {
  // per 128-bit block: a0+a2 b0+b2 a1+a3 b1+b3
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i h = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(ab)),
                                     _mm256_cvtepi32_epi64(_mm256_extracti128_si256(ab, 1)));
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  __m128i* o = reinterpret_cast<__m128i*>(out);
  _mm_storeu_si128(o, _mm_add_epi64(_mm_loadu_si128(o), s));
}
#else
constexpr int W = 16, NT = 2, RB = 4;
struct vec {
  int16_t v[W];
};
struct acc8 {
  int32_t v[8];
};
inline vec load_x(const int16_t* p) {
  vec r;
  for (int i = 0; i < W; ++i) r.v[i] = p[i];
  return r;
}
inline vec load_w(const int8_t* p) {
  vec r;
  for (int i = 0; i < W; ++i) r.v[i] = p[i];
  return r;
}
#endif

#if defined(__AVX2__) || (defined(__AVX512F__) && defined(__AVX512BW__))
using acc_t = vec;
#else
using acc_t = acc8;
inline acc_t zero() { return acc8{{0, 0, 0, 0, 0, 0, 0, 0}}; }
inline acc_t dot(const vec& x, const vec& w, acc_t acc) {
  for (int i = 0; i < W; ++i) acc.v[i % 8] += int32_t{x.v[i]} * w.v[i];
  return acc;
}
inline int64_t hsum(const acc_t& a) {
  int64_t s = 0;
  for (const int32_t v : a.v) s += v;
  return s;
}
#endif

// Each weight row is prefetched PREFETCH_FAR (scaled_rows.h) ahead into L2 (prefetcht2) alone: the hardware
// prefetcher stops at 4 KB pages. Qwen2.5-Coder-1.5B on an AMD EPYC, 2 threads: a one-row step 76-96 ms at 8 KB into
// L1 (once the best of 0.5-16 KB into L1), 42-58 ms at 64 KB into L2 (float32 activations, measured then).
//
// A row's vector of x is loaded once into a register for the nt dot products of its weight rows: left to itself the
// compiler folded the load into each of them (measured with float32 activations: 24 loads of x a step instead of
// 6, and a pass of several rows waited on the loads).

// out[r * nt + j] += sum_{k0 <= k < k1} xq[r, k] q[j, k] (exact) for rb rows of xq (stride K) and nt weight rows
// (stride K); k1 - k0 a multiple of W, at most CHUNK
template <int rb, int nt>
inline void chunk(const int16_t* xq, const int8_t* q, int64_t K, int64_t k0, int64_t k1, int64_t* out) {
  acc_t acc[rb][nt];  // (the loops over rb and nt unrolled: the accumulators stay in registers)
#pragma GCC unroll 8
  for (int r = 0; r < rb; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < nt; ++j) acc[r][j] = zero();
  for (int64_t k = k0; k < k1; k += W) {
    vec w[nt];
#pragma GCC unroll 8
    for (int j = 0; j < nt; ++j) {
      __builtin_prefetch(q + j * K + k + PREFETCH_FAR, 0, 1);
      w[j] = load_w(q + j * K + k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) {
      vec xv = load_x(xq + r * K + k);
#if defined(__AVX2__) || (defined(__AVX512F__) && defined(__AVX512BW__))
      asm("" : "+v"(xv));  // one load of x a row, in a register: not folded into each of the nt dot products
#endif
#pragma GCC unroll 8
      for (int j = 0; j < nt; ++j) acc[r][j] = dot(xv, w[j], acc[r][j]);
    }
  }
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (nt == 4) {
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], out + r * nt);
    return;
  }
#elif defined(__AVX2__)
  if constexpr (nt == 2) {
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) hsum2(acc[r][0], acc[r][1], out + r * nt);
    return;
  }
#endif
#pragma GCC unroll 8
  for (int r = 0; r < rb; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < nt; ++j) out[r * nt + j] += hsum(acc[r][j]);
}

// out[r * nt + j] = sum_k xq[r, k] q[j, k] (exact) for rb rows of xq (stride K) and nt weight rows (stride K)
template <int rb, int nt>
inline void tile(const int16_t* xq, const int8_t* q, int64_t K, int64_t* out) {
  const int64_t Kv = K - K % W;
  for (int r = 0; r < rb; ++r)
    for (int j = 0; j < nt; ++j) out[r * nt + j] = 0;
  for (int64_t k0 = 0; k0 < Kv; k0 += CHUNK) chunk<rb, nt>(xq, q, K, k0, std::min(Kv, k0 + CHUNK), out);
  for (int r = 0; r < rb; ++r)
    for (int j = 0; j < nt; ++j)
      for (int64_t k = Kv; k < K; ++k) out[r * nt + j] += int32_t{xq[r * K + k]} * q[j * K + k];
}

// y[r, n] = Y(float(sum_k xq[r, k] q[n, k]) * sx[r] * s[n]); x [R, K] float32, q [N, K] int8, s [N] (S), y [R, N]
// (Y). Passes of more than RB rows take further row blocks, which widen each tile of weights again (from L1).
template <typename S, typename Y>
void mm(const float* x, int64_t R, int64_t K, const int8_t* q, const S* s, int64_t N, Y* y) {
  std::vector<int16_t> xq(R * K);
  std::vector<float> sx(R);
  for (int64_t r = 0; r < R; ++r) sx[r] = round_row(x + r * K, K, LEVELS, xq.data() + r * K);
  tiled_rows<NT, RB, int64_t>(R, N, [&](auto c, int64_t t, int64_t r, int64_t* out) {
    constexpr int rb = decltype(c)::value;
    const int64_t n = t * NT;
    const int16_t* xr = xq.data() + r * K;
    if (N - n >= NT) return tile<rb, NT>(xr, q + n * K, K, out);
    for (int64_t j = 0; j < N - n; ++j) {  // the last tile's weight rows one at a time
      int64_t col[rb];
      tile<rb, 1>(xr, q + (n + j) * K, K, col);
      for (int i = 0; i < rb; ++i) out[i * NT + j] = col[i];
    }
  }, put_scaled(sx.data(), s, N, y));
}

}  // namespace
}  // namespace trtspec_int8

// y [R, N] in x's dtype (bfloat16 or float32) = x [R, K], rounded to int16 per row, times (q [N, K] int8 * s [N]
// (bfloat16 or float32))^T
static inline at::Tensor int8_rows_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "int8_mm: x [R, K], q [N, K]");
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous(), "int8_mm: q int8, contiguous");
  const int64_t R = x.size(0), K = x.size(1), N = q.size(0);
  const int8_t* qp = q.const_data_ptr<int8_t>();
  return scaled_rows("int8_mm", x, s, N, [&](const float* xp, const auto* sp, auto* yp) {
    trtspec_int8::mm(xp, R, K, qp, sp, N, yp);
  });
}
