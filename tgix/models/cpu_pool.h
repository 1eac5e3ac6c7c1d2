// Work split over the caller and XLA's intra-op thread pool, shared by tgix's CPU kernels
// (cpu_int8.cc, cpu_int8_packed.cc).
//
// Units 0..units-1 are taken from a shared counter: a pool thread that starts late finds
// nothing left and returns, and the caller waits only for units already taken. The state
// lives in a shared_ptr because a late pool task may still run after the caller returns.

#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace tgix {

// fn(u) for every unit u in [0, units), on the caller and up to `helpers` pool threads (none
// when `parallel` is false: too little work to pay a thread's start), returning when all are
// done. fn must be safe to call from several threads on different units.
template <typename Fn>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t units, bool parallel, Fn fn) {
  struct State {
    State(Fn f, int64_t n) : fn(std::move(f)), units(n) {}
    Fn fn;
    int64_t units;
    std::atomic<int64_t> next{0}, done{0};
    void Work() {
      for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
        fn(u);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto state = std::make_shared<State>(std::move(fn), units);
  int64_t helpers = parallel ? std::max<int64_t>(pool.num_threads() - 1, 0) : 0;
  helpers = std::min(helpers, units - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([state] { state->Work(); });
  state->Work();
  while (state->done.load(std::memory_order_acquire) < units) {
#if defined(__SSE2__)
    _mm_pause();
#endif
  }
}

}  // namespace tgix
