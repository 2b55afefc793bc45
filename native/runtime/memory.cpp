// The allocator: one Rust pool per device, driver calls here.
#include "memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "context.hpp"
#include "driver.hpp"
#include "staging.hpp"

namespace pygpukit {

namespace {

// One pool per device, created on first use and never destroyed (device memory outlives no process).
// Slots are atomics so the hot path reads them without a lock.
constexpr int kMaxDevices = 64;
std::mutex g_pools_mutex;  // serialises creation only
std::atomic<PgkPool*> g_pools[kMaxDevices] = {};

PgkPool* pool_of(int device) {
  if (device < 0 || device >= kMaxDevices) throw RuntimeFailure("device ordinal out of range");
  PgkPool* pool = g_pools[device].load(std::memory_order_acquire);
  if (pool != nullptr) return pool;
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  pool = g_pools[device].load(std::memory_order_acquire);
  if (pool == nullptr) {
    pool = pgk_pool_new(0);
    g_pools[device].store(pool, std::memory_order_release);
  }
  return pool;
}

// Graph captures begun by graph.cpp, by stream (memory.hpp says what the allocator does while one is
// open), under g_captures_mutex.
struct OpenCapture {
  std::thread::id thread;
  int mode;  // CUstreamCaptureMode
  int device;
  std::uint64_t hold;  // the pool's hold for the blocks this thread frees meanwhile (memory.hpp)
};
std::mutex g_captures_mutex;
std::unordered_map<std::uint64_t, OpenCapture> g_captures;
std::atomic<int> g_open_captures{0};  // g_captures.size(), read without the lock on the hot paths

// Holds whose graph went away while some capture was open (ending one synchronizes the context, which
// a capture in global mode forbids): (device, hold), ended once none is open.
std::vector<std::pair<int, std::uint64_t>> g_deferred_holds;  // under g_deferred_mutex

// Blocks the pool released while a capture was open: (device, pointer), freed once none is open.
std::mutex g_deferred_mutex;
std::vector<std::pair<int, std::uint64_t>> g_deferred;
std::atomic<std::size_t> g_deferred_count{0};

enum class CaptureRule { kAllocate, kAllocateRelaxed, kRefuse };

// What the calling thread may do about a new device allocation (the driver's rules for a thread in
// the default, global interaction mode: refused when this thread captures in global or thread-local
// mode, or when another thread captures in global mode). The caller holds g_captures_mutex until
// its driver call is done, so that no capture begins in between.
CaptureRule capture_rule_locked() {
  if (g_captures.empty()) return CaptureRule::kAllocate;
  const std::thread::id self = std::this_thread::get_id();
  bool global_elsewhere = false;
  for (const auto& [stream, capture] : g_captures) {
    if (capture.thread == self && capture.mode != CU_STREAM_CAPTURE_MODE_RELAXED) return CaptureRule::kRefuse;
    if (capture.thread != self && capture.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) global_elsewhere = true;
  }
  return global_elsewhere ? CaptureRule::kAllocateRelaxed : CaptureRule::kAllocate;
}

// The hold of the capture this thread has open on `device` (0: none): its frees go there, and its
// allocations look there first.
std::uint64_t capturing_hold(int device) {
  if (g_open_captures.load(std::memory_order_acquire) == 0) return 0;
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  for (const auto& [stream, capture] : g_captures) {
    if (capture.thread == self && capture.device == device) return capture.hold;
  }
  return 0;
}

// Ends a hold: waits for the device's work (replays of the graph may still write its blocks), then
// gives its blocks to their streams' caches; an empty hold (a capture that freed nothing) just ends.
// The caller holds g_captures_mutex with no capture open.
void end_hold_locked(int device, std::uint64_t hold) {
  if (pgk_pool_hold_size(pool_of(device), hold) == 0) {
    pgk_pool_hold_end(pool_of(device), hold);
    return;
  }
  const int current = ensure_context();
  if (device != current) set_device(device);
  const CUresult rc = driver().cuCtxSynchronize();
  if (rc == CUDA_SUCCESS) pgk_pool_hold_end(pool_of(device), hold);
  if (device != current) set_device(current);
  // On failure the blocks stay held (the context is broken: nothing can reuse them safely).
  check(rc, "cuCtxSynchronize");
}

// Release callback: frees one block on the device (or defers it while a capture is open); errors
// cannot cross the Rust frame, so they are remembered and thrown after the pool call returns.
struct ReleaseContext {
  explicit ReleaseContext(int device) : device(device) {}
  int device;
  CUresult first_error = CUDA_SUCCESS;
};

void release_block(void* context, std::uint64_t ptr, std::uint64_t /*size*/) {
  auto* ctx = static_cast<ReleaseContext*>(context);
  std::lock_guard<std::mutex> captures(g_captures_mutex);  // held until freed: no capture begins meanwhile
  if (!g_captures.empty()) {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    g_deferred.emplace_back(ctx->device, ptr);
    g_deferred_count.fetch_add(1, std::memory_order_release);
    return;
  }
  CUresult rc = driver().cuMemFree(static_cast<CUdeviceptr>(ptr));
  if (rc != CUDA_SUCCESS && ctx->first_error == CUDA_SUCCESS) ctx->first_error = rc;
}

std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string bytes_text(std::uint64_t n) { return std::to_string(n) + " bytes"; }

[[noreturn]] void throw_oom(const PgkOutOfMemory& oom, const std::string& reason) {
  std::string limit = oom.limit == UINT64_MAX ? "none" : bytes_text(oom.limit);
  throw OutOfMemory("out of device memory (" + reason + "): requested " + bytes_text(oom.requested) + " (" +
                        bytes_text(oom.rounded) + " after rounding), in use " + bytes_text(oom.in_use) +
                        ", cached " + bytes_text(oom.cached) + ", limit " + limit,
                    oom.requested, oom.in_use, oom.cached, oom.limit);
}

// Which device owns a pointer (pools are per device).
int device_of(std::uint64_t ptr) {
  int ordinal = -1;
  CUresult rc = driver().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                               static_cast<CUdeviceptr>(ptr));
  if (rc != CUDA_SUCCESS) throw InvalidFree("pointer 0x" + std::to_string(ptr) + " is not device memory");
  return ordinal;
}

// A capture on this thread forbids new device memory (capture_rule_locked): what the caller is told instead
// of the driver's refusal, which would also invalidate the capture.
[[noreturn]] void throw_capture_refusal(PgkPool* pool, std::uint64_t nbytes, std::uint64_t stream) {
  PgkStats stats{};
  pgk_pool_stats(pool, &stats);
  const std::string message =
      "cannot allocate " + bytes_text(nbytes) + " on stream " + hex(stream) +
      " during a CUDA graph capture on this thread: the pool has no cached block of that size for the "
      "stream, and new device memory cannot be allocated while a stream captures (the driver would refuse "
      "it and invalidate the capture); allocate the arrays before capturing, or run the captured work once "
      "eagerly on the capture stream first so the pool caches its blocks (in use " +
      bytes_text(stats.in_use_bytes) + ", cached " + bytes_text(stats.cached_bytes) + ")";
  throw OutOfMemory(message, nbytes, stats.in_use_bytes, stats.cached_bytes, stats.limit);
}

// cuMemAlloc in relaxed capture mode: while another thread captures in global mode, this thread's
// own allocation is not part of that capture (cuThreadExchangeStreamCaptureMode, push and pop).
CUresult allocate_relaxed(const DriverApi& api, CUdeviceptr* ptr, std::size_t size) {
  if (api.cuThreadExchangeStreamCaptureMode == nullptr) return api.cuMemAlloc(ptr, size);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult rc = api.cuThreadExchangeStreamCaptureMode(&mode);
  if (rc != CUDA_SUCCESS) return rc;
  const CUresult result = api.cuMemAlloc(ptr, size);
  api.cuThreadExchangeStreamCaptureMode(&mode);  // the thread's previous mode back
  return result;
}

}  // namespace

std::uint64_t capture_opened(std::uint64_t stream, int mode, int device, const std::function<void()>& begin) {
  PgkPool* pool = pool_of(device);
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  begin();  // throws when the driver refuses: nothing is registered then
  const std::uint64_t hold = pgk_pool_hold_begin(pool);
  g_captures[stream] = OpenCapture{std::this_thread::get_id(), mode, device, hold};
  g_open_captures.store(static_cast<int>(g_captures.size()), std::memory_order_release);
  return hold;
}

void capture_closed(std::uint64_t stream) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  g_captures.erase(stream);
  g_open_captures.store(static_cast<int>(g_captures.size()), std::memory_order_release);
}

void release_hold(std::uint64_t hold, int device) {
  if (hold == 0) return;
  if (device < 0) device = ensure_context();
  if (device >= kMaxDevices || g_pools[device].load(std::memory_order_acquire) == nullptr) return;
  std::lock_guard<std::mutex> captures(g_captures_mutex);
  if (!g_captures.empty()) {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    g_deferred_holds.emplace_back(device, hold);
    g_deferred_count.fetch_add(1, std::memory_order_release);
    return;
  }
  end_hold_locked(device, hold);
}

void release_deferred_blocks() {
  if (g_deferred_count.load(std::memory_order_acquire) == 0) return;
  // Held while freeing, so that no capture begins meanwhile (a global-mode one would refuse cuMemFree).
  std::lock_guard<std::mutex> captures(g_captures_mutex);
  if (!g_captures.empty()) return;
  std::vector<std::pair<int, std::uint64_t>> blocks;
  std::vector<std::pair<int, std::uint64_t>> holds;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    blocks.swap(g_deferred);
    holds.swap(g_deferred_holds);
    g_deferred_count.store(0, std::memory_order_release);
  }
  for (const auto& [device, hold] : holds) end_hold_locked(device, hold);
  if (blocks.empty()) return;
  const int current = ensure_context();
  CUresult first_error = CUDA_SUCCESS;
  for (const auto& [device, ptr] : blocks) {
    if (device != current) set_device(device);
    const CUresult rc = driver().cuMemFree(static_cast<CUdeviceptr>(ptr));
    if (device != current) set_device(current);
    if (rc != CUDA_SUCCESS && first_error == CUDA_SUCCESS) first_error = rc;
  }
  if (first_error != CUDA_SUCCESS) check(first_error, "cuMemFree");
}

std::uint64_t device_allocate(std::uint64_t nbytes, std::uint64_t stream) {
  const int device = ensure_context();
  if (g_deferred_count.load(std::memory_order_relaxed) != 0) release_deferred_blocks();
  PgkPool* pool = pool_of(device);
  if (const std::uint64_t hold = capturing_hold(device)) {
    // A block this capture freed earlier (ordered by the capture stream inside the graph).
    std::uint64_t ptr = 0;
    pgk_pool_take_held(pool, nbytes, stream, hold, &ptr);
    if (ptr != 0) return ptr;
  }
  const DriverApi& api = driver();
  for (int attempt = 0; attempt < 2; ++attempt) {
    PgkDecision decision{};
    PgkOutOfMemory oom{};
    ReleaseContext released(device);
    int32_t rc = pgk_pool_request(pool, nbytes, stream, &release_block, &released, &decision, &oom);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
    if (rc == PGK_OUT_OF_MEMORY) throw_oom(oom, "pool limit");
    if (rc == PGK_OUT_OF_MEMORY_ALL_DEVICES) throw_oom(oom, "all-device limit");
    if (rc == PGK_TOO_LARGE)
      throw OutOfMemory("request of " + bytes_text(nbytes) + " is too large", nbytes, 0, 0, 0);
    if (rc != PGK_OK) throw RuntimeFailure("memory pool request failed with code " + std::to_string(rc));
    if (decision.kind == PGK_REUSE) return decision.ptr;

    CUdeviceptr ptr = 0;
    CUresult result = CUDA_SUCCESS;
    {
      std::unique_lock<std::mutex> captures(g_captures_mutex);  // no capture begins before the driver call
      const CaptureRule rule = capture_rule_locked();
      if (rule == CaptureRule::kRefuse) {
        captures.unlock();
        pgk_pool_abandon(pool, decision.size);
        throw_capture_refusal(pool, nbytes, stream);
      }
      const std::size_t size = static_cast<std::size_t>(decision.size);
      result = rule == CaptureRule::kAllocateRelaxed ? allocate_relaxed(api, &ptr, size)
                                                     : api.cuMemAlloc(&ptr, size);
    }
    if (result == CUDA_SUCCESS) {
      pgk_pool_register(pool, ptr, decision.size, stream);
      return ptr;
    }
    pgk_pool_abandon(pool, decision.size);
    if (result != CUDA_ERROR_OUT_OF_MEMORY) check(result, "cuMemAlloc");
    if (attempt == 0) {
      // The device is full: give back everything cached, then try once more (while a capture is open
      // the released blocks are only freed later, so the second try finds no more room).
      ReleaseContext again(device);
      pgk_pool_release_cached(pool, 0, &release_block, &again);
      if (again.first_error != CUDA_SUCCESS) check(again.first_error, "cuMemFree");
      continue;
    }
    PgkStats stats{};
    pgk_pool_stats(pool, &stats);
    PgkOutOfMemory info{nbytes, decision.size, stats.in_use_bytes, stats.cached_bytes, stats.limit};
    throw_oom(info, "the device has no more free memory");
  }
  throw RuntimeFailure("unreachable");
}

void device_free(std::uint64_t ptr, int device) {
  if (device < 0) device = device_of(ptr);
  // Freed during this thread's capture: the graph's replays may write it, so it goes to the capture's
  // hold, not the stream's cache (where an allocation after the capture would take it).
  const std::uint64_t hold = capturing_hold(device);
  int32_t rc =
      hold != 0 ? pgk_pool_free_held(pool_of(device), ptr, hold) : pgk_pool_free(pool_of(device), ptr);
  if (rc == PGK_UNKNOWN_POINTER) throw InvalidFree("pointer was not allocated by the pygpukit pool");
  if (rc == PGK_DOUBLE_FREE) throw InvalidFree("pointer was already freed (double free)");
  if (rc != PGK_OK) throw RuntimeFailure("memory pool free failed with code " + std::to_string(rc));
}

std::uint64_t empty_cache(bool all_devices) {
  const int current = ensure_context();
  release_deferred_blocks();
  std::uint64_t total = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    PgkPool* pool = g_pools[d].load(std::memory_order_acquire);
    if (pool == nullptr || (!all_devices && d != current)) continue;
    if (d != current) set_device(d);
    ReleaseContext released(d);
    total += pgk_pool_release_cached(pool, 0, &release_block, &released);
    if (d != current) set_device(current);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
  }
  return total;
}

void release_stream_cache(std::uint64_t stream) {
  const int device = ensure_context();
  ReleaseContext released(device);
  pgk_pool_release_stream(pool_of(device), stream, &release_block, &released);
  if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
}

void set_memory_limit(std::uint64_t bytes) {
  const int device = ensure_context();
  ReleaseContext released(device);
  pgk_pool_set_limit(pool_of(device), bytes, &release_block, &released);
  if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
}

void set_global_memory_limit(std::uint64_t bytes) {
  pgk_budget_set_limit(bytes);
  if (bytes == 0) return;
  // Release cached blocks, device by device, until the pools together are back under the limit.
  const int current = ensure_context();
  for (int d = 0; d < kMaxDevices; ++d) {
    std::uint64_t limit = 0, reserved = 0;
    pgk_budget_get(&limit, &reserved);
    if (reserved <= bytes) break;
    PgkPool* pool = g_pools[d].load(std::memory_order_acquire);
    if (pool == nullptr) continue;
    if (d != current) set_device(d);
    ReleaseContext released(d);
    pgk_pool_release_cached(pool, reserved - bytes, &release_block, &released);
    if (d != current) set_device(current);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
  }
}

void global_memory_usage(std::uint64_t* limit, std::uint64_t* reserved) { pgk_budget_get(limit, reserved); }

std::pair<std::uint64_t, std::uint64_t> forget_device_memory(int device) {
  if (device < 0 || device >= kMaxDevices) throw RuntimeFailure("device ordinal out of range");
  {  // captures and deferred releases of the device died with its context
    std::lock_guard<std::mutex> lock(g_captures_mutex);
    for (auto it = g_captures.begin(); it != g_captures.end();) {
      it = it->second.device == device ? g_captures.erase(it) : std::next(it);
    }
    g_open_captures.store(static_cast<int>(g_captures.size()), std::memory_order_release);
    std::lock_guard<std::mutex> deferred(g_deferred_mutex);
    const auto on_device = [device](const auto& entry) { return entry.first == device; };
    g_deferred.erase(std::remove_if(g_deferred.begin(), g_deferred.end(), on_device), g_deferred.end());
    g_deferred_holds.erase(std::remove_if(g_deferred_holds.begin(), g_deferred_holds.end(), on_device),
                           g_deferred_holds.end());
    g_deferred_count.store(g_deferred.size() + g_deferred_holds.size(), std::memory_order_release);
  }
  PgkPool* pool = g_pools[device].load(std::memory_order_acquire);
  std::uint64_t blocks = 0, bytes = 0;
  if (pool != nullptr && pgk_pool_reset(pool, &blocks, &bytes) != PGK_OK) {
    throw RuntimeFailure("memory pool reset failed");
  }
  return {blocks, bytes};
}

PgkStats memory_stats() {
  PgkStats stats{};
  pgk_pool_stats(pool_of(ensure_context()), &stats);
  return stats;
}

void device_memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  ensure_context();
  check(driver().cuMemGetInfo(free_bytes, total_bytes), "cuMemGetInfo");
}

std::uint64_t pinned_allocate(std::uint64_t nbytes) {
  ensure_context();
  void* ptr = nullptr;
  check(
      driver().cuMemHostAlloc(&ptr, static_cast<std::size_t>(nbytes ? nbytes : 1), CU_MEMHOSTALLOC_PORTABLE),
      "cuMemHostAlloc");
  return reinterpret_cast<std::uint64_t>(ptr);
}

void pinned_free(std::uint64_t ptr) {
  ensure_context();
  check(driver().cuMemFreeHost(reinterpret_cast<void*>(ptr)), "cuMemFreeHost");
}

void copy(CopyKind kind, std::uint64_t dst, std::uint64_t src, std::uint64_t nbytes, std::uint64_t stream,
          bool async) {
  if (nbytes == 0) return;
  ensure_context();
  const DriverApi& api = driver();
  auto s = reinterpret_cast<CUstream>(stream);
  auto n = static_cast<std::size_t>(nbytes);
  // Large copies from or to pageable host memory go through the staging buffers (staging.cpp): the
  // driver's own pageable path is several times slower. Such copies are synchronous either way.
  const StagingConfig& staging = staging_config();
  if (kind != CopyKind::DeviceToDevice && staging.min_bytes != 0 && n >= staging.min_bytes) {
    const std::uint64_t host = kind == CopyKind::HostToDevice ? src : dst;
    unsigned int type = 0;
    const bool pageable = api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                    static_cast<CUdeviceptr>(host)) != CUDA_SUCCESS;
    if (pageable) {
      const std::uint64_t order = async ? stream : 0;  // synchronous copies follow the legacy stream
      if (kind == CopyKind::HostToDevice) {
        copy_host_to_device(dst, reinterpret_cast<const void*>(src), n, order);
      } else {
        copy_device_to_host(reinterpret_cast<void*>(dst), src, n, order);
      }
      return;
    }
  }
  switch (kind) {
    case CopyKind::HostToDevice:
      if (async) {
        check(api.cuMemcpyHtoDAsync(dst, reinterpret_cast<const void*>(src), n, s), "cuMemcpyHtoDAsync");
      } else {
        check(api.cuMemcpyHtoD(dst, reinterpret_cast<const void*>(src), n), "cuMemcpyHtoD");
      }
      break;
    case CopyKind::DeviceToHost:
      if (async) {
        check(api.cuMemcpyDtoHAsync(reinterpret_cast<void*>(dst), src, n, s), "cuMemcpyDtoHAsync");
      } else {
        check(api.cuMemcpyDtoH(reinterpret_cast<void*>(dst), src, n), "cuMemcpyDtoH");
      }
      break;
    case CopyKind::DeviceToDevice:
      if (async) {
        check(api.cuMemcpyDtoDAsync(dst, src, n, s), "cuMemcpyDtoDAsync");
      } else {
        check(api.cuMemcpyDtoD(dst, src, n), "cuMemcpyDtoD");
      }
      break;
  }
}

void memset_bytes(std::uint64_t dst, unsigned char value, std::uint64_t nbytes, std::uint64_t stream) {
  if (nbytes == 0) return;
  ensure_context();
  check(driver().cuMemsetD8Async(dst, value, static_cast<std::size_t>(nbytes),
                                 reinterpret_cast<CUstream>(stream)),
        "cuMemsetD8Async");
}

}  // namespace pygpukit
