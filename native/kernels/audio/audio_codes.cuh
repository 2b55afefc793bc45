// Codes shared by pygpukit.audio and its kernels: each enum here is the single definition.
// pygpukit/audio/_kernels.py parses this file as pygpukit.core.codes parses common/codes.cuh (plain
// "enum Name : int { kValue = N, ... };" groups), so the Python side never copies a number. Keep that
// form: no expressions, no macros inside the braces.
#pragma once

namespace pygpukit {
namespace audio {
namespace codes {

// How the first stage of an FFT reads element e of its input row (fft.cu, load_value):
// kLoadComplex: complex element e (zero at e >= in_len).
// kLoadRealPairs: the complex value (x[2e], x[2e + 1]) of a real row (the even-length r2c trick).
// kLoadReal: the real x[e] as a complex value with zero imaginary part.
// kLoadC2rEven: the half-length spectrum Z'[e] of an even-length c2r from the n/2 + 1 inputs.
// kLoadHermitian: element e of the full Hermitian spectrum of an odd-length c2r.
// kLoadFramePairs: as kLoadRealPairs, from a windowed STFT frame read straight from the padded signal.
enum FftLoad : int {
  kLoadComplex = 0,
  kLoadRealPairs = 1,
  kLoadReal = 2,
  kLoadC2rEven = 3,
  kLoadHermitian = 4,
  kLoadFramePairs = 5
};

// How the last stage writes output k (fft.cu, store_value): the complex value; the r2c spectrum
// X[k], k <= n, from the half-length transform; the real part only; or |X[k]| ** power of the r2c
// spectrum as a real value (the STFT's power spectrogram, spectral.cu's spectrum_power fused).
enum FftStore : int { kStoreComplex = 0, kStoreR2cEven = 1, kStoreReal = 2, kStoreR2cPower = 3 };

// How a frame reads samples before the first or after the last (spectral.cu, frame_index), as
// numpy.pad's modes of the same names.
enum PadMode : int { kPadConstant = 0, kPadReflect = 1, kPadEdge = 2, kPadSymmetric = 3, kPadWrap = 4 };

}  // namespace codes
}  // namespace audio
}  // namespace pygpukit
