// The C API table: each entry runs the C++ runtime call and turns exceptions into error codes.
#include "c_api.hpp"

#include <cuda.h>

#include <exception>
#include <string>

#include "context.hpp"
#include "errors.hpp"
#include "graph.hpp"
#include "memory.hpp"
#include "module.hpp"
#include "streams.hpp"

namespace pygpukit {

namespace {

thread_local std::string t_last_error;

template <typename Fn>
int32_t guarded(Fn&& fn) noexcept {
  try {
    fn();
    t_last_error.clear();
    return PYGPUKIT_OK;
  } catch (const OutOfMemory& e) {
    t_last_error = e.what();
    return PYGPUKIT_E_OUT_OF_MEMORY;
  } catch (const InvalidFree& e) {
    t_last_error = e.what();
    return PYGPUKIT_E_INVALID;
  } catch (const CudaFailure& e) {
    t_last_error = e.what();
    return PYGPUKIT_E_CUDA;
  } catch (const RuntimeFailure& e) {
    t_last_error = e.what();
    return PYGPUKIT_E_NOT_INITIALIZED;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return PYGPUKIT_E_INTERNAL;
  } catch (...) {
    t_last_error = "unknown error";
    return PYGPUKIT_E_INTERNAL;
  }
}

int32_t invalid(const char* message) noexcept {
  t_last_error = message;
  return PYGPUKIT_E_INVALID;
}

const char* last_error() { return t_last_error.c_str(); }

int32_t api_set_device(int32_t ordinal) {
  return guarded([&] { set_device(ordinal); });
}
int32_t api_get_device(int32_t* ordinal) {
  if (!ordinal) return invalid("get_device: null output pointer");
  return guarded([&] { *ordinal = current_device(); });
}
int32_t api_allocate(uint64_t nbytes, uint64_t stream, uint64_t* ptr) {
  if (!ptr) return invalid("allocate: null output pointer");
  return guarded([&] { *ptr = device_allocate(nbytes, stream); });
}
int32_t api_free(uint64_t ptr) {
  return guarded([&] { device_free(ptr, -1); });
}
int32_t api_memory_in_use(uint64_t* in_use, uint64_t* cached) {
  if (!in_use || !cached) return invalid("memory_in_use: null output pointer");
  return guarded([&] {
    PgkStats stats = memory_stats();
    *in_use = stats.in_use_bytes;
    *cached = stats.cached_bytes;
  });
}
int32_t api_memcpy_async(int32_t kind, uint64_t dst, uint64_t src, uint64_t nbytes, uint64_t stream) {
  if (kind < PYGPUKIT_COPY_H2D || kind > PYGPUKIT_COPY_D2D) return invalid("memcpy_async: unknown copy kind");
  return guarded([&] { copy(static_cast<CopyKind>(kind), dst, src, nbytes, stream, true); });
}
int32_t api_stream_create(int32_t priority, uint64_t* stream) {
  if (!stream) return invalid("stream_create: null output pointer");
  return guarded([&] { *stream = stream_create(priority, true); });
}
int32_t api_stream_destroy(uint64_t stream) {
  return guarded([&] { stream_destroy(stream); });
}
int32_t api_stream_synchronize(uint64_t stream) {
  return guarded([&] { stream_synchronize(stream); });
}
int32_t api_stream_query(uint64_t stream, int32_t* done) {
  if (!done) return invalid("stream_query: null output pointer");
  return guarded([&] { *done = stream_query(stream) ? 1 : 0; });
}
int32_t api_stream_wait_event(uint64_t stream, uint64_t event) {
  return guarded([&] { stream_wait_event(stream, event); });
}
int32_t api_event_create(int32_t timing, uint64_t* event) {
  if (!event) return invalid("event_create: null output pointer");
  return guarded([&] { *event = event_create(timing != 0, false); });
}
int32_t api_event_destroy(uint64_t event) {
  return guarded([&] { event_destroy(event); });
}
int32_t api_event_record(uint64_t event, uint64_t stream) {
  return guarded([&] { event_record(event, stream); });
}
int32_t api_event_synchronize(uint64_t event) {
  return guarded([&] { event_synchronize(event); });
}
int32_t api_event_query(uint64_t event, int32_t* done) {
  if (!done) return invalid("event_query: null output pointer");
  return guarded([&] { *done = event_query(event) ? 1 : 0; });
}
int32_t api_event_elapsed_ms(uint64_t start, uint64_t end, float* ms) {
  if (!ms) return invalid("event_elapsed_ms: null output pointer");
  return guarded([&] { *ms = event_elapsed_ms(start, end); });
}
int32_t api_launch(uint64_t function, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                   uint64_t stream, void** params) {
  if (!grid || !block) return invalid("launch: null grid or block");
  return guarded([&] { launch_raw(function, grid, block, shared_bytes, stream, params); });
}
int32_t api_graph_launch(uint64_t graph_exec, uint64_t stream) {
  return guarded([&] { graph_launch(graph_exec, stream); });
}

const PygpukitCApi kApi = {
    PYGPUKIT_C_API_VERSION,
    sizeof(PygpukitCApi),
    &last_error,
    &api_set_device,
    &api_get_device,
    &api_allocate,
    &api_free,
    &api_memory_in_use,
    &api_memcpy_async,
    &api_stream_create,
    &api_stream_destroy,
    &api_stream_synchronize,
    &api_stream_query,
    &api_stream_wait_event,
    &api_event_create,
    &api_event_destroy,
    &api_event_record,
    &api_event_synchronize,
    &api_event_query,
    &api_event_elapsed_ms,
    &api_launch,
    &api_graph_launch,
};

}  // namespace

const PygpukitCApi* c_api_table() { return &kApi; }

}  // namespace pygpukit
