// One Llama-family decoder layer on CPU, of an int8 (weight-only or W8A8), a bfloat16 or a float32 target, for the short passes of decoding
// (a decode step, a verify pass, a batched decode step): what runtime/llama.py's `block` computes, in one call
// instead of ~60 small torch ops (their dispatch, not their arithmetic, was ~40 % of a SmolLM2 decode step).
//
// Row-exact by construction: every row (b, t) is normed, rotated, attended and activated by the same loops on
// its own data; attention reads exactly the cache slots the mask lets it see, in slot order, so a verify row
// and the decode step that would produce the same token compute the same bits. The four matmuls are
// int8_mm.h's (int8 weights, int16 activations) or w8a8_mm.h's (int8 activations), row-exact themselves, or oneDNN's prepacked linear
// (bfloat16 weights with bf16 activations, or float32), called in blocks of lo..hi rows as runtime/linear.py's
// Linear calls it (fewer rows zero-padded to lo, more split into calls of hi): oneDNN's summation order
// follows the number of rows of a call, so each row must always see a call of the same kind.
//
// Shapes: x [R = B*T, H] float32 (the residual stream, updated and returned); cache layers kc, vc
// [rows, Hkv, max_seq, D] float32; rope [max_seq, 2D] (cos | sign-folded sin); positions [B, T] int64;
// start[b] = first slot of row b's T new entries; mask [B, T, S] bool or undefined (one row: a causal chain).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "int8_mm.h"
#include "w4a8_mm.h"
#include "w8a8_mm.h"

namespace {

using at::Tensor;
using c10::BFloat16;

// a * b + c, fused where the CPU has it (else std::fma would be a slow libm call): either way the same
// operations in every call of one build
inline float fmadd(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// a . b over n floats: vector partial sums reduced in a fixed order, the same for every row. Written with
// intrinsics because the compiler's own vectorization of a reduction loop kept a sequential horizontal sum per
// call: the attention scores (one dot a cache slot, head and row) were ~22 % of a 9-row W4A8 pass of
// Qwen2.5-Coder-1.5B (perf), at ~40 ns a 128-float dot against ~6 ns here.
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    i += 16;
  }
  s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  const __m256 t = _mm256_add_ps(s0, s1);
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  u = _mm_add_ps(u, _mm_movehl_ps(u, u));
  s = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
#else
  constexpr int L = 8;  // partial sums
  float acc[L] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; j < L; ++j) s += acc[j];
#endif
  for (; i < n; ++i) s = fmadd(a[i], b[i], s);
  return s;
}

// The vector of floats of the attention's loops (attention scores, weighted values), by the CPU's widest.
#if defined(__AVX512F__)
using fvec = __m512;
#define TRTSPEC_F(op) _mm512_##op
#elif defined(__AVX2__) && defined(__FMA__)
using fvec = __m256;
#define TRTSPEC_F(op) _mm256_##op
#endif

// The attention scores of a (row, head): p[i] = scale * q . k[seen[i]] for i < n, W slots at a time (W = a vector's
// floats): a partial-sum vector per slot, then one tree of shuffles and adds turns W of them into a vector of W
// sums, so the horizontal sum (which `dot` pays per slot, ~40 % of the attention of a 9-row SmolLM2 pass) is paid
// once a block. A slot's arithmetic depends only on D and on its place in its block (i mod W), never on the rows
// beside it: a verify row computes the bits of its decode step. The last block repeats slot seen[n - 1] where it
// runs past n; p must have room for n rounded up to W. Returns false where it does not apply (no vectors, or D not
// a multiple of W): the caller then takes `dot` per slot.
#if defined(__AVX512F__)
// v[0..15] -> one vector, lane j = the sum of v[j]'s 16 lanes
inline __m512 sum_lanes(const __m512* v) {
  __m512 c[8], g[4], h[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    c[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: [a, b, c, d], each over that lane's 4 floats
    const __m512d a = _mm512_castps_pd(c[2 * i]), b = _mm512_castps_pd(c[2 * i + 1]);
    g[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: [g0 L0+L1, g0 L2+L3, g1 L0+L1, g1 L2+L3]
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(g[2 * i], g[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(g[2 * i], g[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#elif defined(__AVX2__) && defined(__FMA__)
// v[0..7] -> one vector, lane j = the sum of v[j]'s 8 lanes
inline __m256 sum_lanes(const __m256* v) {
  __m256 c[4], g[2];
  for (int i = 0; i < 4; ++i)
    c[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {
    const __m256d a = _mm256_castps_pd(c[2 * i]), b = _mm256_castps_pd(c[2 * i + 1]);
    g[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(g[0], g[1], 0x20), _mm256_permute2f128_ps(g[0], g[1], 0x31));
}
#endif

#ifdef TRTSPEC_F
inline bool scores(const float* q, const float* k, const int64_t* seen, int64_t n, int64_t D, float scale, float* p) {
  constexpr int V = sizeof(fvec) / sizeof(float);  // slots a block, floats a vector
  if (D % V) return false;
  const fvec sc = TRTSPEC_F(set1_ps)(scale);
  for (int64_t i0 = 0; i0 < n; i0 += V) {
    fvec acc[V];
#pragma GCC unroll 16
    for (int j = 0; j < V; ++j) {
      const float* kr = k + seen[std::min<int64_t>(i0 + j, n - 1)] * D;
      fvec a = TRTSPEC_F(mul_ps)(TRTSPEC_F(loadu_ps)(q), TRTSPEC_F(loadu_ps)(kr));
      for (int64_t d = V; d < D; d += V)
        a = TRTSPEC_F(fmadd_ps)(TRTSPEC_F(loadu_ps)(q + d), TRTSPEC_F(loadu_ps)(kr + d), a);
      acc[j] = a;
    }
    TRTSPEC_F(storeu_ps)(p + i0, TRTSPEC_F(mul_ps)(sum_lanes(acc), sc));
  }
  return true;
}
#else
inline bool scores(const float*, const float*, const int64_t*, int64_t, int64_t, float, float*) { return false; }
#endif
// the most slots `scores` takes at a time (16 with AVX-512, 8 with AVX2): the room it may write past n, and what the
// attention's tiles of slots are a multiple of (a query's blocks then start where they would in one untiled call)
constexpr int64_t SCORE_BLOCK = 16;

// the largest of p[0..n-1] (-inf for none): the same in any order, so in 8 partial maxima (one chain of maxss
// waited on itself, ~6 % of the attention of a 9-row pass)
inline float max_of(const float* p, int64_t n) {
  float acc[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = acc[j] < p[i + j] ? p[i + j] : acc[j];
  for (; i < n; ++i) acc[0] = acc[0] < p[i] ? p[i] : acc[0];
  float mx = acc[0];
  for (int j = 1; j < 8; ++j) mx = mx < acc[j] ? acc[j] : mx;
  return mx;
}

// the slots s < S with mask[s] true, in order, into seen; returns their count. 8 mask bytes at a time: runs of
// all-true and all-false (a chain's prefix, the slots past it) take one test each (byte by byte, ~6 %).
inline int64_t seen_slots(const bool* mask, int64_t S, int64_t* seen) {
  constexpr uint64_t ALL = 0x0101010101010101ull;
  int64_t n = 0, s = 0;
  for (; s + 8 <= S; s += 8) {
    uint64_t w;
    __builtin_memcpy(&w, mask + s, 8);
    if (w == ALL) {
      for (int j = 0; j < 8; ++j) seen[n + j] = s + j;
      n += 8;
    } else if (w != 0) {
      for (int j = 0; j < 8; ++j)
        if (mask[s + j]) seen[n++] = s + j;
    }
  }
  for (; s < S; ++s)
    if (mask[s]) seen[n++] = s;
  return n;
}

// p[0] + .. + p[n-1] in 8 partial sums, reduced in a fixed order (a single chain waited ~4 cycles a slot)
inline float total(const float* p, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  for (; i < n; ++i) acc[0] += p[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// exp(x) of the softmax and of silu: x = n ln 2 + r (n = round(x / ln 2), ln 2 in two parts), exp(r) by Cephes'
// degree-6 polynomial, 2^n added to the exponent; within 1 ulp of exp over the range it clamps x to (2^n stays a
// normal float). Plain float arithmetic (fmadd), so a loop of it vectorizes and every element takes the
// same operations wherever it falls. Why: std::exp is a libm call per element, and a verify pass pays one per
// column of the MLP and per cache slot of each head, per row (measured: silu over 8960 columns, 41 us a row
// against 4).
inline float exp_f(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float n = fmadd(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  // 1.5 * 2^23: round to nearest
  const float r = fmadd(n, 2.12194440e-4f, fmadd(n, -0.693359375f, x));
  float p = 1.9875691500e-4f;
  p = fmadd(p, r, 1.3981999507e-3f);
  p = fmadd(p, r, 8.3334519073e-3f);
  p = fmadd(p, r, 4.1665795894e-2f);
  p = fmadd(p, r, 1.6666665459e-1f);
  p = fmadd(p, r, 5.0000001201e-1f);
  p = fmadd(p, r * r, r) + 1.0f;
  int32_t bits;
  __builtin_memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(n) * (1 << 23);
  __builtin_memcpy(&p, &bits, 4);
  return p;
}

// o[d] += sum_i p[i] * v[seen[i] * D + d] for d < D, each a chain of fmadds in slot order: a head's values
// weighted by its softmax (o zeroed first; a chain cut into runs of slots, each continuing from o, is the same
// chain). In blocks of columns held in vector registers across the slots (the compiler's loop
// kept o in memory, a store and a load a slot and column vector: ~40 % of the attention's time in a 9-row pass),
// of 8 vectors, then of 4, 2 and one, then column by column: a column's block is set by D alone, the same in every
// call, and every block computes a column alike (a chain of fmadds in slot order), so blocks change time, not bits.
// Blocks narrower than 8 are for heads of 64 floats on AVX-512 (SmolLM2): one vector a block made each column's
// chain wait for the last fmadd, ~4 cycles a slot and vector.

#ifdef TRTSPEC_F
template <int NV>  // vectors a block
inline int64_t weighted_blocks(const float* p, const int64_t* seen, int64_t n, const float* v, int64_t D, int64_t d0,
                               float* o) {
  constexpr int V = sizeof(fvec) / sizeof(float), W = NV * V;
  for (; d0 + W <= D; d0 += W) {
    fvec acc[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = TRTSPEC_F(loadu_ps)(o + d0 + j * V);
    for (int64_t i = 0; i < n; ++i) {
      const fvec pi = TRTSPEC_F(set1_ps)(p[i]);
      const float* vr = v + seen[i] * D + d0;
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[j] = TRTSPEC_F(fmadd_ps)(pi, TRTSPEC_F(loadu_ps)(vr + j * V), acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) TRTSPEC_F(storeu_ps)(o + d0 + j * V, acc[j]);
  }
  return d0;
}
#endif

inline void weighted_add(const float* p, const int64_t* seen, int64_t n, const float* v, int64_t D, float* o) {
  int64_t d0 = 0;
#ifdef TRTSPEC_F
  d0 = weighted_blocks<8>(p, seen, n, v, D, d0, o);
  d0 = weighted_blocks<4>(p, seen, n, v, D, d0, o);
  d0 = weighted_blocks<2>(p, seen, n, v, D, d0, o);
  d0 = weighted_blocks<1>(p, seen, n, v, D, d0, o);
#undef TRTSPEC_F
#endif
  for (; d0 < D; ++d0) {
    float acc = o[d0];
    for (int64_t i = 0; i < n; ++i) acc = fmadd(p[i], v[seen[i] * D + d0], acc);
    o[d0] = acc;
  }
}

inline float inv_rms(const float* x, int64_t n, double eps) {
  return 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + static_cast<float>(eps));
}

// y[r] = A(x[r] * inv_rms(x[r]) * w)
template <typename A>
void rms_to(const float* x, const float* w, int64_t R, int64_t H, double eps, A* y) {
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * H;
    const float s = inv_rms(xr, H, eps);
    for (int64_t i = 0; i < H; ++i) y[r * H + i] = A(xr[i] * s * w[i]);
  }
}

// The matmuls: x [R, K] (activations A) times a weight [N, K]: int8 per channel (w, float32 scales s; int8_mm.h),
// or a bfloat16 or float32 weight prepacked for oneDNN (w; s = int64 [lo, hi], its row blocks), the kernel
// runtime/linear.py's Linear calls. Both are row-independent: a row's result does not depend on the rows beside it.
Tensor int8_mm(const Tensor& x, const Tensor& w, const Tensor& s) { return int8_rows_mm(x, w, s); }

// int8 weights packed in tiles and int8 activations per row (w8a8_mm.h): integer sums, exact whatever the rows
Tensor w8a8_mm(const Tensor& x, const Tensor& w, const Tensor& s) { return w8a8_rows_mm(x, w, s); }

// 4-bit weights in groups with integer steps of a row scale, int8 activations (w4a8_mm.h): integer sums too
Tensor w4a8_mm(const Tensor& x, const Tensor& w, const Tensor& s) { return w4a8_rows_mm(x, w, s); }

Tensor onednn_call(const Tensor& x, const Tensor& w) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(c10::IValue());  // no bias: the layer adds its biases itself
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<c10::optional<at::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

Tensor onednn_mm(const Tensor& x, const Tensor& w, const Tensor& rows) {
  TORCH_CHECK(rows.numel() == 2 && rows.scalar_type() == at::kLong, "row blocks: int64 [lo, hi]");
  const int64_t lo = rows.const_data_ptr<int64_t>()[0], hi = rows.const_data_ptr<int64_t>()[1], R = x.size(0);
  TORCH_CHECK(1 <= lo && lo <= hi, "row blocks: 1 <= lo <= hi");
  if (lo <= R && R <= hi) return onednn_call(x, w);
  std::vector<Tensor> outs;
  for (int64_t r = 0; r < R; r += hi) {
    const int64_t n = std::min(hi, R - r);
    Tensor part = x.narrow(0, r, n);
    if (n < lo) part = at::cat({part, at::zeros({lo - n, x.size(1)}, x.options())});
    outs.push_back(onednn_call(part.contiguous(), w).narrow(0, 0, n));
  }
  return at::cat(outs).contiguous();
}

// a matmul's result as the loops read it: [R, N] contiguous, and its bias (if any) [N] float32
const Tensor& checked(const Tensor& y, int64_t R, int64_t N, const c10::optional<Tensor>& bias) {
  TORCH_CHECK(y.dim() == 2 && y.size(0) == R && y.size(1) == N && y.is_contiguous(), "matmul result shape");
  TORCH_CHECK(!bias.has_value() || (bias->numel() == N && bias->scalar_type() == at::kFloat), "bias: [N] float32");
  return y;
}

// A bias [n] float32, or n zeros: the loops add it whether the layer has one or not. Not `b ? b[i] : 0`: the
// compiler turns that choice into a masked load from (near) address 0 when b is null, which an AMD Zen 4 runs
// through a slow microcode assist (measured: silu took 9 ms of a 9-row W4A8 pass of Qwen2.5-Coder-1.5B, 1 ms
// without). The zeros are one buffer per thread, grown as needed and never written (no allocation per call); a
// pointer to them holds until this thread's next call.
const float* bias_or_zeros(const c10::optional<Tensor>& b, int64_t n) {
  if (b.has_value()) return b->const_data_ptr<float>();
  thread_local std::vector<float> zeros;
  if (static_cast<int64_t>(zeros.size()) < n) zeros.resize(n, 0.0f);
  return zeros.data();
}

// x[r] += float(y[r]) + bias
template <typename A>
void add_into(float* x, const Tensor& y, const c10::optional<Tensor>& bias, int64_t R, int64_t H) {
  checked(y, R, H, bias);
  const A* yp = y.const_data_ptr<A>();
  const float* b = bias_or_zeros(bias, H);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < H; ++i) x[r * H + i] += static_cast<float>(yp[r * H + i]) + b[i];
}

}  // namespace

template <typename A, Tensor (*matmul)(const Tensor&, const Tensor&, const Tensor&)>
Tensor decode_layer(Tensor x, const Tensor& attn_norm, const Tensor& mlp_norm, double eps,
                    const Tensor& qkv_q, const Tensor& qkv_s, const c10::optional<Tensor>& qkv_b,
                    const Tensor& o_q, const Tensor& o_s, const c10::optional<Tensor>& o_b,
                    const Tensor& gu_q, const Tensor& gu_s, const c10::optional<Tensor>& gu_b,
                    const Tensor& d_q, const Tensor& d_s, const c10::optional<Tensor>& d_b,
                    const c10::optional<Tensor>& q_norm, const c10::optional<Tensor>& k_norm,
                    Tensor kc, Tensor vc, int64_t row0, const Tensor& positions, at::IntArrayRef start,
                    const Tensor& rope, const c10::optional<Tensor>& mask, int64_t nh, int64_t nkv) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: [R, H] float32");
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous() && kc.scalar_type() == at::kFloat, "cache: float32");
  const int64_t R = x.size(0), H = x.size(1);
  const int64_t B = positions.size(0), T = positions.size(1);
  TORCH_CHECK(B * T == R && static_cast<int64_t>(start.size()) == B, "positions/start do not match x");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "positions: int64, contiguous");
  TORCH_CHECK(rope.scalar_type() == at::kFloat && rope.is_contiguous(), "rope: float32, contiguous");
  // every pointer below stays inside its tensor: the shapes are checked here, not trusted
  TORCH_CHECK(kc.dim() == 4 && kc.sizes() == vc.sizes() && vc.scalar_type() == at::kFloat && kc.size(1) == nkv &&
              nkv > 0 && nh % nkv == 0 && kc.size(3) % 2 == 0, "cache layers: [rows, kv_heads, max_seq, head_dim]");
  const int64_t D = kc.size(3), maxS = kc.size(2), n_rep = nh / nkv, nq = nh * D, nk = nkv * D;
  TORCH_CHECK(row0 >= 0 && row0 + B <= kc.size(0), "rows outside the cache");
  TORCH_CHECK(rope.dim() == 2 && rope.size(1) == 2 * D, "rope: [max_seq, 2 * head_dim]");
  TORCH_CHECK(attn_norm.numel() == H && mlp_norm.numel() == H && attn_norm.scalar_type() == at::kFloat &&
              mlp_norm.scalar_type() == at::kFloat, "norm weights: [hidden] float32");
  TORCH_CHECK((!q_norm.has_value() || q_norm->numel() == D) && (!k_norm.has_value() || k_norm->numel() == D),
              "q/k norm weights: [head_dim]");
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(start[b] >= 0, "negative start slot");
  const int64_t half = D / 2;
  int64_t S = 0;  // cache slots a query may see: the mask's width, or the chain's end
  for (int64_t b = 0; b < B; ++b) S = std::max(S, start[b] + T);
  const bool* m = nullptr;
  if (mask.has_value()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->is_contiguous() && mask->dim() == 3 &&
                mask->size(0) == B && mask->size(1) == T, "mask: [B, T, S] bool, contiguous");
    S = mask->size(2);
    m = mask->const_data_ptr<bool>();
  } else {
    TORCH_CHECK(B == 1, "no mask: one row only");
  }
  TORCH_CHECK(S <= maxS, "mask wider than the cache");
  float* xp = x.data_ptr<float>();
  const auto bf = x.options().dtype(c10::CppTypeToScalarType<A>::value);  // the activations' dtype

  // attention input: norm, q/k/v, (q/k norm), RoPE, K/V into the cache
  Tensor h = at::empty({R, H}, bf);
  rms_to<A>(xp, attn_norm.const_data_ptr<float>(), R, H, eps, h.data_ptr<A>());
  // (the heads' width is checked on the matmul's result: every weight layout, packed or not, gives it)
  const Tensor qkv = checked(matmul(h, qkv_q, qkv_s), R, nq + 2 * nk, qkv_b);
  const A* qkvp = qkv.const_data_ptr<A>();
  const float* qkvb = bias_or_zeros(qkv_b, nq + 2 * nk);
  std::vector<float> q(R * nq), tmp(D);
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  const float* rp = rope.const_data_ptr<float>();
  float* kcp = kc.data_ptr<float>();
  float* vcp = vc.data_ptr<float>();
  const float* qn = q_norm.has_value() ? q_norm->const_data_ptr<float>() : nullptr;
  const float* kn = k_norm.has_value() ? k_norm->const_data_ptr<float>() : nullptr;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = r / T, t = r % T, slot = start[b] + t;
    TORCH_CHECK(slot < maxS && pos[r] >= 0 && pos[r] < rope.size(0), "cache slot or position out of range");
    const float* cs = rp + pos[r] * 2 * D;  // cos, then sin
    const A* src = qkvp + r * (nq + 2 * nk);
    for (int64_t hd = 0; hd < nh + nkv; ++hd) {  // q heads, then k heads: norm (Qwen3) and rotate
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = hd * D + d;
        tmp[d] = static_cast<float>(src[c]) + qkvb[c];
      }
      const float* nw = hd < nh ? qn : kn;
      if (nw) {
        const float s = inv_rms(tmp.data(), D, eps);
        for (int64_t d = 0; d < D; ++d) tmp[d] = tmp[d] * s * nw[d];
      }
      float* dst = hd < nh ? q.data() + r * nq + hd * D
                           : kcp + (((row0 + b) * nkv + (hd - nh)) * maxS + slot) * D;
      for (int64_t d = 0; d < D; ++d)
        dst[d] = tmp[d] * cs[d] + tmp[d < half ? d + half : d - half] * cs[D + d];
    }
    for (int64_t hd = 0; hd < nkv; ++hd) {
      float* dst = vcp + (((row0 + b) * nkv + hd) * maxS + slot) * D;
      const int64_t c0 = nq + nk + hd * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[c0 + d]) + qkvb[c0 + d];
    }
  }

  // attention: each (row, head) on the slots it sees, in slot order. A task is a share of the queries (rows x heads)
  // that read one kv head of one sequence, and they take its keys, then its values, in tiles of slots that stay in
  // L1 while each query of the task reads them: one query at a time they came from L2 (a 9-row SmolLM2 pass: ~3 ns a
  // slot and query for the scores, as much for the values). A query's numbers do not depend on its task: its scores
  // in `scores`' blocks of its own slot list, its values in one chain of fmadds a column, in slot order.
  Tensor att = at::empty({R, nq}, bf);
  A* ap = att.data_ptr<A>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = n_rep * T;  // the queries of a kv head and a sequence: query j is row j / n_rep, head j % n_rep
  const int64_t want = 8 * at::get_num_threads();  // tasks enough to share among the threads evenly
  const int64_t split = std::min(group, std::max<int64_t>(1, (want + B * nkv - 1) / (B * nkv)));
  const int64_t per = (group + split - 1) / split;         // queries a task
  const int64_t per_group = (group + per - 1) / per;       // tasks a group: none of them empty
  const int64_t tile = std::max<int64_t>(SCORE_BLOCK, 4096 / D / SCORE_BLOCK * SCORE_BLOCK);  // slots: 16 KB of floats
  at::parallel_for(0, B * nkv * per_group, 1, [&](int64_t lo, int64_t hi) {
    const int64_t P = S + SCORE_BLOCK;
    std::vector<float> p(per * P), os(per * D), inv(per);
    std::vector<int64_t> seen(per * S), count(per);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / (nkv * per_group), kvh = task / per_group % nkv, j0 = task % per_group * per;
      const int64_t nj = std::min(per, group - j0);  // >= 1
      const int64_t base = ((row0 + b) * nkv + kvh) * maxS;
      const float* kb = kcp + base * D;
      const float* vb = vcp + base * D;
      int64_t most = 0;
      for (int64_t j = 0; j < nj; ++j) {  // the slots each query sees
        const int64_t t = (j0 + j) / n_rep;
        int64_t* sj = seen.data() + j * S;
        int64_t n = 0;
        if (m) {
          n = seen_slots(m + (b * T + t) * S, S, sj);
        } else {
          for (int64_t s = 0; s <= start[b] + t; ++s) sj[n++] = s;
        }
        count[j] = n;
        most = std::max(most, n);
      }
      // query j's place in q and in att: its row's, then its head's
      auto place = [&](int64_t j) { return (b * T + (j0 + j) / n_rep) * nq + (kvh * n_rep + (j0 + j) % n_rep) * D; };
      for (int64_t i0 = 0; i0 < most; i0 += tile)  // scores
        for (int64_t j = 0; j < nj; ++j) {
          const int64_t c = std::min(tile, count[j] - i0);
          if (c <= 0) continue;
          const int64_t* sj = seen.data() + j * S + i0;
          float* pj = p.data() + j * P + i0;
          const float* qj = q.data() + place(j);
          if (!scores(qj, kb, sj, c, D, scale, pj))
            for (int64_t i = 0; i < c; ++i) pj[i] = dot(qj, kb + sj[i] * D, D) * scale;
        }
      for (int64_t j = 0; j < nj; ++j) {  // softmax, its sum kept for the end
        float* pj = p.data() + j * P;
        const int64_t n = count[j];
        const float mx = max_of(pj, n);
        for (int64_t i = 0; i < n; ++i) pj[i] = exp_f(pj[i] - mx);
        inv[j] = n ? 1.0f / total(pj, n) : 0.0f;
      }
      std::fill(os.begin(), os.begin() + nj * D, 0.0f);
      for (int64_t i0 = 0; i0 < most; i0 += tile)  // values
        for (int64_t j = 0; j < nj; ++j) {
          const int64_t c = std::min(tile, count[j] - i0);
          if (c > 0) weighted_add(p.data() + j * P + i0, seen.data() + j * S + i0, c, vb, D, os.data() + j * D);
        }
      for (int64_t j = 0; j < nj; ++j) {
        A* out = ap + place(j);
        for (int64_t d = 0; d < D; ++d) out[d] = A(os[j * D + d] * inv[j]);
      }
    }
  });
  add_into<A>(xp, matmul(att, o_q, o_s), o_b, R, H);

  // MLP: norm, gate/up, silu(gate) * up, down
  rms_to<A>(xp, mlp_norm.const_data_ptr<float>(), R, H, eps, h.data_ptr<A>());
  const Tensor gu = matmul(h, gu_q, gu_s);
  const int64_t I = gu.size(1) / 2;
  checked(gu, R, 2 * I, gu_b);
  Tensor a = at::empty({R, I}, bf);
  const A* gp = gu.const_data_ptr<A>();
  const float* gb = bias_or_zeros(gu_b, 2 * I);
  A* apm = a.data_ptr<A>();
  // in blocks of SILU columns of a row, in parallel: a column's place in its block is the same in every call
  constexpr int64_t SILU = 512;
  const int64_t blocks = (I + SILU - 1) / SILU;
  at::parallel_for(0, R * blocks, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t r = task / blocks, i0 = task % blocks * SILU, i1 = std::min(I, i0 + SILU);
      for (int64_t i = i0; i < i1; ++i) {
        const float g = static_cast<float>(gp[r * 2 * I + i]) + gb[i];
        const float u = static_cast<float>(gp[r * 2 * I + I + i]) + gb[I + i];
        apm[r * I + i] = A(g / (1.0f + exp_f(-g)) * u);
      }
    }
  });
  add_into<A>(xp, matmul(a, d_q, d_s), d_b, R, H);
  return x;
}

// Registered for every backend (catch-all): a oneDNN-prepacked weight may carry another dispatch key than CPU.
TORCH_LIBRARY(trtspec, lib) {
  // int8: *_q int8 weights, *_s their float32 scales; bf16 and float32: *_q oneDNN-prepacked weights, *_s their
  // row blocks (int64 [lo, hi])
  const std::string args =
      "(Tensor(a!) x, Tensor attn_norm, Tensor mlp_norm, float eps, "
      "Tensor qkv_q, Tensor qkv_s, Tensor? qkv_b, Tensor o_q, Tensor o_s, Tensor? o_b, "
      "Tensor gu_q, Tensor gu_s, Tensor? gu_b, Tensor d_q, Tensor d_s, Tensor? d_b, "
      "Tensor? q_norm, Tensor? k_norm, Tensor(b!) kc, Tensor(c!) vc, int row0, Tensor positions, "
      "int[] start, Tensor rope, Tensor? mask, int nh, int nkv) -> Tensor(a!)";
  lib.def(("decode_layer_int8" + args).c_str(), &decode_layer<float, int8_mm>);
  // the int8 matmul alone (runtime/quant.py's Int8Linear: a head, a layer the fused path does not run)
  lib.def("int8_mm(Tensor x, Tensor q, Tensor s) -> Tensor", &int8_rows_mm);
  // w8a8: *_q int8 weights packed in tiles (runtime/quant.py's pack_tiles), *_s their float32 scales
  lib.def(("decode_layer_w8a8" + args).c_str(), &decode_layer<float, w8a8_mm>);
  lib.def("w8a8_mm(Tensor x, Tensor qp, Tensor s) -> Tensor", &w8a8_rows_mm);
  // w4a8: *_q 4-bit weights and their group steps packed in tiles (runtime/quant.py's pack_w4a8), *_s row scales
  lib.def(("decode_layer_w4a8" + args).c_str(), &decode_layer<float, w4a8_mm>);
  lib.def("w4a8_mm(Tensor x, Tensor qp, Tensor s) -> Tensor", &w4a8_rows_mm);
  lib.def(("decode_layer_f32" + args).c_str(), &decode_layer<float, onednn_mm>);
  lib.def(("decode_layer_bf16" + args).c_str(), &decode_layer<BFloat16, onednn_mm>);
}
