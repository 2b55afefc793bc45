// Completion counting for kernels whose last block to finish does a final step (gemv's split K,
// split reductions).
#pragma once

namespace pygpukit {

// Called by one thread of a block, after a __syncthreads() that follows the block's stores: counts
// the block as done on *counter and returns the count before it. The atomic is acq_rel at GPU scope:
// its release publishes everything that happened before it, the whole block's stores included (they
// are ordered before it by the barrier), and its acquire makes the other blocks' published stores
// visible to the block that sees the last count, once that thread is followed by a __syncthreads().
// This replaces a per-thread __threadfence() (a sequentially consistent fence) on every block.
__device__ __forceinline__ unsigned arrive(unsigned* counter) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

}  // namespace pygpukit
