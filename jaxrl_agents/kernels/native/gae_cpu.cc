// Masked token-level GAE as an XLA FFI handler for the CPU backend.
//
// The same recurrence as `kernels.gae.gae`, computed row by row along the time axis of
// the [B, T] buffers as XLA lays them out (row-major), so no transpose is needed. Eight
// rows at a time run interleaved in one loop: their dependency chains are independent, so the
// core overlaps them instead of waiting on one chain's latency.
//
//   delta[t] = r[t] + gamma * V[s'] - V[t]     (s': next action token; last_value after)
//   A[t]     = delta[t] + gamma * lam * A[s']
//   outputs: A[t] * m[t] and (A[t] * m[t] + V[t]) * m[t]

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 8;                       // rows advanced together
constexpr int64_t kMinTokensPerPart = 1 << 15;  // below this a thread costs more than it saves

// Rows [row, row + kN): kN independent recurrences advanced together.
template <int kN>
inline void GaeRows(const float* r, const float* v, const float* m, const float* last_value,
                    float gamma, float gamma_lam, int64_t row, int64_t length, float* adv,
                    float* ret) {
  float next_v[kN], next_a[kN];
  for (int i = 0; i < kN; ++i) {
    next_v[i] = last_value[row + i];
    next_a[i] = 0.0f;
  }
  const int64_t base = row * length;
  for (int64_t t = length - 1; t >= 0; --t) {
#pragma GCC unroll 8
    for (int i = 0; i < kN; ++i) {
      const int64_t at = base + i * length + t;
      const float vt = v[at], mt = m[at];
      const float a = r[at] + gamma * next_v[i] - vt + gamma_lam * next_a[i];
      const bool is_action = mt > 0.0f;
      next_v[i] = is_action ? vt : next_v[i];
      next_a[i] = is_action ? a : next_a[i];
      const float masked = a * mt;
      adv[at] = masked;
      ret[at] = (masked + vt) * mt;
    }
  }
}

// Rows [begin, end), kLanes at a time, then one at a time.
void GaeRange(const float* r, const float* v, const float* m, const float* last, float gamma,
              float gamma_lam, int64_t begin, int64_t end, int64_t length, float* adv,
              float* ret) {
  int64_t row = begin;
  for (; row + kLanes <= end; row += kLanes) {
    GaeRows<kLanes>(r, v, m, last, gamma, gamma_lam, row, length, adv, ret);
  }
  for (; row < end; ++row) {
    GaeRows<1>(r, v, m, last, gamma, gamma_lam, row, length, adv, ret);
  }
}

ffi::Error GaeImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> rewards,
                   ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::F32> mask,
                   ffi::Buffer<ffi::F32> last_value, ffi::Buffer<ffi::F32> coefs,
                   ffi::ResultBuffer<ffi::F32> advantages, ffi::ResultBuffer<ffi::F32> returns) {
  const auto dims = rewards.dimensions();
  if (dims.size() != 2) {
    return ffi::Error::InvalidArgument("gae: rewards must be [B, T]");
  }
  const int64_t batch = dims[0], length = dims[1];
  if (values.element_count() != batch * length || mask.element_count() != batch * length ||
      last_value.element_count() != batch || coefs.element_count() != 2) {
    return ffi::Error::InvalidArgument("gae: shapes of values / mask / last_value / coefs");
  }
  const float gamma = coefs.typed_data()[0];
  const float gamma_lam = gamma * coefs.typed_data()[1];
  const float *r = rewards.typed_data(), *v = values.typed_data(), *m = mask.typed_data();
  const float* last = last_value.typed_data();
  float *adv = advantages->typed_data(), *ret = returns->typed_data();

  // Large inputs are split by row groups over XLA's intra-op threads and this one. Each
  // worker claims parts until none is left, so this thread never waits for a task that
  // has not started (no deadlock when the pool is busy), and a task that starts late finds
  // nothing to do; the shared state outlives this call for such a task.
  const int64_t groups = (batch + kLanes - 1) / kLanes;
  int64_t parts = std::min<int64_t>(pool.num_threads() + 1, groups);
  if (batch * length < kMinTokensPerPart * 2) parts = 1;
  if (parts <= 1) {
    GaeRange(r, v, m, last, gamma, gamma_lam, 0, batch, length, adv, ret);
    return ffi::Error::Success();
  }
  struct Work {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto work = std::make_shared<Work>();
  auto worker = [=] {
    for (int64_t p; (p = work->next.fetch_add(1)) < parts;) {
      const int64_t begin = std::min(batch, (groups * p / parts) * kLanes);
      const int64_t end = std::min(batch, (groups * (p + 1) / parts) * kLanes);
      GaeRange(r, v, m, last, gamma, gamma_lam, begin, end, length, adv, ret);
      work->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t p = 1; p < parts; ++p) pool.Schedule(decltype(worker)(worker));
  worker();
  while (work->done.load(std::memory_order_acquire) < parts) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlGaeF32, GaeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // rewards [B, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values [B, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // mask [B, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // last_value [B]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // (gamma, lam) [2]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // advantages [B, T]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // returns [B, T]
);
