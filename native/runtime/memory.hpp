// Device memory: every allocation is decided by the Rust pool (crates/pygpukit-pool) and performed
// here with the driver. On a driver out-of-memory the pool's cached blocks are released and the
// allocation is retried once before OutOfMemory is thrown with the pool's numbers.
// Also pinned host memory, copies and memset.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "errors.hpp"
#include "pool_ffi.h"

namespace pygpukit {

class OutOfMemory : public RuntimeFailure {
 public:
  OutOfMemory(const std::string& message, std::uint64_t requested, std::uint64_t in_use, std::uint64_t cached,
              std::uint64_t limit)
      : RuntimeFailure(message), requested(requested), in_use(in_use), cached(cached), limit(limit) {}
  std::uint64_t requested, in_use, cached, limit;
};

// Misuse of the allocator (freeing an unknown pointer, a double free): a bug in the caller.
class InvalidFree : public RuntimeFailure {
 public:
  using RuntimeFailure::RuntimeFailure;
};

// Device allocation of `nbytes` for work ordered on `stream` (0: the legacy default stream), on the
// calling thread's current device. Returns the device pointer; nbytes 0 gives a valid 512-byte block.
std::uint64_t device_allocate(std::uint64_t nbytes, std::uint64_t stream);
// Returns a block to the pool's cache for its stream; the device memory stays reserved for reuse.
// `device` is the owning device's ordinal when the caller knows it (-1: ask the driver).
void device_free(std::uint64_t ptr, int device = -1);
// Frees every cached block of the current device (or of all devices) on the device; returns bytes.
std::uint64_t empty_cache(bool all_devices);
// Releases a stream's cached blocks (call before destroying the stream).
void release_stream_cache(std::uint64_t stream);
// Limit of the current device's pool in bytes (0: unlimited).
void set_memory_limit(std::uint64_t bytes);
// The process-wide limit over the pools of all devices together (0: unlimited); cached blocks are
// released until the pools are under a lower limit (in-use blocks are never taken away).
void set_global_memory_limit(std::uint64_t bytes);
// The process-wide limit (UINT64_MAX: none) and the bytes all pools hold.
void global_memory_usage(std::uint64_t* limit, std::uint64_t* reserved);
PgkStats memory_stats();
// Device reset (context.cpp reset_device): the pool of `device` forgets every block (in use and
// cached), which died with the context, so no stale address is ever freed into the new context.
// Returns (blocks, bytes) forgotten.
std::pair<std::uint64_t, std::uint64_t> forget_device_memory(int device);
// Graph captures (graph.cpp registers each one it begins and ends). While a capture is open the
// allocator makes no driver call the driver would refuse, which would also invalidate the capture:
// - an allocation the pool cannot serve from its cache, on a thread that captures in global or
//   thread-local mode, throws OutOfMemory without calling cuMemAlloc;
// - on another thread, while some thread captures in global mode, cuMemAlloc runs in relaxed
//   capture mode (the allocation is that thread's own, not part of the capture);
// - cached blocks the pool releases are not freed but kept until no capture is open (cuMemFree is
//   refused on a capturing thread, and a captured graph may use a block its body freed).
// - a block freed by the capturing thread goes to the capture's hold in the pool (not the stream's
//   cache): the captured graph may write it at every replay, so only that capture's own allocations
//   take it again (inside the graph the capture stream orders them) until release_hold.
// capture_opened runs `begin` (cuStreamBeginCapture) under the registry's lock, so no deferred
// release runs between the driver's begin and the registration; it returns the capture's hold.
std::uint64_t capture_opened(std::uint64_t stream, int mode, int device, const std::function<void()>& begin);
void capture_closed(std::uint64_t stream);
// The graph of a capture went away (or the capture failed): its hold's blocks go to their streams'
// caches, after the device's work is done (cuCtxSynchronize; deferred while a capture is open).
// `device` -1: the current one. Hold 0 does nothing.
void release_hold(std::uint64_t hold, int device);
// Frees the blocks whose release was deferred by a capture, once none is open (also done by the next
// allocation and by empty_cache).
void release_deferred_blocks();

// (free, total) bytes of the current device as the driver sees them.
void device_memory_info(std::size_t* free_bytes, std::size_t* total_bytes);

// Page-locked host memory, portable across contexts.
std::uint64_t pinned_allocate(std::uint64_t nbytes);
void pinned_free(std::uint64_t ptr);

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Copies nbytes; synchronous when `async` is false, else ordered on `stream`.
void copy(CopyKind kind, std::uint64_t dst, std::uint64_t src, std::uint64_t nbytes, std::uint64_t stream,
          bool async);
void memset_bytes(std::uint64_t dst, unsigned char value, std::uint64_t nbytes, std::uint64_t stream);

}  // namespace pygpukit
