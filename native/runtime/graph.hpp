// CUDA graphs captured from a stream: capture, instantiate, replay, update.
#pragma once

#include <cstdint>

namespace pygpukit {

// mode: 0 global, 1 thread-local, 2 relaxed (CUstreamCaptureMode values). Returns the capture's hold
// (memory.hpp): release_hold it once the graph is destroyed, or at once when the capture fails.
std::uint64_t capture_begin(std::uint64_t stream, int mode);
// Ends the capture and returns the captured graph (CUgraph). Throws if the capture was invalidated.
std::uint64_t capture_end(std::uint64_t stream);
std::uint64_t graph_instantiate(std::uint64_t graph);
void graph_launch(std::uint64_t exec, std::uint64_t stream);
// Updates an instantiated graph in place from a graph of the same topology; false when it cannot.
bool graph_exec_update(std::uint64_t exec, std::uint64_t graph);
std::size_t graph_node_count(std::uint64_t graph);
void graph_destroy(std::uint64_t graph);
void graph_exec_destroy(std::uint64_t exec);

}  // namespace pygpukit
