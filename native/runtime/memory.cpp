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
};
std::mutex g_captures_mutex;
std::unordered_map<std::uint64_t, OpenCapture> g_captures;

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
    g_deferred_count.store(g_deferred.size(), std::memory_order_release);
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

void capture_opened(std::uint64_t stream, int mode, int device, const std::function<void()>& begin) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  begin();  // throws when the driver refuses: nothing is registered then
  g_captures[stream] = OpenCapture{std::this_thread::get_id(), mode, device};
}

void capture_closed(std::uint64_t stream) {
  std::lock_guard<std::mutex> lock(g_captures_mutex);
  g_captures.erase(stream);
}

void release_deferred_blocks() {
  if (g_deferred_count.load(std::memory_order_acquire) == 0) return;
  // Held while freeing, so that no capture begins meanwhile (a global-mode one would refuse cuMemFree).
  std::lock_guard<std::mutex> captures(g_captures_mutex);
  if (!g_captures.empty()) return;
  std::vector<std::pair<int, std::uint64_t>> blocks;
  {
    std::lock_guard<std::mutex> lock(g_deferred_mutex);
    blocks.swap(g_deferred);
    g_deferred_count.store(0, std::memory_order_release);
  }
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
  int32_t rc = pgk_pool_free(pool_of(device), ptr);
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
    std::lock_guard<std::mutex> deferred(g_deferred_mutex);
    g_deferred.erase(std::remove_if(g_deferred.begin(), g_deferred.end(),
                                    [device](const auto& entry) { return entry.first == device; }),
                     g_deferred.end());
    g_deferred_count.store(g_deferred.size(), std::memory_order_release);
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
