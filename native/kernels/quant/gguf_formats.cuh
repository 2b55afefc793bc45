// The GGUF (ggml) block formats as the quantized GEMV kernels decode them (gguf_gemv.cu, the decode
// GEMV; gguf_grouped_gemv.cu, the MoE experts' grouped GEMV): Format<Type> gives a block's size, the
// scale and offset of each group of elements and the quants of 8 consecutive elements, read with
// byte-permute tricks from a block's bytes (in shared memory: reads may run up to 4 bytes past the
// 8 bytes asked for).
#pragma once
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {
namespace qgemv {

__device__ __forceinline__ unsigned int u8(const unsigned char* p, int offset) {
  return static_cast<unsigned int>(p[offset]);
}

__device__ __forceinline__ float f16_at(const unsigned char* p, int offset) {
  return float_from_half_bits(u8(p, offset) | (u8(p, offset + 1) << 8));
}

// Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes at s.
__device__ __forceinline__ void k_scale_min(const unsigned char* s, int j, unsigned int& scale,
                                            unsigned int& min) {
  if (j < 4) {
    scale = u8(s, j) & 0x3fu;
    min = u8(s, j + 4) & 0x3fu;
  } else {
    scale = (u8(s, j + 4) & 0x0fu) | ((u8(s, j - 4) >> 2) & 0x30u);
    min = (u8(s, j + 4) >> 4) | ((u8(s, j) >> 2) & 0x30u);
  }
}

// The 8 bytes at p (any alignment) as two little-endian words: three aligned 32-bit shared-memory
// loads and two funnel shifts instead of eight byte loads. Reads up to 4 bytes past p + 7 (the
// staging buffers leave room).
struct Bytes8 {
  unsigned int lo, hi;  // bytes 0-3, bytes 4-7
};
__device__ __forceinline__ Bytes8 bytes8(const unsigned char* p) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p);
  const unsigned int* w = reinterpret_cast<const unsigned int*>(a & ~3ull);
  const unsigned int shift = static_cast<unsigned int>(a & 3ull) * 8u;
  const unsigned int w0 = w[0], w1 = w[1], w2 = w[2];
  return {__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift)};
}

// The 8 bytes at p: with A (p known to be 8-byte aligned) one 64-bit shared-memory load, else bytes8.
template <bool A>
__device__ __forceinline__ Bytes8 load8(const unsigned char* p) {
  if constexpr (A) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    return {v.x, v.y};
  } else {
    return bytes8(p);
  }
}

// Each byte of a word shifted right and masked (bits of the next byte shifted in are masked away).
__device__ __forceinline__ Bytes8 field8(Bytes8 v, int shift, unsigned int mask) {
  return {(v.lo >> shift) & mask, (v.hi >> shift) & mask};
}

// Bits 0-3 of h at bit 0 of bytes 0-3 (the four products land on distinct bits: no carries).
__device__ __forceinline__ unsigned int spread4(unsigned int h) {
  return ((h & 0x0fu) * 0x00204081u) & 0x01010101u;
}

// Byte j of v as float minus Bias: one byte permute builds the float 2^23 + byte, one subtraction.
template <int Bias>
__device__ __forceinline__ void floats8(Bytes8 v, float* q) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const unsigned int word = j < 4 ? v.lo : v.hi;
    q[j] = __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7440u | static_cast<unsigned int>(j & 3))) -
           (8388608.0f + static_cast<float>(Bias));
  }
}

__device__ __forceinline__ Bytes8 or8(Bytes8 a, Bytes8 b, int shift) {
  return {a.lo | (b.lo << shift), a.hi | (b.hi << shift)};
}

// Format<Type>: kElems elements in kBytes bytes per block; kGroup consecutive elements share one scale
// s and offset o, given by scale(b, i, s, o) for the group of element i of block b; quants(b, i, q)
// decodes elements i .. i + 7 (i a multiple of 8) to q, the value of element i + j being s * q[j] + o.
// kMin: o may be non-zero (sum(x) is accumulated as well).
template <int Type>
struct Format;

template <>
struct Format<2> {  // Q4_0: f16 d, 16 bytes of nibbles (0-15 low, 16-31 high); d * (q - 8)
  static constexpr int kElems = 32, kBytes = 18, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void scale(const unsigned char* b, int, float& s, float& o) {
    s = f16_at(b, 0);
    o = 0.0f;
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    floats8<8>(field8(bytes8(b + 2 + (i & 15)), (i >> 4) * 4, 0x0f0f0f0fu), q);
  }
};

template <>
struct Format<3> {  // Q4_1: f16 d, f16 m, nibbles as Q4_0; d * q + m
  static constexpr int kElems = 32, kBytes = 20, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void scale(const unsigned char* b, int, float& s, float& o) {
    s = f16_at(b, 0);
    o = f16_at(b, 2);
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    floats8<0>(field8(bytes8(b + 4 + (i & 15)), (i >> 4) * 4, 0x0f0f0f0fu), q);
  }
};

// The fifth bits of elements i .. i + 7 (byte i / 8 of the little-endian u32 at byte `at`, bit j for
// element i + j) at bit 4 of each element's byte.
__device__ __forceinline__ Bytes8 fifth_bits(const unsigned char* b, int at, int i) {
  const unsigned int high = u8(b, at + (i >> 3));
  return {spread4(high) << 4, spread4(high >> 4) << 4};
}

template <>
struct Format<6> {  // Q5_0: f16 d, u32 of fifth bits (bit i: element i), nibbles; d * (q - 16)
  static constexpr int kElems = 32, kBytes = 22, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void scale(const unsigned char* b, int, float& s, float& o) {
    s = f16_at(b, 0);
    o = 0.0f;
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    const Bytes8 low = field8(bytes8(b + 6 + (i & 15)), (i >> 4) * 4, 0x0f0f0f0fu);
    floats8<16>(or8(low, fifth_bits(b, 2, i), 0), q);
  }
};

template <>
struct Format<7> {  // Q5_1: f16 d, f16 m, u32 of fifth bits, nibbles; d * q + m
  static constexpr int kElems = 32, kBytes = 24, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void scale(const unsigned char* b, int, float& s, float& o) {
    s = f16_at(b, 0);
    o = f16_at(b, 2);
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    const Bytes8 low = field8(bytes8(b + 8 + (i & 15)), (i >> 4) * 4, 0x0f0f0f0fu);
    floats8<0>(or8(low, fifth_bits(b, 4, i), 0), q);
  }
};

template <>
struct Format<8> {  // Q8_0: f16 d, 32 int8 quants; d * q
  static constexpr int kElems = 32, kBytes = 34, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void scale(const unsigned char* b, int, float& s, float& o) {
    s = f16_at(b, 0);
    o = 0.0f;
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    const Bytes8 v = bytes8(b + 2 + i);
    floats8<128>({v.lo ^ 0x80808080u, v.hi ^ 0x80808080u}, q);  // int8 + 128, minus 128
  }
};

template <>
struct Format<10> {  // Q2_K: 16 scale|min nibble bytes, 64 bytes of 2-bit quants, f16 d, f16 dmin
  static constexpr int kElems = 256, kBytes = 84, kGroup = 16;
  static constexpr bool kMin = true;
  __device__ static void scale(const unsigned char* b, int i, float& s, float& o) {
    const unsigned int packed = u8(b, i >> 4);
    s = f16_at(b, 80) * static_cast<float>(packed & 0x0fu);
    o = -(f16_at(b, 82) * static_cast<float>(packed >> 4));
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    floats8<0>(field8(bytes8(b + 16 + (i >> 7) * 32 + (i & 31)), ((i >> 5) & 3) * 2, 0x03030303u), q);
  }
};

template <>
struct Format<11> {  // Q3_K: 32 bytes of high bits, 64 of 2-bit lows, 12 of 6-bit scales, f16 d
  static constexpr int kElems = 256, kBytes = 110, kGroup = 16;
  static constexpr bool kMin = false;
  __device__ static void scale(const unsigned char* b, int i, float& s, float& o) {
    const int g = i >> 4;
    const unsigned int low_bits = (u8(b, 96 + (g & 7)) >> ((g >> 3) * 4)) & 0x0fu;
    const unsigned int high_bits = (u8(b, 104 + (g & 3)) >> ((g >> 2) * 2)) & 3u;
    s = f16_at(b, 108) * static_cast<float>(static_cast<int>(low_bits | (high_bits << 4)) - 32);
    o = 0.0f;
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    // q = low - 4 * (1 - high), in -4 .. 3: low + 4 * high minus 4
    const int l = i & 31;
    const Bytes8 low = field8(bytes8(b + 32 + (i >> 7) * 32 + l), ((i >> 5) & 3) * 2, 0x03030303u);
    const Bytes8 high = field8(bytes8(b + l), i >> 5, 0x01010101u);
    floats8<4>(or8(low, high, 2), q);
  }
};

template <>
struct Format<12> {  // Q4_K: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles
  static constexpr int kElems = 256, kBytes = 144, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void scale(const unsigned char* b, int i, float& s, float& o) {
    unsigned int sc, mn;
    k_scale_min(b + 4, i >> 5, sc, mn);
    s = f16_at(b, 0) * static_cast<float>(sc);
    o = -(f16_at(b, 2) * static_cast<float>(mn));
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    floats8<0>(field8(load8<A>(b + 16 + (i >> 6) * 32 + (i & 31)), ((i >> 5) & 1) * 4, 0x0f0f0f0fu), q);
  }
};

template <>
struct Format<13> {  // Q5_K: Q4_K plus 32 bytes of fifth bits before the nibbles
  static constexpr int kElems = 256, kBytes = 176, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void scale(const unsigned char* b, int i, float& s, float& o) {
    Format<12>::scale(b, i, s, o);  // the same header
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    const int l = i & 31;
    const Bytes8 low = field8(load8<A>(b + 48 + (i >> 6) * 32 + l), ((i >> 5) & 1) * 4, 0x0f0f0f0fu);
    const Bytes8 high = field8(load8<A>(b + 16 + l), i >> 5, 0x01010101u);
    floats8<0>(or8(low, high, 4), q);
  }
};

template <>
struct Format<14> {  // Q6_K: 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, f16 d
  static constexpr int kElems = 256, kBytes = 210, kGroup = 16;
  static constexpr bool kMin = false;
  __device__ static void scale(const unsigned char* b, int i, float& s, float& o) {
    s = f16_at(b, 208) * static_cast<float>(static_cast<int>(static_cast<signed char>(b[192 + (i >> 4)])));
    o = 0.0f;
  }
  template <bool A = false>
  __device__ static void quants(const unsigned char* b, int i, float* q) {
    const int h = i >> 7, r = i & 127;
    const Bytes8 low = field8(bytes8(b + h * 64 + (r & 63)), (r >> 6) * 4, 0x0f0f0f0fu);
    const Bytes8 high = field8(bytes8(b + 128 + h * 32 + (r & 31)), (r >> 5) * 2, 0x03030303u);
    floats8<32>(or8(low, high, 4), q);
  }
};

// Q4_K and Q5_K blocks (144 and 176 bytes) keep the 16-byte alignment of the weight's start, and their
// quants are read 8 bytes at a time from 8-aligned offsets: with an aligned weight (the usual case) the
// staged copies are aligned too and quants<true> reads them with 64-bit loads.
template <int Type>
constexpr bool kCanAlign = Type == 12 || Type == 13;

}  // namespace qgemv
}  // namespace ops
}  // namespace pygpukit
