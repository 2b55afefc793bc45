// Copies between pageable host memory (NumPy arrays) and the device, staged through page-locked
// buffers: while the DMA engine moves one chunk, several host threads copy the next chunk between the
// pageable memory and a pinned buffer. Pageable copies through the driver run at a fraction of the
// pinned bandwidth; this path gets most of it back for large arrays.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pygpukit {

struct StagingConfig {
  std::size_t min_bytes;    // below this, the driver's own pageable copy is used
  std::size_t chunk_bytes;  // size of each pinned staging buffer
  unsigned buffers;         // pinned buffers per device
  unsigned threads;         // host threads copying into / out of them (the caller included)
};

// Read once from PYGPUKIT_STAGING_MIN_BYTES (0 disables staging), PYGPUKIT_STAGING_CHUNK_BYTES and
// PYGPUKIT_COPY_THREADS; defaults are in staging.cpp.
const StagingConfig& staging_config();

// Copies `nbytes` from pageable host memory to the device, ordered after the work queued on `stream`;
// returns when the data is on the device. Thread-safe (one staged copy per device at a time).
void copy_host_to_device(std::uint64_t dst, const void* src, std::size_t nbytes, std::uint64_t stream);
// Copies `nbytes` from the device to pageable host memory, ordered after the work queued on `stream`;
// returns when the host memory holds the data.
void copy_device_to_host(void* dst, std::uint64_t src, std::size_t nbytes, std::uint64_t stream);

// Device reset (context.cpp reset_device, before the context is reset): forgets the device's pinned
// staging buffers and their events without touching the driver (they die with the context); the next
// staged copy allocates new ones. Returns whether the device had any.
bool staging_forget_device(int device);

}  // namespace pygpukit
