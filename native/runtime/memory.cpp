// The allocator: one Rust pool per device, driver calls here.
#include "memory.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
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

// Release callback: frees one block on the device; errors cannot cross the Rust frame, so they are
// remembered and thrown after the pool call returns.
struct ReleaseContext {
  CUresult first_error = CUDA_SUCCESS;
};

void release_block(void* context, std::uint64_t ptr, std::uint64_t /*size*/) {
  CUresult rc = driver().cuMemFree(static_cast<CUdeviceptr>(ptr));
  auto* ctx = static_cast<ReleaseContext*>(context);
  if (rc != CUDA_SUCCESS && ctx->first_error == CUDA_SUCCESS) ctx->first_error = rc;
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

}  // namespace

std::uint64_t device_allocate(std::uint64_t nbytes, std::uint64_t stream) {
  const int device = ensure_context();
  PgkPool* pool = pool_of(device);
  const DriverApi& api = driver();
  for (int attempt = 0; attempt < 2; ++attempt) {
    PgkDecision decision{};
    PgkOutOfMemory oom{};
    ReleaseContext released;
    int32_t rc = pgk_pool_request(pool, nbytes, stream, &release_block, &released, &decision, &oom);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
    if (rc == PGK_OUT_OF_MEMORY) throw_oom(oom, "pool limit");
    if (rc == PGK_OUT_OF_MEMORY_ALL_DEVICES) throw_oom(oom, "all-device limit");
    if (rc == PGK_TOO_LARGE)
      throw OutOfMemory("request of " + bytes_text(nbytes) + " is too large", nbytes, 0, 0, 0);
    if (rc != PGK_OK) throw RuntimeFailure("memory pool request failed with code " + std::to_string(rc));
    if (decision.kind == PGK_REUSE) return decision.ptr;

    CUdeviceptr ptr = 0;
    CUresult result = api.cuMemAlloc(&ptr, static_cast<std::size_t>(decision.size));
    if (result == CUDA_SUCCESS) {
      pgk_pool_register(pool, ptr, decision.size, stream);
      return ptr;
    }
    pgk_pool_abandon(pool, decision.size);
    if (result != CUDA_ERROR_OUT_OF_MEMORY) check(result, "cuMemAlloc");
    if (attempt == 0) {
      // The device is full: give back everything cached, then try once more.
      ReleaseContext again;
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
  std::uint64_t total = 0;
  for (int d = 0; d < kMaxDevices; ++d) {
    PgkPool* pool = g_pools[d].load(std::memory_order_acquire);
    if (pool == nullptr || (!all_devices && d != current)) continue;
    if (d != current) set_device(d);
    ReleaseContext released;
    total += pgk_pool_release_cached(pool, 0, &release_block, &released);
    if (d != current) set_device(current);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
  }
  return total;
}

void release_stream_cache(std::uint64_t stream) {
  const int device = ensure_context();
  ReleaseContext released;
  pgk_pool_release_stream(pool_of(device), stream, &release_block, &released);
  if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
}

void set_memory_limit(std::uint64_t bytes) {
  const int device = ensure_context();
  ReleaseContext released;
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
    ReleaseContext released;
    pgk_pool_release_cached(pool, reserved - bytes, &release_block, &released);
    if (d != current) set_device(current);
    if (released.first_error != CUDA_SUCCESS) check(released.first_error, "cuMemFree");
  }
}

void global_memory_usage(std::uint64_t* limit, std::uint64_t* reserved) { pgk_budget_get(limit, reserved); }

std::pair<std::uint64_t, std::uint64_t> forget_device_memory(int device) {
  if (device < 0 || device >= kMaxDevices) throw RuntimeFailure("device ordinal out of range");
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
