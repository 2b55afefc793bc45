// Streams and events over the driver API.
#include "streams.hpp"

#include <algorithm>

#include "context.hpp"
#include "driver.hpp"
#include "gemm.hpp"
#include "memory.hpp"

namespace pygpukit {

namespace {
CUstream as_stream(std::uint64_t s) { return reinterpret_cast<CUstream>(s); }
CUevent as_event(std::uint64_t e) { return reinterpret_cast<CUevent>(e); }

bool ready(CUresult rc, const char* call) {
  if (rc == CUDA_ERROR_NOT_READY) return false;
  check(rc, call);
  return true;
}
}  // namespace

std::pair<int, int> stream_priority_range() {
  ensure_context();
  int least = 0, greatest = 0;
  check(driver().cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
  return {least, greatest};
}

std::uint64_t stream_create(int priority, bool non_blocking) {
  auto [least, greatest] = stream_priority_range();
  priority = std::clamp(priority, greatest, least);
  CUstream stream = nullptr;
  check(driver().cuStreamCreateWithPriority(
            &stream, non_blocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT, priority),
        "cuStreamCreateWithPriority");
  return reinterpret_cast<std::uint64_t>(stream);
}

void stream_destroy(std::uint64_t stream) {
  ensure_context();
  check(driver().cuStreamSynchronize(as_stream(stream)), "cuStreamSynchronize");
  gemm_release_stream(stream);  // its cuBLASLt workspace goes back to the stream's cache first
  release_stream_cache(stream);
  check(driver().cuStreamDestroy(as_stream(stream)), "cuStreamDestroy");
}

void stream_synchronize(std::uint64_t stream) {
  ensure_context();
  check(driver().cuStreamSynchronize(as_stream(stream)), "cuStreamSynchronize");
}

bool stream_query(std::uint64_t stream) {
  ensure_context();
  return ready(driver().cuStreamQuery(as_stream(stream)), "cuStreamQuery");
}

int stream_priority(std::uint64_t stream) {
  ensure_context();
  int priority = 0;
  check(driver().cuStreamGetPriority(as_stream(stream), &priority), "cuStreamGetPriority");
  return priority;
}

void stream_wait_event(std::uint64_t stream, std::uint64_t event) {
  ensure_context();
  check(driver().cuStreamWaitEvent(as_stream(stream), as_event(event), 0), "cuStreamWaitEvent");
}

std::uint64_t event_create(bool timing, bool blocking_sync) {
  ensure_context();
  unsigned int flags = (timing ? 0u : static_cast<unsigned>(CU_EVENT_DISABLE_TIMING)) |
                       (blocking_sync ? static_cast<unsigned>(CU_EVENT_BLOCKING_SYNC) : 0u);
  CUevent event = nullptr;
  check(driver().cuEventCreate(&event, flags), "cuEventCreate");
  return reinterpret_cast<std::uint64_t>(event);
}

void event_destroy(std::uint64_t event) {
  ensure_context();
  check(driver().cuEventDestroy(as_event(event)), "cuEventDestroy");
}

void event_record(std::uint64_t event, std::uint64_t stream) {
  ensure_context();
  check(driver().cuEventRecord(as_event(event), as_stream(stream)), "cuEventRecord");
}

void event_synchronize(std::uint64_t event) {
  ensure_context();
  check(driver().cuEventSynchronize(as_event(event)), "cuEventSynchronize");
}

bool event_query(std::uint64_t event) {
  ensure_context();
  return ready(driver().cuEventQuery(as_event(event)), "cuEventQuery");
}

float event_elapsed_ms(std::uint64_t start, std::uint64_t end) {
  ensure_context();
  float ms = 0.0f;
  check(driver().cuEventElapsedTime(&ms, as_event(start), as_event(end)), "cuEventElapsedTime");
  return ms;
}

void device_synchronize() {
  ensure_context();
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace pygpukit
