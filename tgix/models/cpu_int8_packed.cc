// tgix's int8 x int8 matrix product for XLA:CPU, called through XLA's FFI (cpu_int8.py):
//
//   y[T, N] = (xq[T, K] . codes[N, K]^T) * scale[N]          TgixInt8PackedMatmul
//
// x arrives in float32 and each row is written as two int8 digits (quant.split_activations:
// s = max|row| / 127, high = round(x / s), low = round(254 * (x / s - high)), so x ~= s *
// (high + low / 254) to 1/64,000 of the row's largest value). Both digit rows are multiplied
// into the codes with exact int32 sums, so a row's result never depends on the other rows of
// its step, and the same integers come out whatever the blocking or thread split.
//
// The codes are packed once at load time (cpu_int8.pack): [N/16, K/4, 16, 4] bytes, each
// code + 128 as an unsigned byte (padding: code 0). One 64-byte load is 4 inputs of 16
// outputs, the shape AVX512-VNNI's vpdpbusd multiplies (unsigned bytes by signed bytes, 4
// products summed into each int32 lane) against 4 digits of one row broadcast to every lane:
// 64 multiply-adds per instruction, per-output sums in lanes (no horizontal reductions).
// The +128 comes back out per row: sum_k d[k] * (c[k] + 128) = sum_k d[k] * c[k] + 128 * sum_k d[k].
//
// A tile is R rows x J blocks of 16 outputs: 2 * R * J int32 accumulators (R * J per digit)
// in registers, each 64-byte load of codes used for R rows, each broadcast digit for J blocks.
// Work (tiles of rows x output panels) is split over the caller and XLA's intra-op pool
// (cpu_pool.h), after the rows are quantized (also shared).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TGIX_VNNI 1
#endif

#include "cpu_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Tile shape: R = 3 rows x J = 3 blocks, 18 accumulators (4 x 2 and 2 x 4 measured the same
// within noise; 4 x 3 spills registers under GCC 12).
constexpr int kPanel = 3;     // 16-output blocks per unit of work (J of a full tile)
constexpr int kTileRows = 3;  // rows per tile (R)
// Work below this many multiply-adds stays on the caller's thread. At one row, a second
// thread still pays on an Ice Lake Xeon (the default model's 210 projections 11.5 against
// 14.8 ms): one core does not saturate memory bandwidth.
constexpr int64_t kParallelMin = int64_t{1} << 16;
constexpr int64_t kRowChunk = 96;    // rows per unit of work
constexpr int64_t kQuantChunk = 16;  // rows quantized per unit of the first phase
constexpr float kDigit = 254.0f;

// The quantized rows of x: digits [T, K4] (zero past K), the scale s and each digit row's sum.
struct Digits {
  int64_t T = 0, K = 0, K4 = 0;
  std::unique_ptr<int8_t[]> high, low;  // not zeroed up front: Quantize writes padding
  std::vector<float> s;
  std::vector<int32_t> high_sum, low_sum;

  // Row t of x [T, K] -> its digits, s and digit sums. The AVX-512 form computes the same
  // IEEE operations 16 at a time (a test compares it bit for bit with the scalar one): at 512
  // rows, the scalar loop took a third of a K/V projection's time.
  void Quantize(const float* x, int64_t t) {
    const float* row = x + t * K;
    int8_t* hi = high.get() + t * K4;
    int8_t* lo = low.get() + t * K4;
    std::memset(hi + K, 0, K4 - K);  // padding digits: 0
    std::memset(lo + K, 0, K4 - K);
    int64_t k = 0;
    float absmax = 0.0f;
#if defined(TGIX_VNNI)
    __m512 vmax = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
    absmax = _mm512_reduce_max_ps(vmax);
#endif
    for (; k < K; ++k) absmax = std::max(absmax, std::fabs(row[k]));
    const float scale = absmax > 0.0f ? absmax / 127.0f : 1.0f;
    int32_t hs = 0, ls = 0;
    k = 0;
#if defined(TGIX_VNNI)
    const __m512 vscale = _mm512_set1_ps(scale), vdigit = _mm512_set1_ps(kDigit);
    __m512i hsum = _mm512_setzero_si512(), lsum = _mm512_setzero_si512();
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (; k + 16 <= K; k += 16) {
      const __m512 v = _mm512_div_ps(_mm512_loadu_ps(row + k), vscale);
      const __m512 h = _mm512_roundscale_ps(v, kNearest);
      const __m512 l = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, h), vdigit), kNearest);
      const __m512i hi32 = _mm512_cvtps_epi32(h), lo32 = _mm512_cvtps_epi32(l);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + k), _mm512_cvtepi32_epi8(hi32));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + k), _mm512_cvtepi32_epi8(lo32));
      hsum = _mm512_add_epi32(hsum, hi32);
      lsum = _mm512_add_epi32(lsum, lo32);
    }
    hs = _mm512_reduce_add_epi32(hsum);
    ls = _mm512_reduce_add_epi32(lsum);
#endif
    for (; k < K; ++k) {
      const float v = row[k] / scale;
      const float h = std::nearbyint(v);  // round half to even, as jnp.round
      const float l = std::nearbyint((v - h) * kDigit);
      hi[k] = static_cast<int8_t>(h);
      lo[k] = static_cast<int8_t>(l);
      hs += hi[k];
      ls += lo[k];
    }
    s[t] = scale;
    high_sum[t] = hs;
    low_sum[t] = ls;
  }
};

// y[t, n] for one output: the +128 offsets taken out, digits joined, scaled.
inline float Join(int32_t acc_high, int32_t acc_low, const Digits& d, int64_t t, float scale) {
  const float h = static_cast<float>(acc_high - 128 * d.high_sum[t]);
  const float l = static_cast<float>(acc_low - 128 * d.low_sum[t]);
  return (h + l * (1.0f / kDigit)) * d.s[t] * scale;
}

#if defined(TGIX_VNNI)

// One step of a tile: accumulators acc[(r * J + j) * 2 + digit] += the 4 codes per lane of
// block j times the 4 digits of row r. A fold over compile-time indices, so every
// accumulator is a register of its own (GCC 12 keeps arrays indexed in loops on the stack).
template <int J, size_t... I>
inline void Step(__m512i* acc, const __m512i* wv, const __m512i* digits,
                 std::index_sequence<I...>) {
  ((acc[I] = _mm512_dpbusd_epi32(acc[I], wv[(I / 2) % J], digits[(I / (2 * J)) * 2 + I % 2])),
   ...);
}

// y for 16 outputs of row t from their two accumulators (Join's arithmetic, 16 lanes).
inline void Out(__m512i acc_high, __m512i acc_low, const Digits& d, const float* scale,
                float* y, int64_t N, int64_t t, int64_t n0) {
  const __mmask16 valid = N - n0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  const __m512 h = _mm512_cvtepi32_ps(
      _mm512_sub_epi32(acc_high, _mm512_set1_epi32(128 * d.high_sum[t])));
  const __m512 l = _mm512_cvtepi32_ps(
      _mm512_sub_epi32(acc_low, _mm512_set1_epi32(128 * d.low_sum[t])));
  __m512 v = _mm512_add_ps(h, _mm512_mul_ps(l, _mm512_set1_ps(1.0f / kDigit)));
  v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(d.s[t])),
                    _mm512_maskz_loadu_ps(valid, scale + n0));
  _mm512_mask_storeu_ps(y + t * N + n0, valid, v);
}

template <int J, size_t... P>
inline void Finish(const __m512i* acc, const Digits& d, const float* scale, float* y, int64_t N,
                   int64_t t0, int64_t b0, std::index_sequence<P...>) {
  (Out(acc[2 * P], acc[2 * P + 1], d, scale, y, N, t0 + P / J, (b0 + P % J) * 16), ...);
}

// Rows t0..t0+R x blocks b0..b0+J (16 outputs each).
template <int R, int J>
void Tile(const Digits& d, const uint8_t* packed, const float* scale, float* y, int64_t N,
          int64_t t0, int64_t b0) {
  const int64_t steps = d.K4 / 4;  // 4 inputs per step
  __m512i acc[2 * R * J];
  for (int i = 0; i < 2 * R * J; ++i) acc[i] = _mm512_setzero_si512();
  const int8_t* rows[2 * R];  // high, low digits of each row
  for (int r = 0; r < R; ++r) {
    rows[2 * r] = d.high.get() + (t0 + r) * d.K4;
    rows[2 * r + 1] = d.low.get() + (t0 + r) * d.K4;
  }
  const uint8_t* w = packed + b0 * steps * 64;
  for (int64_t k = 0; k < steps; ++k) {
    __m512i wv[J], digits[2 * R];
    for (int j = 0; j < J; ++j) wv[j] = _mm512_loadu_si512(w + (j * steps + k) * 64);
    for (int i = 0; i < 2 * R; ++i) {
      int32_t four;  // 4 digits as one lane (memcpy: no aliasing of int8 data as int32)
      std::memcpy(&four, rows[i] + 4 * k, sizeof four);
      digits[i] = _mm512_set1_epi32(four);
    }
    Step<J>(acc, wv, digits, std::make_index_sequence<2 * R * J>());
  }
  Finish<J>(acc, d, scale, y, N, t0, b0, std::make_index_sequence<R * J>());
}

#else

// Portable form (no AVX512-VNNI): the same integer sums, in the same packed layout.
template <int R, int J>
void Tile(const Digits& d, const uint8_t* packed, const float* scale, float* y, int64_t N,
          int64_t t0, int64_t b0) {
  const int64_t steps = d.K4 / 4;
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    const int8_t* hi = d.high.get() + t * d.K4;
    const int8_t* lo = d.low.get() + t * d.K4;
    for (int j = 0; j < J; ++j) {
      int32_t h[16] = {0}, l[16] = {0};
      const uint8_t* w = packed + (b0 + j) * steps * 64;
      for (int64_t k = 0; k < steps; ++k)
        for (int lane = 0; lane < 16; ++lane)
          for (int i = 0; i < 4; ++i) {
            const int32_t c = w[k * 64 + lane * 4 + i];
            h[lane] += c * hi[k * 4 + i];
            l[lane] += c * lo[k * 4 + i];
          }
      const int64_t n0 = (b0 + j) * 16, n1 = std::min(N, n0 + 16);
      for (int64_t n = n0; n < n1; ++n) y[t * N + n] = Join(h[n - n0], l[n - n0], d, t, scale[n]);
    }
  }
}

#endif

// Rows t0..t1 of one panel (blocks b0..b0+J), in tiles of kTileRows rows, then 2, then 1.
template <int J>
void Panel(const Digits& d, const uint8_t* packed, const float* scale, float* y, int64_t N,
           int64_t t0, int64_t t1, int64_t b0) {
  int64_t t = t0;
  for (; t + kTileRows <= t1; t += kTileRows) Tile<kTileRows, J>(d, packed, scale, y, N, t, b0);
  if (t + 2 <= t1) Tile<2, J>(d, packed, scale, y, N, t, b0), t += 2;
  for (; t < t1; ++t) Tile<1, J>(d, packed, scale, y, N, t, b0);
}

// Rows t0..t1 of the panel at blocks b0.. (up to kPanel blocks).
void Unit(const Digits& d, const uint8_t* packed, const float* scale, float* y, int64_t N,
          int64_t blocks, int64_t t0, int64_t t1, int64_t b0) {
  switch (std::min<int64_t>(kPanel, blocks - b0)) {
    case 3: Panel<3>(d, packed, scale, y, N, t0, t1, b0); break;
    case 2: Panel<2>(d, packed, scale, y, N, t0, t1, b0); break;
    default: Panel<1>(d, packed, scale, y, N, t0, t1, b0); break;
  }
}

ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::U8> packed, ffi::Buffer<ffi::F32> scale,
                            ffi::ResultBuffer<ffi::F32> y) {
  auto x_dims = x.dimensions(), p_dims = packed.dimensions();
  const int64_t N = scale.element_count();
  if (x_dims.size() != 2 || p_dims.size() != 3 || p_dims[2] != 64 ||
      p_dims[0] != (N + 15) / 16 || p_dims[1] * 4 < x_dims[1] || p_dims[1] * 4 >= x_dims[1] + 4)
    return ffi::Error::InvalidArgument(
        "tgix_int8_packed_matmul: x [T, K], packed [N/16, K/4, 64] and scale [N]");
  Digits d;
  d.T = x_dims[0];
  d.K = x_dims[1];
  d.K4 = p_dims[1] * 4;
  d.high.reset(new int8_t[d.T * d.K4]);
  d.low.reset(new int8_t[d.T * d.K4]);
  d.s.resize(d.T);
  d.high_sum.resize(d.T);
  d.low_sum.resize(d.T);
  const float* xs = x.typed_data();
  const bool parallel = d.T * N * d.K >= kParallelMin;
  // first the rows as digits (the caller alone for up to kQuantChunk rows), then the tiles
  const int64_t quant_units = (d.T + kQuantChunk - 1) / kQuantChunk;
  tgix::ParallelFor(pool, quant_units, parallel, [&d, xs](int64_t u) {
    const int64_t t1 = std::min(d.T, (u + 1) * kQuantChunk);
    for (int64_t t = u * kQuantChunk; t < t1; ++t) d.Quantize(xs, t);
  });
  const int64_t blocks = p_dims[0], panels = (blocks + kPanel - 1) / kPanel;
  const int64_t chunks = (d.T + kRowChunk - 1) / kRowChunk;
  const uint8_t* codes = packed.typed_data();
  const float* scales = scale.typed_data();
  float* ys = y->typed_data();
  tgix::ParallelFor(pool, panels * chunks, parallel, [&, blocks, panels](int64_t u) {
    const int64_t t0 = (u / panels) * kRowChunk, b0 = (u % panels) * kPanel;
    Unit(d, codes, scales, ys, N, blocks, t0, std::min(d.T, t0 + kRowChunk), b0);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TgixInt8PackedMatmul, PackedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
