// GGUF (ggml) block formats to float32, float16 or bfloat16 (pygpukit/ops/gguf.py):
//
//   gguf_dequant<Type, Out>(data, out, blocks)
//       out[0 .. blocks * elements per block) = the decoded elements of `blocks` consecutive blocks of
//       ggml type `Type` (its type id: F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7,
//       Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30) stored at `data`.
//
// Each float32 value is bit for bit what the reference decoder of the `gguf` Python package computes:
// the same float32 operations in the same order (scale products such as d * sc are rounded before they
// multiply the quant), each one rounded on its own through the _rn intrinsics so that the compiler
// cannot contract a multiply and an add into an FMA. float16/bfloat16 outputs round that value once
// (nearest even). Only NaN payloads can differ from the host: the GPU's arithmetic and its narrowing
// conversions return the canonical NaN where x86 and NumPy keep an operand's payload (the plain
// formats decoded to float32 keep every bit).
//
// A block of 256 threads takes tiles of kTileElems output elements: it stages the tile's whole input
// blocks in shared memory (16-byte loads when `data` is 16-byte aligned), then every thread decodes
// groups of 4 consecutive elements and stores each group with one vector store (consecutive threads
// write consecutive groups, so the stores are coalesced). No block of any format straddles two tiles.
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {

constexpr int kDequantThreads = 256;
constexpr int kTileElems = 2048;  // output elements per tile: 8 per thread

__device__ __forceinline__ unsigned int byte_at(const unsigned char* p, int offset) {
  return static_cast<unsigned int>(p[offset]);
}

// Little-endian fields read byte by byte: the shared-memory tile keeps each block's layout, and some
// fields (the 32-bit qh of Q5_0) are not aligned to their size there.
__device__ __forceinline__ unsigned int u16_at(const unsigned char* p, int offset) {
  return byte_at(p, offset) | (byte_at(p, offset + 1) << 8);
}
__device__ __forceinline__ unsigned int u32_at(const unsigned char* p, int offset) {
  return u16_at(p, offset) | (u16_at(p, offset + 2) << 16);
}

// A float16 scale as float32: exact (subnormals included). NaN scales only give NaN results, whose
// payload is the hardware's anyway.
__device__ __forceinline__ float half_at(const unsigned char* p, int offset) {
  return float_from_half_bits(u16_at(p, offset));
}

// float16 bits to float32 as NumPy's astype does: exact, and a NaN keeps its sign and payload (shifted
// into the top of the float32 mantissa, signalling NaNs not quieted), which the hardware conversion
// does not promise.
__device__ __forceinline__ float half_bits_to_float(unsigned int h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0u) {
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x03ffu) << 13));
  }
  return float_from_half_bits(h);
}

// Q4_K and Q5_K pack eight 6-bit scales and eight 6-bit mins in 12 bytes: sub-blocks 0-3 keep theirs
// in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take their low 4 bits from
// bytes 8-11 and their top 2 bits from the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
__device__ __forceinline__ void k_scale_min(const unsigned char* s, int j, unsigned int& scale,
                                            unsigned int& min) {
  if (j < 4) {
    scale = byte_at(s, j) & 0x3fu;
    min = byte_at(s, j + 4) & 0x3fu;
  } else {
    scale = (byte_at(s, j + 4) & 0x0fu) | ((byte_at(s, j - 4) >> 2) & 0x30u);
    min = (byte_at(s, j + 4) >> 4) | ((byte_at(s, j) >> 2) & 0x30u);
  }
}

// Format<Type>: kElems elements in kBytes bytes per block. The quantized types decode(block, i, v):
// elements i .. i+3 of the block (i a multiple of 4) into v; the pass-through types (kElems == 1)
// element(tile, i): element i of the 16-byte aligned tile.
template <int Type>
struct Format;

template <>
struct Format<0> {  // F32
  static constexpr int kElems = 1;
  static constexpr int kBytes = 4;
  __device__ static float element(const unsigned char* tile, int i) {
    return __uint_as_float(reinterpret_cast<const unsigned int*>(tile)[i]);
  }
};

template <>
struct Format<1> {  // F16
  static constexpr int kElems = 1;
  static constexpr int kBytes = 2;
  __device__ static float element(const unsigned char* tile, int i) {
    return half_bits_to_float(reinterpret_cast<const unsigned short*>(tile)[i]);
  }
};

template <>
struct Format<30> {  // BF16: the top half of a float32
  static constexpr int kElems = 1;
  static constexpr int kBytes = 2;
  __device__ static float element(const unsigned char* tile, int i) {
    return float_from_bf16_bits(reinterpret_cast<const unsigned short*>(tile)[i]);
  }
};

// Q4_0: f16 d, then 16 bytes of 4-bit quants (elements 0-15 in the low nibbles, 16-31 in the high
// ones); x = d * (q - 8).
template <>
struct Format<2> {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 18;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 0);
    const int shift = (i >> 4) * 4;
    for (int k = 0; k < 4; ++k) {
      const int q = static_cast<int>((byte_at(b, 2 + (i & 15) + k) >> shift) & 0x0fu) - 8;
      v[k] = __fmul_rn(d, static_cast<float>(q));
    }
  }
};

// Q4_1: f16 d, f16 m, quants as Q4_0; x = d * q + m.
template <>
struct Format<3> {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 20;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 0);
    const float m = half_at(b, 2);
    const int shift = (i >> 4) * 4;
    for (int k = 0; k < 4; ++k) {
      const unsigned int q = (byte_at(b, 4 + (i & 15) + k) >> shift) & 0x0fu;
      v[k] = __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
    }
  }
};

// Q5_0: f16 d, 32 fifth bits (bit i of a little-endian u32 for element i), low nibbles as Q4_0;
// x = d * (q - 16).
template <>
struct Format<6> {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 22;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 0);
    const unsigned int high = u32_at(b, 2);
    const int shift = (i >> 4) * 4;
    for (int k = 0; k < 4; ++k) {
      const unsigned int low = (byte_at(b, 6 + (i & 15) + k) >> shift) & 0x0fu;
      const int q = static_cast<int>(low | (((high >> (i + k)) & 1u) << 4)) - 16;
      v[k] = __fmul_rn(d, static_cast<float>(q));
    }
  }
};

// Q5_1: f16 d, f16 m, then as Q5_0 without the offset; x = d * q + m.
template <>
struct Format<7> {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 24;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 0);
    const float m = half_at(b, 2);
    const unsigned int high = u32_at(b, 4);
    const int shift = (i >> 4) * 4;
    for (int k = 0; k < 4; ++k) {
      const unsigned int low = (byte_at(b, 8 + (i & 15) + k) >> shift) & 0x0fu;
      const unsigned int q = low | (((high >> (i + k)) & 1u) << 4);
      v[k] = __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
    }
  }
};

// Q8_0: f16 d, 32 int8 quants; x = q * d.
template <>
struct Format<8> {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 34;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 0);
    for (int k = 0; k < 4; ++k) {
      const int q = static_cast<int>(static_cast<signed char>(b[2 + i + k]));
      v[k] = __fmul_rn(static_cast<float>(q), d);
    }
  }
};

// Q2_K: 16 bytes of sub-block scales (low nibble: scale, high nibble: min; one per 16 elements),
// 64 bytes of 2-bit quants, f16 d, f16 dmin. Element i = 128 h + 32 s + l sits in bits 2s of quant
// byte 32 h + l. x = (d * scale) * q - dmin * min.
template <>
struct Format<10> {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 84;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 80);
    const float dmin = half_at(b, 82);
    const unsigned int packed = byte_at(b, i >> 4);
    const float scale = __fmul_rn(d, static_cast<float>(packed & 0x0fu));
    const float min = __fmul_rn(dmin, static_cast<float>(packed >> 4));
    const int base = 16 + (i >> 7) * 32 + (i & 31);
    const int shift = ((i >> 5) & 3) * 2;
    for (int k = 0; k < 4; ++k) {
      const unsigned int q = (byte_at(b, base + k) >> shift) & 3u;
      v[k] = __fsub_rn(__fmul_rn(scale, static_cast<float>(q)), min);
    }
  }
};

// Q3_K: 32 bytes of high-bit masks (element i = 32 s + l: bit s of byte l), 64 bytes of 2-bit low
// quants laid out as in Q2_K, 12 bytes of sixteen 6-bit scales (low 4 bits: nibble (j / 8) of byte
// j % 8; top 2 bits: bits 2 (j / 4) of byte 8 + j % 4), f16 d. A set high bit means no offset:
// q = low - 4 * (1 - high); x = (d * (scale - 32)) * q.
template <>
struct Format<11> {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 110;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 108);
    const int j = i >> 4;
    const unsigned int low_bits = (byte_at(b, 96 + (j & 7)) >> ((j >> 3) * 4)) & 0x0fu;
    const unsigned int high_bits = (byte_at(b, 104 + (j & 3)) >> ((j >> 2) * 2)) & 3u;
    const int raw = static_cast<int>(low_bits | (high_bits << 4)) - 32;
    const float scale = __fmul_rn(d, static_cast<float>(raw));
    const int l = i & 31;
    const int shift = ((i >> 5) & 3) * 2;
    const int plane = i >> 5;
    const int base = 32 + (i >> 7) * 32 + l;
    for (int k = 0; k < 4; ++k) {
      const int low = static_cast<int>((byte_at(b, base + k) >> shift) & 3u);
      const int high = static_cast<int>((byte_at(b, l + k) >> plane) & 1u);
      const int q = low - ((high ^ 1) << 2);
      v[k] = __fmul_rn(scale, static_cast<float>(q));
    }
  }
};

// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins (k_scale_min), 128 bytes of 4-bit quants:
// element i = 64 h + 32 s + l in nibble s of byte 32 h + l; sub-block j = i / 32.
// x = (d * scale_j) * q - dmin * min_j.
template <>
struct Format<12> {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 144;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    unsigned int sc, mn;
    k_scale_min(b + 4, i >> 5, sc, mn);
    const float scale = __fmul_rn(half_at(b, 0), static_cast<float>(sc));
    const float min = __fmul_rn(half_at(b, 2), static_cast<float>(mn));
    const int base = 16 + (i >> 6) * 32 + (i & 31);
    const int shift = ((i >> 5) & 1) * 4;
    for (int k = 0; k < 4; ++k) {
      const unsigned int q = (byte_at(b, base + k) >> shift) & 0x0fu;
      v[k] = __fsub_rn(__fmul_rn(scale, static_cast<float>(q)), min);
    }
  }
};

// Q5_K: as Q4_K plus 32 bytes of fifth bits before the nibbles (element i = 32 s + l: bit s of
// byte l).
template <>
struct Format<13> {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 176;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    unsigned int sc, mn;
    k_scale_min(b + 4, i >> 5, sc, mn);
    const float scale = __fmul_rn(half_at(b, 0), static_cast<float>(sc));
    const float min = __fmul_rn(half_at(b, 2), static_cast<float>(mn));
    const int l = i & 31;
    const int plane = i >> 5;
    const int base = 48 + (i >> 6) * 32 + l;
    const int shift = ((i >> 5) & 1) * 4;
    for (int k = 0; k < 4; ++k) {
      const unsigned int low = (byte_at(b, base + k) >> shift) & 0x0fu;
      const unsigned int q = low | (((byte_at(b, 16 + l + k) >> plane) & 1u) << 4);
      v[k] = __fsub_rn(__fmul_rn(scale, static_cast<float>(q)), min);
    }
  }
};

// Q6_K: 128 bytes of low nibbles (element i = 128 h + 64 s + l: nibble s of byte 64 h + l), 64 bytes
// of high 2-bit pairs (i = 128 h + 32 s + l: bits 2s of byte 128 + 32 h + l), sixteen int8 scales,
// f16 d. x = (d * scale_{i / 16}) * (q - 32).
template <>
struct Format<14> {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 210;
  __device__ static void decode(const unsigned char* b, int i, float* v) {
    const float d = half_at(b, 208);
    const int raw = static_cast<int>(static_cast<signed char>(b[192 + (i >> 4)]));
    const float scale = __fmul_rn(d, static_cast<float>(raw));
    const int h = i >> 7;
    const int r = i & 127;
    const int low_base = h * 64 + (r & 63);
    const int low_shift = (r >> 6) * 4;
    const int high_base = 128 + h * 32 + (r & 31);
    const int high_shift = (r >> 5) * 2;
    for (int k = 0; k < 4; ++k) {
      const unsigned int low = (byte_at(b, low_base + k) >> low_shift) & 0x0fu;
      const unsigned int high = (byte_at(b, high_base + k) >> high_shift) & 3u;
      const int q = static_cast<int>(low | (high << 4)) - 32;
      v[k] = __fmul_rn(scale, static_cast<float>(q));
    }
  }
};

// Store 4 decoded values at `out` (count of them valid, 4 except at the end of a pass-through tensor),
// rounded once to Out (common/convert.cuh), with one 16-byte (float) or 8-byte (fp16/bf16) store when
// `vector`.
template <typename Out>
__device__ __forceinline__ void store4(Out* out, const float* v, int count, bool vector) {
  if (vector && count >= 4) {
    Pack<Out, 4> pack;
#pragma unroll
    for (int k = 0; k < 4; ++k) pack.v[k] = from_float<Out>(v[k]);
    *reinterpret_cast<Pack<Out, 4>*>(out) = pack;
    return;
  }
  for (int k = 0; k < 4 && k < count; ++k) out[k] = from_float<Out>(v[k]);
}

template <int Type, typename Out>
__global__ void __launch_bounds__(kDequantThreads)
    gguf_dequant(const unsigned char* __restrict__ data, Out* __restrict__ out, index_t blocks) {
  using F = Format<Type>;
  static_assert(kTileElems % F::kElems == 0, "a tile holds whole blocks");
  constexpr int kTileBytes = kTileElems / F::kElems * F::kBytes;
  static_assert(kTileBytes % 16 == 0, "tiles start 16-byte aligned");
  __shared__ __align__(16) unsigned char tile[kTileBytes];

  const index_t total_bytes = blocks * F::kBytes;
  const index_t total_elems = blocks * F::kElems;
  const index_t tiles = (total_elems + kTileElems - 1) / kTileElems;
  const bool vector_in = aligned_to(data, 16);
  const bool vector_out = aligned_to(out, static_cast<int>(4 * sizeof(Out)));
  const int tid = static_cast<int>(threadIdx.x);
  for (index_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const index_t first_byte = t * kTileBytes;
    const index_t first_elem = t * kTileElems;
    const index_t left_bytes = total_bytes - first_byte;
    const index_t left_elems = total_elems - first_elem;
    const int nbytes = left_bytes < kTileBytes ? static_cast<int>(left_bytes) : kTileBytes;
    const int nelems = left_elems < kTileElems ? static_cast<int>(left_elems) : kTileElems;
    const unsigned char* src = data + first_byte;
    __syncthreads();  // the previous tile's decoding is done with the shared bytes
    int done = 0;
    if (vector_in) {
      const int chunks = nbytes >> 4;
      const uint4* from = reinterpret_cast<const uint4*>(src);
      uint4* to = reinterpret_cast<uint4*>(tile);
      for (int c = tid; c < chunks; c += kDequantThreads) to[c] = from[c];
      done = chunks << 4;
    }
    for (int c = done + tid; c < nbytes; c += kDequantThreads) tile[c] = src[c];
    __syncthreads();
    Out* dst = out + first_elem;
    for (int e = tid * 4; e < nelems; e += kDequantThreads * 4) {
      float v[4];
      if constexpr (F::kElems == 1) {
        for (int k = 0; k < 4 && e + k < nelems; ++k) v[k] = F::element(tile, e + k);
      } else {
        F::decode(tile + (e / F::kElems) * F::kBytes, e % F::kElems, v);
      }
      store4(dst + e, v, nelems - e, vector_out);
    }
  }
}

}  // namespace ops
}  // namespace pygpukit
