/* pygpukit's native C API: a table of function pointers exported by the core native module as the
 * PyCapsule `pygpukit.core._native_cu<MAJOR>._C_API` (attribute `_C_API`). Other extensions (the
 * scheduler's Rust module, user C/C++ code) use it to act on the same device memory pool, streams,
 * events, kernels and graphs as Python does, without linking CUDA or pygpukit.
 *
 * Every call returns 0 on success and a nonzero PYGPUKIT_E_* code on failure; last_error() then
 * describes the failure of the calling thread's most recent call. Handles are the driver's pointer
 * values (CUstream, CUevent, CUfunction, CUgraphExec) as uint64_t. Consumers check `version` (the
 * table only grows: a newer minor version appends fields) and `size` before reading a field.
 */
#ifndef PYGPUKIT_C_API_H
#define PYGPUKIT_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PYGPUKIT_C_API_VERSION 1
#define PYGPUKIT_C_API_CAPSULE_ATTR "_C_API"

enum {
  PYGPUKIT_OK = 0,
  PYGPUKIT_E_CUDA = 1,          /* a driver call failed */
  PYGPUKIT_E_OUT_OF_MEMORY = 2, /* pool limit or device memory exhausted */
  PYGPUKIT_E_INVALID = 3,       /* bad argument or pointer */
  PYGPUKIT_E_NOT_INITIALIZED = 4,
  PYGPUKIT_E_INTERNAL = 5,
};

enum { PYGPUKIT_COPY_H2D = 0, PYGPUKIT_COPY_D2H = 1, PYGPUKIT_COPY_D2D = 2 };

typedef struct PygpukitCApi {
  uint32_t version;
  uint32_t size; /* sizeof(PygpukitCApi) of the producer */
  const char* (*last_error)(void);
  int32_t (*set_device)(int32_t ordinal);
  int32_t (*get_device)(int32_t* ordinal);
  /* memory: through the same pool as GPUArray */
  int32_t (*allocate)(uint64_t nbytes, uint64_t stream, uint64_t* ptr);
  int32_t (*free)(uint64_t ptr);
  int32_t (*memory_in_use)(uint64_t* in_use_bytes, uint64_t* cached_bytes);
  int32_t (*memcpy_async)(int32_t kind, uint64_t dst, uint64_t src, uint64_t nbytes, uint64_t stream);
  /* streams and events */
  int32_t (*stream_create)(int32_t priority, uint64_t* stream);
  int32_t (*stream_destroy)(uint64_t stream);
  int32_t (*stream_synchronize)(uint64_t stream);
  int32_t (*stream_query)(uint64_t stream, int32_t* done);
  int32_t (*stream_wait_event)(uint64_t stream, uint64_t event);
  int32_t (*event_create)(int32_t timing, uint64_t* event);
  int32_t (*event_destroy)(uint64_t event);
  int32_t (*event_record)(uint64_t event, uint64_t stream);
  int32_t (*event_synchronize)(uint64_t event);
  int32_t (*event_query)(uint64_t event, int32_t* done);
  int32_t (*event_elapsed_ms)(uint64_t start, uint64_t end, float* ms);
  /* kernels and graphs */
  int32_t (*launch)(uint64_t function, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                    uint64_t stream, void** params);
  int32_t (*graph_launch)(uint64_t graph_exec, uint64_t stream);
} PygpukitCApi;

#ifdef __cplusplus
}
#endif

#endif /* PYGPUKIT_C_API_H */
