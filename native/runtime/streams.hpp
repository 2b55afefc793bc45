// Streams and events. Handles cross into Python as integers (the CUstream / CUevent pointer values);
// the Python Stream and Event classes own them and destroy them exactly once.
#pragma once

#include <cstdint>
#include <utility>

namespace pygpukit {

// Priority: lower numbers are higher priority; clamped to the device's range.
std::uint64_t stream_create(int priority, bool non_blocking);
// Releases the stream's cached pool blocks after synchronizing it, then destroys it.
void stream_destroy(std::uint64_t stream);
void stream_synchronize(std::uint64_t stream);
bool stream_query(std::uint64_t stream);  // true when all work is done
int stream_priority(std::uint64_t stream);
std::pair<int, int> stream_priority_range();  // (least, greatest); greatest is numerically lower
void stream_wait_event(std::uint64_t stream, std::uint64_t event);

std::uint64_t event_create(bool timing, bool blocking_sync);
void event_destroy(std::uint64_t event);
void event_record(std::uint64_t event, std::uint64_t stream);
void event_synchronize(std::uint64_t event);
bool event_query(std::uint64_t event);
float event_elapsed_ms(std::uint64_t start, std::uint64_t end);

void device_synchronize();

}  // namespace pygpukit
