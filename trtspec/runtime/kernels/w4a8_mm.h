// W4A8 matmul for the short passes of decoding: 4-bit weights in groups of G = 32 columns, int8 activations per
// row (dynamic, as w8a8_mm.h rounds them), integer sums throughout.
//
//   y [R, N] = float(sum_g m[n, g] * sum_{k in g} xq[r, k] q[n, k]) * sx[r] * S[n]
//
// q in [-8, 7] (stored as q + 8 in a nibble); each group's scale is S[n] * m[n, g], an integer step m in
// [0, 255] of the row's scale S[n] (runtime/quant.py's `quantize_w4a8` bounds m so that no sum can leave int32).
// Why: half of W8A8's bytes per weight (4.5 bits with m), so a decode step that streams its weights takes about
// half the time; and a group's scale that is an integer keeps the sum an integer, as W8A8's is: exact, so no
// order to keep, the same bits on every instruction set and from the torch reference (`w4a8_mm_reference`),
// and every row the same whatever rows share its call.
//
// Packed layout (runtime/quant.py's `pack_w4a8`), one run of memory per tile of NT = 16 weight rows:
//   [m: ng x 16 bytes, padded to 64] [ng groups x 4 octets x 64 bytes]
// where ng = ceil(K / 32) and in octet o of group g, byte lane * 4 + c holds (q + 8) of row n0 + lane at column
// k = 32 g + 8 o + c in its low nibble and at column k + 4 in its high nibble: one 64-byte vector unpacks into two
// vectors of 16 lanes x 4 bytes, the operand of an integer dot product whose 16 lanes are the tile's 16 rows.
//
// Kernels by the CPU this is compiled for: AVX-512 VNNI (vpdpbusd: the weights q + 8 unsigned, the activations
// signed; each group's sum starts at -8 * sum_{k in g} xq), AVX2 (vpmaddubsw, then vpmaddwd: no pair of products
// can saturate, as q + 8 <= 15 and |xq| <= 127), else plain loops.

#pragma once

#include "scaled_rows.h"
#include "w8a8_mm.h"  // quantize_row (each row of activations rounded to int8 as W8A8 rounds it), the int32 vectors

namespace trtspec_w4a8 {
namespace {

constexpr int NT = 16, G = 32;  // weight rows per tile (the lanes of a dot product), columns per group
// blocks of up to this many rows keep two chains of dependent dot products a row; taller ones one (their rows'
// chains are enough to fill the pipes, and the registers are not)
constexpr int TWO_CHAINS = 6;

// the vector of NT lanes of int32 sums and its operations (HALVES vectors per tile on AVX2), as w8a8_mm.h has them
static_assert(NT == trtspec_w8a8::NT, "w8a8_mm.h's lanes are a tile's rows here too");
using trtspec_w8a8::add;
using trtspec_w8a8::HALVES;
using trtspec_w8a8::ivec;
using trtspec_w8a8::LANES;
using trtspec_w8a8::set1;
using trtspec_w8a8::store;
using trtspec_w8a8::zero;

inline int64_t groups(int64_t K) { return (K + G - 1) / G; }
inline int64_t m_bytes(int64_t ng) { return (ng * NT + 63) / 64 * 64; }
inline int64_t tile_bytes(int64_t K) { return m_bytes(groups(K)) + groups(K) * 4 * 64; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// rows per block: up to 6 rows, two chains of dot products a row (6 x 3 accumulators + 8 weight vectors + m of 32
// registers); more, one chain a row (10 x 2 + 9). One block of 9 rows (a verify pass of K = 8) streams the
// weights while it computes; 6 rows and then 3 swept a tile twice, the second time with nothing to read (a 9-row
// pass of Qwen2.5-Coder-1.5B on an AMD EPYC: 64.7 ms in two sweeps, 58.7 in one; a one-row step ~36).
constexpr int RB = 10;
// the two nibble vectors of one octet (this half: all 16 lanes)
inline void unpack(const uint8_t* p, int, ivec* lo, ivec* hi) {
  const __m512i v = _mm512_loadu_si512(p), mask = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(v, mask);
  *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
}
inline ivec dot(ivec acc, ivec w, const int8_t* x4) { return trtspec_w8a8::dpbusd_x4(acc, w, x4); }
inline ivec load_m(const uint8_t* p, int) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline ivec madd(ivec tot, ivec a, ivec m) { return _mm512_add_epi32(tot, _mm512_mullo_epi32(a, m)); }
#elif defined(__AVX2__)
constexpr int RB = 2;
inline void unpack(const uint8_t* p, int half, ivec* lo, ivec* hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * half));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  *lo = _mm256_and_si256(v, mask);
  *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
}
inline ivec dot(ivec acc, ivec w, const int8_t* x4) {  // (q + 8) * xq, adjacent pairs summed
  return trtspec_w8a8::add_pairs(acc, _mm256_maddubs_epi16(w, trtspec_w8a8::load_x(x4)));
}
inline ivec load_m(const uint8_t* p, int half) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half)));
}
inline ivec madd(ivec tot, ivec a, ivec m) { return _mm256_add_epi32(tot, _mm256_mullo_epi32(a, m)); }
#else
constexpr int RB = 4;
// byte lane * 4 + c, as the lanes of a 4-byte dot product
struct nib {
  uint8_t b[NT * 4];
};
inline void unpack(const uint8_t* p, int, nib* lo, nib* hi) {
  for (int i = 0; i < NT * 4; ++i) {
    lo->b[i] = p[i] & 0x0F;
    hi->b[i] = p[i] >> 4;
  }
}
inline ivec dot(ivec acc, const nib& w, const int8_t* x4) {
  for (int i = 0; i < NT; ++i)
    for (int c = 0; c < 4; ++c) acc.v[i] += static_cast<int32_t>(w.b[i * 4 + c]) * x4[c];
  return acc;
}
inline ivec load_m(const uint8_t* p, int) {
  ivec r;
  for (int i = 0; i < NT; ++i) r.v[i] = p[i];
  return r;
}
inline ivec madd(ivec tot, ivec a, ivec m) {
  for (int i = 0; i < NT; ++i) tot.v[i] += a.v[i] * m.v[i];
  return tot;
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) || defined(__AVX2__)
using wvec = ivec;
#else
using wvec = nib;
#endif

// out[r * NT + lane] = sum_g m[lane, g] * sum_{k in g} xq[r, k] q[lane, k] for rb rows of xq (stride Kp; init:
// -8 * each group's sum of xq, stride ng) and one packed tile
template <int rb>
inline void tile(const int8_t* xq, const int32_t* init, int64_t Kp, int64_t ng, const uint8_t* qt, int32_t* out) {
  const uint8_t* mp = qt;
  const uint8_t* wp = qt + m_bytes(ng);
  for (int half = 0; half < HALVES; ++half) {
    ivec tot[rb];
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) tot[r] = zero();
    for (int64_t g = 0; g < ng; ++g) {
      const uint8_t* wg = wp + g * 256;
      prefetch_ahead<256>(wg);
      wvec lo[4], hi[4];
#pragma GCC unroll 4
      for (int o = 0; o < 4; ++o) unpack(wg + o * 64, half, &lo[o], &hi[o]);
      const ivec m = load_m(mp + g * NT, half);
#pragma GCC unroll 8
      for (int r = 0; r < rb; ++r) {
        const int8_t* x = xq + r * Kp + g * G;
        ivec a = set1(init[r * ng + g]);
        if constexpr (rb <= TWO_CHAINS) {
          ivec b = zero();
#pragma GCC unroll 4
          for (int o = 0; o < 4; ++o) {
            a = dot(a, lo[o], x + 8 * o);
            b = dot(b, hi[o], x + 8 * o + 4);
          }
          a = add(a, b);
        } else {
#pragma GCC unroll 4
          for (int o = 0; o < 4; ++o) a = dot(dot(a, lo[o], x + 8 * o), hi[o], x + 8 * o + 4);
        }
        tot[r] = madd(tot[r], a, m);
      }
    }
    for (int r = 0; r < rb; ++r) store(out + r * NT + half * LANES, tot[r]);
  }
}

template <typename S, typename Y>
void mm(const float* x, int64_t R, int64_t K, const uint8_t* qp, const S* s, int64_t N, Y* y) {
  const int64_t ng = groups(K), Kp = ng * G, tb = tile_bytes(K);
  std::vector<int8_t> xq(R * Kp);
  std::vector<float> sx(R);
  std::vector<int32_t> init(R * ng);
  for (int64_t r = 0; r < R; ++r) {
    int32_t total;
    trtspec_w8a8::quantize_row(x + r * K, K, Kp, xq.data() + r * Kp, &sx[r], &total);
    for (int64_t g = 0; g < ng; ++g) {
      int32_t sum = 0;
      for (int k = 0; k < G; ++k) sum += xq[r * Kp + g * G + k];
      init[r * ng + g] = -8 * sum;
    }
  }
  tiled_rows<NT, RB, int32_t>(R, N, [&](auto c, int64_t t, int64_t r, int32_t* out) {
    tile<decltype(c)::value>(xq.data() + r * Kp, init.data() + r * ng, Kp, ng, qp + t * tb, out);
  }, put_scaled(sx.data(), s, N, y));
}

}  // namespace
}  // namespace trtspec_w4a8

// y [R, N] in x's dtype (bfloat16 or float32) = x [R, K], rounded to int8 per row, times the 4-bit weight packed as
// qp [ceil(N / 16), tile bytes] uint8 (the layout above; runtime/quant.py's `pack_w4a8`), scaled by the row's
// scale and S [N] (bfloat16 or float32)
static inline at::Tensor w4a8_rows_mm(const at::Tensor& x, const at::Tensor& qp, const at::Tensor& s) {
  using trtspec_w4a8::NT;
  TORCH_CHECK(x.dim() == 2 && qp.dim() == 2 && s.dim() == 1, "w4a8_mm: x [R, K], qp [tiles, bytes], s [N]");
  const int64_t R = x.size(0), K = x.size(1), N = s.size(0);
  TORCH_CHECK(qp.scalar_type() == at::kByte && qp.is_contiguous(), "w4a8_mm: qp uint8, contiguous");
  TORCH_CHECK(qp.size(0) == (N + NT - 1) / NT && qp.size(1) == trtspec_w4a8::tile_bytes(K),
              "w4a8_mm: qp is not a [", N, ", ", K, "] weight packed in tiles of ", NT, " rows (pack_w4a8)");
  TORCH_CHECK(K < 65536, "w4a8_mm: K must be below 65536");
  const uint8_t* qq = qp.const_data_ptr<uint8_t>();
  return scaled_rows("w4a8_mm", x, s, N, [&](const float* xp, const auto* sp, auto* yp) {
    trtspec_w4a8::mm(xp, R, K, qq, sp, N, yp);
  });
}
