// Programmatic dependent launch (SM90 and newer). A kernel declared `programmatic=True` on the Python
// side is launched with programmatic stream serialization: the driver may start its blocks while the
// kernel before it in the stream is still running, so the launch latency and whatever the kernel does
// before overlap_wait() (an L2 prefetch of its weights) overlap the previous kernel's tail. Such a
// kernel must call overlap_wait() in every thread before it reads anything an earlier kernel may write
// and before it writes anything. Before SM90, or launched the ordinary way, both calls do nothing.
#pragma once

namespace pygpukit {

// Waits until the kernels this launch depends on have completed and their stores are visible, then
// lets the next programmatic kernel of the stream be scheduled (it waits in turn before it reads
// what this one writes).
__device__ __forceinline__ void overlap_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Asks the L2 cache to fetch `bytes` bytes at `p` (both multiples of 16) without waiting for them.
// Before overlap_wait() only for data that no kernel still running may write (weights).
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace pygpukit
