// Stream capture into CUDA graphs.
#include "graph.hpp"

#include <cuda.h>

#include "context.hpp"
#include "driver.hpp"
#include "memory.hpp"

namespace pygpukit {

namespace {
CUstream as_stream(std::uint64_t s) { return reinterpret_cast<CUstream>(s); }
}  // namespace

std::uint64_t capture_begin(std::uint64_t stream, int mode) {
  const int device = ensure_context();
  // Registered with the allocator (memory.cpp), which then makes no driver call the capture forbids
  // and keeps the blocks this thread frees in the capture's hold.
  return capture_opened(stream, mode, device, [&] {
    check(driver().cuStreamBeginCapture(as_stream(stream), static_cast<CUstreamCaptureMode>(mode)),
          "cuStreamBeginCapture");
  });
}

std::uint64_t capture_end(std::uint64_t stream) {
  ensure_context();
  CUgraph graph = nullptr;
  const CUresult rc = driver().cuStreamEndCapture(as_stream(stream), &graph);
  // The sequence is over, captured or invalidated, unless it was ended from the wrong thread.
  if (rc != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) capture_closed(stream);
  check(rc, "cuStreamEndCapture");
  return reinterpret_cast<std::uint64_t>(graph);
}

std::uint64_t graph_instantiate(std::uint64_t graph) {
  ensure_context();
  CUgraphExec exec = nullptr;
  check(driver().cuGraphInstantiateWithFlags(&exec, reinterpret_cast<CUgraph>(graph), 0),
        "cuGraphInstantiateWithFlags");
  return reinterpret_cast<std::uint64_t>(exec);
}

void graph_launch(std::uint64_t exec, std::uint64_t stream) {
  ensure_context();
  check(driver().cuGraphLaunch(reinterpret_cast<CUgraphExec>(exec), as_stream(stream)), "cuGraphLaunch");
}

bool graph_exec_update(std::uint64_t exec, std::uint64_t graph) {
  ensure_context();
  CUgraphExecUpdateResultInfo info{};
  CUresult rc = driver().cuGraphExecUpdate(reinterpret_cast<CUgraphExec>(exec),
                                           reinterpret_cast<CUgraph>(graph), &info);
  if (rc == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) return false;
  check(rc, "cuGraphExecUpdate");
  return true;
}

std::size_t graph_node_count(std::uint64_t graph) {
  ensure_context();
  std::size_t count = 0;
  check(driver().cuGraphGetNodes(reinterpret_cast<CUgraph>(graph), nullptr, &count), "cuGraphGetNodes");
  return count;
}

void graph_destroy(std::uint64_t graph) {
  ensure_context();
  check(driver().cuGraphDestroy(reinterpret_cast<CUgraph>(graph)), "cuGraphDestroy");
}

void graph_exec_destroy(std::uint64_t exec) {
  ensure_context();
  check(driver().cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(exec)), "cuGraphExecDestroy");
}

}  // namespace pygpukit
