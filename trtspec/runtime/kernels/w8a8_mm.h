// W8A8 matmul for the short passes of decoding: int8 weights per output channel, int8 activations per row
// (dynamic), int32 sums. y [R, N] = float(sum_k xq[r, k] q[n, k]) * sx[r] * s[n], where each row of x [R, K] is
// rounded to xq[r] = round(x[r] * 127 / amax(|x[r]|)) in [-127, 127] and sx[r] = amax / 127.
//
// Why: kernels/int8_mm.h widens every weight byte to float32 and multiplies it once per row of the pass. Here a
// byte of weight is one lane of an integer dot product (AVX-512 VNNI: 64 multiply-adds per instruction), the
// weights are packed so that each thread streams one run of memory, and the lanes of a dot product are NT weight
// rows (w4a8_mm.h's layout, a byte a weight): a row of activations enters as 4 bytes broadcast to every lane, so
// a block of up to RB rows keeps its sums in registers and reads each weight vector once.
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

// The packed layout (runtime/quant.py's `pack_tiles`): tiles of NT = 16 weight rows, N and K zero-padded to
// multiples of NT and CK; a tile is one run of memory, [Kp / 4, NT, 4]: its 64-byte vector v holds columns 4 v ..
// 4 v + 3 of the tile's 16 rows, row after row (byte lane * 4 + c: column 4 v + c of row n0 + lane).
constexpr int NT = 16, CK = 64;

// row x [K] -> xq [Kp] in [-127, 127] (zero past K), its scale sx and sum_k xq (a row of zeros: zeros, scale 0)
inline void quantize_row(const float* x, int64_t K, int64_t Kp, int8_t* xq, float* sx, int32_t* xsum) {
  *sx = round_row(x, K, 127, xq);
  int32_t sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += xq[k];
  std::fill(xq + K, xq + Kp, static_cast<int8_t>(0));
  *xsum = sum;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// rows per block: up to 10, one chain of dot products a row; blocks of up to TWO_CHAINS rows keep two (a dot
// product's latency is a few cycles). One block of 9 rows (a verify pass of K = 8) reads each weight vector once.
constexpr int RB = 10, TWO_CHAINS = 3;
constexpr int HALVES = 1;  // vectors of lanes per tile
constexpr int32_t OFFSET = 128;  // the weights enter as q + 128 (unsigned bytes)
using ivec = __m512i;
struct wvec {
  __m512i u;
};
inline ivec zero() { return _mm512_setzero_si512(); }
inline ivec set1(int32_t v) { return _mm512_set1_epi32(v); }
inline ivec add(ivec a, ivec b) { return _mm512_add_epi32(a, b); }
inline void store(int32_t* out, ivec v) { _mm512_storeu_si512(out, v); }
// acc + in each lane the dot product of its 4 unsigned bytes of w with the 4 signed bytes at x4: the bytes at x4
// broadcast by vpdpbusd's own memory operand ({1to16}), which compilers do not fold _mm512_set1_epi32 into. A tile
// of 9 rows in L1: ~1.1 cycles a dot product this way, ~1.6 with a vpbroadcastd of its own (an AMD EPYC, Zen 4).
inline ivec dpbusd_x4(ivec acc, __m512i w, const int8_t* x4) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x4)));
  return acc;
}
inline wvec load_w(const int8_t* p, int) {
  return {_mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set1_epi8(static_cast<char>(0x80)))};
}
using xvec = const int8_t*;  // 4 bytes of a row
inline xvec load_x(const int8_t* x4) { return x4; }
inline ivec dot(ivec acc, const wvec& w, xvec x4) { return dpbusd_x4(acc, w.u, x4); }
#elif defined(__AVX2__)
// 6 rows x 2 halves of sums in 16 registers (a few spill): 9 rows of Qwen2.5-Coder-1.5B's layer matmuls cost 2.1x one
// row at 6 against 2.2-2.3x at 3 or 4 (an AMD EPYC, this header built for AVX2)
constexpr int RB = 6, TWO_CHAINS = 0;
constexpr int HALVES = 2;  // two vectors of 8 lanes per tile, both read in one sweep
constexpr int32_t OFFSET = 0;
using ivec = __m256i;
struct wvec {
  __m256i abs, sign;
};
inline ivec zero() { return _mm256_setzero_si256(); }
inline ivec set1(int32_t v) { return _mm256_set1_epi32(v); }
inline wvec load_w(const int8_t* p, int half) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * half));
  return {_mm256_sign_epi8(q, q), q};
}
using xvec = __m256i;  // 4 bytes of a row, in every lane
inline xvec load_x(const int8_t* x4) {
  int32_t x;
  __builtin_memcpy(&x, x4, 4);
  return _mm256_set1_epi32(x);
}
// acc + the int16 sums of adjacent pairs of products (vpmaddubsw's), widened and summed in pairs again
inline ivec add_pairs(ivec acc, __m256i pairs) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline ivec dot(ivec acc, const wvec& w, xvec x) {
  // |q| * (x with q's sign), adjacent pairs summed
  return add_pairs(acc, _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(x, w.sign)));
}
inline ivec add(ivec a, ivec b) { return _mm256_add_epi32(a, b); }
inline void store(int32_t* out, ivec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v); }
#else
constexpr int RB = 4, TWO_CHAINS = 0;
constexpr int HALVES = 1;
constexpr int32_t OFFSET = 0;
struct ivec {
  int32_t v[NT];
};
struct wvec {
  const int8_t* p;
};
inline ivec set1(int32_t x) {
  ivec r;
  for (int i = 0; i < NT; ++i) r.v[i] = x;
  return r;
}
inline ivec zero() { return set1(0); }
inline wvec load_w(const int8_t* p, int) { return {p}; }
using xvec = const int8_t*;
inline xvec load_x(const int8_t* x4) { return x4; }
inline ivec dot(ivec acc, const wvec& w, xvec x4) {
  for (int i = 0; i < NT; ++i)
    for (int c = 0; c < 4; ++c) acc.v[i] += static_cast<int32_t>(w.p[i * 4 + c]) * x4[c];
  return acc;
}
inline ivec add(ivec a, ivec b) {
  for (int i = 0; i < NT; ++i) a.v[i] += b.v[i];
  return a;
}
inline void store(int32_t* out, ivec v) {
  for (int i = 0; i < NT; ++i) out[i] = v.v[i];
}
#endif
constexpr int LANES = NT / HALVES;

// out[r * NT + lane] = sum_k xq[r, k] q[lane, k] for rb rows of xq (stride Kp; xsum: their sums) and one packed
// tile qt, read once: CHAINS chains of dot products per row and vector of lanes, added at the end
template <int rb>
inline void tile(const int8_t* xq, const int32_t* xsum, const int8_t* qt, int64_t Kp, int32_t* out) {
  constexpr int CHAINS = rb <= TWO_CHAINS ? 2 : 1;
  ivec acc[rb][HALVES][CHAINS];
#pragma GCC unroll 10
  for (int r = 0; r < rb; ++r)
    for (int h = 0; h < HALVES; ++h)
      for (int c = 0; c < CHAINS; ++c) acc[r][h][c] = zero();
  for (int64_t k = 0; k < Kp; k += 16) {
    const int8_t* wk = qt + k * NT;  // columns k .. k + 15: 4 vectors of NT rows x 4 columns
    prefetch_ahead<256>(wk);
#pragma GCC unroll 4
    for (int o = 0; o < 4; ++o) {
      wvec w[HALVES];
#pragma GCC unroll 2
      for (int h = 0; h < HALVES; ++h) w[h] = load_w(wk + o * 64, h);
#pragma GCC unroll 10
      for (int r = 0; r < rb; ++r) {
        const xvec x = load_x(xq + r * Kp + k + 4 * o);
#pragma GCC unroll 2
        for (int h = 0; h < HALVES; ++h) acc[r][h][o % CHAINS] = dot(acc[r][h][o % CHAINS], w[h], x);
      }
    }
  }
  for (int r = 0; r < rb; ++r)
    for (int h = 0; h < HALVES; ++h) {
      ivec total = set1(-OFFSET * xsum[r]);
      for (int c = 0; c < CHAINS; ++c) total = add(total, acc[r][h][c]);
      store(out + r * NT + h * LANES, total);
    }
}

template <typename S, typename Y>
void mm(const float* x, int64_t R, int64_t K, const int8_t* qp, int64_t Kp, const S* s, int64_t N, Y* y) {
  std::vector<int8_t> xq(R * Kp);
  std::vector<float> sx(R);
  std::vector<int32_t> xsum(R);
  for (int64_t r = 0; r < R; ++r) quantize_row(x + r * K, K, Kp, xq.data() + r * Kp, &sx[r], &xsum[r]);
  tiled_rows<NT, RB, int32_t>(R, N, [&](auto c, int64_t t, int64_t r, int32_t* out) {
    tile<decltype(c)::value>(xq.data() + r * Kp, xsum.data() + r, qp + t * NT * Kp, Kp, out);
  }, put_scaled(sx.data(), s, N, y));
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
