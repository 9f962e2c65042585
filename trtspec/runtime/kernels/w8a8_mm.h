// W8A8 matmul for the short passes of decoding: int8 weights per output channel, int8 activations per row
// (dynamic), int32 sums. y [R, N] = float(sum_k xq[r, k] q[n, k]) * sx[r] * s[n], where each row of x [R, K] is
// rounded to xq[r] = round(x[r] * 127 / amax(|x[r]|)) in [-127, 127] and sx[r] = amax / 127.
//
// Why: kernels/int8_mm.h widens every weight byte to float32 and multiplies it once per row of the pass, and reads
// each weight row as its own stream. Here a byte of weight is one lane of an integer dot product (AVX-512 VNNI: 64
// multiply-adds per instruction; AVX2: 32), and the weights are packed so that each thread streams one run of
// memory. Measured on an AMD EPYC (Zen 4, 2 threads), Qwen2.5-Coder-1.5B, a decode step: 39.7 ms against 71.6 for
// the weight-only int8 kernel; a pass of 5 rows 81 ms against 121 (bench/bench_rows.py; docs/measurements.md).
//
// Row-exact, and the same bits on every instruction set: a row's integer sum is exact (no rounding, so no order
// to keep), its rounding to xq and the three float32 products at the end are the row's own; the rows beside it,
// the tiling and the threads never enter. The torch fallback (runtime/quant.py's `w8a8_mm_reference`:
// torch._int_mm) computes the same bits. Sums stay inside int32 for K < 65536 (|255 * 127| * K < 2^31).
//
// Kernels by the CPU this is compiled for (runtime/fused.py builds with -march=native): AVX-512 VNNI
// (vpdpbusd on q + 128 as unsigned bytes, then minus 128 * sum_k xq), AVX2 (vpmaddubsw on |q| and xq with q's
// sign, then vpmaddwd: no pair of products can saturate, as |q|, |xq| <= 127), else plain loops.

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "scaled_rows.h"

#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// internal linkage throughout: a process may load builds of this header for other instruction sets (the tests)
namespace trtspec_w8a8 {
namespace {

// The packed weight layout: tiles of NT weight rows, each in chunks of CK bytes, [N / NT, K / CK, NT, CK] (N and
// K zero-padded to multiples), so each thread streams its tiles as one run of memory (runtime/quant.py packs it).
// Measured on an AMD EPYC (Zen 4), 2 threads, one row: 27-30 GB/s against 18-21 for row-major [N, K].
constexpr int NT = 4, CK = 64;

// row x [K] -> xq [Kp] in [-127, 127] (zero past K), its scale sx and sum_k xq (a row of zeros: zeros, scale 0)
inline void quantize_row(const float* x, int64_t K, int64_t Kp, int8_t* xq, float* sx, int32_t* xsum) {
  float amax = 0;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  *sx = amax / 127.0f;
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(x[k] * inv)));  // round half to even
    xq[k] = static_cast<int8_t>(v);
    sum += xq[k];
  }
  std::fill(xq + K, xq + Kp, static_cast<int8_t>(0));
  *xsum = sum;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int VB = 64, RB = 6;  // 24 accumulators + 4 weight vectors + 1 input vector of 32 registers
constexpr int32_t OFFSET = 128;  // the weights enter as q + 128 (unsigned bytes)
using acc_t = __m512i;
struct wvec {
  __m512i u;
};
inline acc_t zero() { return _mm512_setzero_si512(); }
inline wvec load_w(const int8_t* p) {
  return {_mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set1_epi8(static_cast<char>(0x80)))};
}
using xvec = __m512i;
inline xvec load_x(const int8_t* p) { return _mm512_loadu_si512(p); }
inline acc_t dot(acc_t acc, const wvec& w, xvec x) { return _mm512_dpbusd_epi32(acc, w.u, x); }
inline int32_t total(acc_t a) { return _mm512_reduce_add_epi32(a); }
#elif defined(__AVX2__)
constexpr int VB = 32, RB = 2;  // 8 accumulators + 4 x 2 weight vectors of 16 registers
constexpr int32_t OFFSET = 0;
using acc_t = __m256i;
struct wvec {
  __m256i abs, sign;
};
inline acc_t zero() { return _mm256_setzero_si256(); }
inline wvec load_w(const int8_t* p) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_sign_epi8(q, q), q};
}
using xvec = __m256i;
inline xvec load_x(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline acc_t dot(acc_t acc, const wvec& w, xvec x) {
  const __m256i xs = _mm256_sign_epi8(x, w.sign);
  const __m256i pairs = _mm256_maddubs_epi16(w.abs, xs);  // |q| * (x with q's sign), adjacent pairs summed
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline int32_t total(acc_t a) {
  alignas(32) int32_t t[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(t), a);
  int32_t s = 0;
  for (int i = 0; i < 8; ++i) s += t[i];
  return s;
}
#else
constexpr int VB = 16, RB = 4;
constexpr int32_t OFFSET = 0;
struct acc_t {
  int32_t v;
};
struct wvec {
  const int8_t* p;
};
inline acc_t zero() { return {0}; }
inline wvec load_w(const int8_t* p) { return {p}; }
using xvec = const int8_t*;
inline xvec load_x(const int8_t* p) { return p; }
inline acc_t dot(acc_t acc, const wvec& w, xvec x) {
  for (int i = 0; i < VB; ++i) acc.v += static_cast<int32_t>(w.p[i]) * x[i];
  return acc;
}
inline int32_t total(acc_t a) { return a.v; }
#endif

constexpr int64_t PREFETCH = 8192;  // bytes ahead in the tile's run (8 KB measured best for kernels/int8_mm.h)
constexpr int64_t ROW_CHUNK = 64;   // rows of x per sweep over the weights

// out[r * NT + j] = sum_k xq[r, k] q[j, k] for rb rows of xq (stride Kp; xsum: their sums) and one packed tile qt
template <int rb>
inline void tile(const int8_t* xq, const int32_t* xsum, const int8_t* qt, int64_t Kp, int32_t* out) {
  acc_t acc[rb][NT];
#pragma GCC unroll 8
  for (int r = 0; r < rb; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[r][j] = zero();
  for (int64_t k = 0; k < Kp; k += CK) {
    const int8_t* wk = qt + k * NT;  // this chunk of the tile: NT rows of CK bytes
#pragma GCC unroll 4
    for (int line = 0; line < NT * CK; line += 64) __builtin_prefetch(wk + PREFETCH + line, 0, 3);
#pragma GCC unroll 4
    for (int h = 0; h < CK; h += VB) {
      wvec w[NT];
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) w[j] = load_w(wk + j * CK + h);
#pragma GCC unroll 8
      for (int r = 0; r < rb; ++r) {
        const xvec xv = load_x(xq + r * Kp + k + h);  // once per row: one load feeds the tile's NT rows
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) acc[r][j] = dot(acc[r][j], w[j], xv);
      }
    }
  }
  for (int r = 0; r < rb; ++r)
    for (int j = 0; j < NT; ++j) out[r * NT + j] = total(acc[r][j]) - OFFSET * xsum[r];
}

// rows r0 .. r0 + rc of y, tile by tile (threads take tiles), in blocks of RB rows
template <typename S, typename Y>
void sweep(const int8_t* xq, const float* sx, const int32_t* xsum, int64_t r0, int64_t rc, int64_t Kp,
           const int8_t* qp, const S* s, int64_t N, Y* y) {
  const int64_t tiles = (N + NT - 1) / NT;
  at::parallel_for(0, tiles, 16, [&](int64_t lo, int64_t hi) {
    int32_t out[RB * NT];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t n = t * NT, nt = std::min<int64_t>(NT, N - n);
      for (int64_t r = r0; r < r0 + rc; r += RB) {
        const int rb = static_cast<int>(std::min<int64_t>(RB, r0 + rc - r));
        by_rows<RB>(rb, [&](auto c) { tile<decltype(c)::value>(xq + r * Kp, xsum + r, qp + t * NT * Kp, Kp, out); });
        for (int i = 0; i < rb; ++i)
          for (int64_t j = 0; j < nt; ++j)
            y[(r + i) * N + n + j] = Y(static_cast<float>(out[i * NT + j]) * sx[r + i] * static_cast<float>(s[n + j]));
      }
    }
  });
}

template <typename S, typename Y>
void mm(const float* x, int64_t R, int64_t K, const int8_t* qp, int64_t Kp, const S* s, int64_t N, Y* y) {
  std::vector<int8_t> xq(R * Kp);
  std::vector<float> sx(R);
  std::vector<int32_t> xsum(R);
  for (int64_t r = 0; r < R; ++r) quantize_row(x + r * K, K, Kp, xq.data() + r * Kp, &sx[r], &xsum[r]);
  for (int64_t r0 = 0; r0 < R; r0 += ROW_CHUNK)
    sweep(xq.data(), sx.data(), xsum.data(), r0, std::min(ROW_CHUNK, R - r0), Kp, qp, s, N, y);
}

}  // namespace
}  // namespace trtspec_w8a8

// y [R, N] in x's dtype (bfloat16 or float32) = x [R, K], rounded to int8 per row, times the int8 weight q [N, K]
// packed as qp [ceil(N / NT) * NT, ceil(K / CK) * CK] (the layout above; runtime/quant.py's `pack_tiles`), scaled by
// the row's scale and s [N] (bfloat16 or float32)
static inline at::Tensor w8a8_rows_mm(const at::Tensor& x, const at::Tensor& qp, const at::Tensor& s) {
  using trtspec_w8a8::CK;
  using trtspec_w8a8::NT;
  TORCH_CHECK(x.dim() == 2 && qp.dim() == 2 && s.dim() == 1, "w8a8_mm: x [R, K], qp [Np, Kp], s [N]");
  const int64_t R = x.size(0), K = x.size(1), N = s.size(0), Kp = qp.size(1);
  TORCH_CHECK(qp.scalar_type() == at::kChar && qp.is_contiguous(), "w8a8_mm: qp int8, contiguous");
  TORCH_CHECK(qp.size(0) == (N + NT - 1) / NT * NT && Kp == (K + CK - 1) / CK * CK,
              "w8a8_mm: qp is not q [N, K] packed in tiles of ", NT, " rows and chunks of ", CK, " columns");
  TORCH_CHECK(K < 65536, "w8a8_mm: K must be below 65536 (int32 sums)");
  const int8_t* qq = qp.const_data_ptr<int8_t>();
  return scaled_rows("w8a8_mm", x, s, N, [&](const float* xp, const auto* sp, auto* yp) {
    trtspec_w8a8::mm(xp, R, K, qq, Kp, sp, N, yp);
  });
}
