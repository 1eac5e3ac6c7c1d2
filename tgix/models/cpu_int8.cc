// The LM head's bfloat16 copy under --quantize eetq on XLA:CPU, called through XLA's FFI
// (tgix/models/cpu_int8.py; the int8 layers' kernel is cpu_int8_packed.cc):
//
//   y[T, N] = x[T, K] . weight[N, K]^T                 TgixBf16Matmul
//
// x float32, weight bfloat16 out-major (each output's K inputs contiguous): each weight is
// widened exactly to float32 in registers (a 16-bit shift) and multiplied into up to 8 rows
// of x at once, so the weights are read once per 8 rows and no float copy of them is ever
// written (what XLA:CPU's own "convert then dot" does). Every output element is one
// fixed-order sum over its K inputs: a row's result does not depend on the other rows.
//
// Work is split over the caller and XLA's intra-op thread pool in blocks of outputs
// (cpu_pool.h).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlockOutputs = 32;  // outputs per unit of work shared between threads

// bfloat16 weights: the top 16 bits of a float32, widened by a shift.
struct Bf16Weights {
  using Type = uint16_t;
#if defined(__AVX512F__)
  static __m512 Load16(const uint16_t* w) {
    __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  static __m512 LoadTail(__mmask16 m, const uint16_t* w) {
    __m256i half = _mm256_maskz_loadu_epi16(m, w);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
#endif
  static float Widen(uint16_t w) {
    uint32_t bits = static_cast<uint32_t>(w) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

#if defined(__AVX512F__)

// Outputs n0..n1 for rows t0..t0+TB: one 16-wide float accumulator per row, each widened
// weight vector used for TB rows. (Tiles of 2-4 outputs sharing each x vector measured slower
// up to 16 rows: 1 row 2.1x the time, 4 rows 1.2x; 8% faster only at 64.)
template <typename W, int TB>
void Outputs(const float* x, int64_t K, const typename W::Type* weights, float* y,
             int64_t N, int64_t n0, int64_t n1, int64_t t0) {
  const int64_t tail = K % 16;
  const __mmask16 tail_mask = static_cast<__mmask16>((1u << tail) - 1);
  for (int64_t n = n0; n < n1; ++n) {
    const typename W::Type* w = weights + n * K;
    __m512 acc[TB];
    for (int t = 0; t < TB; ++t) acc[t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      __m512 wk = W::Load16(w + k);
      for (int t = 0; t < TB; ++t)
        acc[t] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(x + (t0 + t) * K + k), acc[t]);
    }
    if (tail) {
      __m512 wk = W::LoadTail(tail_mask, w + k);
      for (int t = 0; t < TB; ++t)
        acc[t] = _mm512_fmadd_ps(wk, _mm512_maskz_loadu_ps(tail_mask, x + (t0 + t) * K + k),
                                 acc[t]);
    }
    for (int t = 0; t < TB; ++t) y[(t0 + t) * N + n] = _mm512_reduce_add_ps(acc[t]);
  }
}

#else

// Portable form (no AVX-512): the same sums, vectorised by the compiler where it can.
template <typename W, int TB>
void Outputs(const float* x, int64_t K, const typename W::Type* weights, float* y,
             int64_t N, int64_t n0, int64_t n1, int64_t t0) {
  for (int64_t n = n0; n < n1; ++n) {
    const typename W::Type* w = weights + n * K;
    for (int t = 0; t < TB; ++t) {
      const float* xt = x + (t0 + t) * K;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < K; ++k) acc += W::Widen(w[k]) * xt[k];
      y[(t0 + t) * N + n] = acc;
    }
  }
}

#endif

// Every row of x for outputs n0..n1, in blocks of 8 rows (then 4, 2, 1).
template <typename W>
void AllRows(const float* x, int64_t T, int64_t K, const typename W::Type* w, float* y,
             int64_t N, int64_t n0, int64_t n1) {
  int64_t t = 0;
  for (; t + 8 <= T; t += 8) Outputs<W, 8>(x, K, w, y, N, n0, n1, t);
  if (t + 4 <= T) Outputs<W, 4>(x, K, w, y, N, n0, n1, t), t += 4;
  if (t + 2 <= T) Outputs<W, 2>(x, K, w, y, N, n0, n1, t), t += 2;
  if (t < T) Outputs<W, 1>(x, K, w, y, N, n0, n1, t);
}

// y [T, N] = x [T, K] . w [N, K]^T, blocks of outputs split over the caller and the pool
// (one thread under 2^20 multiply-adds: one row of the default model's largest layer streams
// as fast on one core).
template <typename W>
ffi::Error Run(ffi::ThreadPool& pool, const float* x, const void* w, float* y,
               int64_t T, int64_t K, int64_t N) {
  const auto* weights = static_cast<const typename W::Type*>(w);
  const int64_t blocks = (N + kBlockOutputs - 1) / kBlockOutputs;
  tgix::ParallelFor(pool, blocks, T * N * K >= (int64_t{1} << 20), [=](int64_t b) {
    const int64_t n0 = b * kBlockOutputs, n1 = std::min(N, n0 + kBlockOutputs);
    AllRows<W>(x, T, K, weights, y, N, n0, n1);
  });
  return ffi::Error::Success();
}

ffi::Error Bf16MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::BF16> weight, ffi::ResultBuffer<ffi::F32> y) {
  auto x_dims = x.dimensions(), w_dims = weight.dimensions();
  if (x_dims.size() != 2 || w_dims.size() != 2 || x_dims[1] != w_dims[1])
    return ffi::Error::InvalidArgument("tgix_bf16_matmul: x [T, K] and weight [N, K]");
  return Run<Bf16Weights>(pool, x.typed_data(), weight.untyped_data(), y->typed_data(),
                          x_dims[0], x_dims[1], w_dims[0]);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TgixBf16Matmul, Bf16MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
