// Complex numbers of the audio kernels: Cx<T> is an interleaved (re, im) pair of float or double, laid
// out exactly as the trailing dimension of 2 that pygpukit.audio uses for complex arrays (and as
// numpy's complex64 / complex128), aligned to its size so that a pair loads in one instruction.
#pragma once

#include "audio_codes.cuh"

namespace pygpukit {
namespace audio {

using index_t = long long;

template <typename T>
struct alignas(2 * sizeof(T)) Cx {
  T re;
  T im;
};

template <typename T>
__device__ __forceinline__ Cx<T> cx(T re, T im) {
  Cx<T> c;
  c.re = re;
  c.im = im;
  return c;
}

template <typename T>
__device__ __forceinline__ Cx<T> czero() {
  return cx<T>(T(0), T(0));
}

template <typename T>
__device__ __forceinline__ Cx<T> operator+(Cx<T> a, Cx<T> b) {
  return cx<T>(a.re + b.re, a.im + b.im);
}

template <typename T>
__device__ __forceinline__ Cx<T> operator-(Cx<T> a, Cx<T> b) {
  return cx<T>(a.re - b.re, a.im - b.im);
}

template <typename T>
__device__ __forceinline__ Cx<T> operator*(Cx<T> a, Cx<T> b) {
  return cx<T>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}

template <typename T>
__device__ __forceinline__ Cx<T> operator*(Cx<T> a, T s) {
  return cx<T>(a.re * s, a.im * s);
}

template <typename T>
__device__ __forceinline__ Cx<T> conj(Cx<T> a) {
  return cx<T>(a.re, -a.im);
}

// a * (-i)
template <typename T>
__device__ __forceinline__ Cx<T> mul_neg_i(Cx<T> a) {
  return cx<T>(a.im, -a.re);
}

// a * i
template <typename T>
__device__ __forceinline__ Cx<T> mul_i(Cx<T> a) {
  return cx<T>(-a.im, a.re);
}

template <typename T>
__device__ __forceinline__ T norm2(Cx<T> a) {
  return a.re * a.re + a.im * a.im;
}

}  // namespace audio
}  // namespace pygpukit
