// Codes shared by the Python launchers and the kernels: each enum here is the single definition.
// pygpukit/core/codes.py parses this file (plain "enum Name : int { kValue = N, ... };" lines, one
// enum per line group), so the Python side never copies a number. Keep that form: no expressions,
// no macros inside the braces.
#pragma once

namespace pygpukit {
namespace codes {

// Fused epilogue / elementwise activations. "gelu" is the exact erf form everywhere; "gelu_tanh"
// the tanh approximation (what cuBLASLt's GELU epilogue computes).
enum Activation : int { kActNone = 0, kActRelu = 1, kActGeluTanh = 2, kActSilu = 3, kActGelu = 4 };

// Element types in the order of PYGPUKIT_FOR_EACH_ELEMENT_TYPE (common/element_types.cuh), which is
// the order of pygpukit.core.dtypes.all_dtypes(); a test checks all three agree.
enum DType : int {
  kF64 = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF8E4M3 = 4,
  kF8E5M2 = 5,
  kI8 = 6,
  kI16 = 7,
  kI32 = 8,
  kI64 = 9,
  kU8 = 10,
  kU16 = 11,
  kU32 = 12,
  kU64 = 13,
  kB8 = 14
};

// nn/norm.cu: the statistic and output of norm_rows (pygpukit.ops.norms).
enum NormMode : int { kNormRms = 0, kNormLayer = 1, kNormL2 = 2, kNormAddRms = 3, kNormGroup = 4 };

// nn/gated.cu: the gated activation of gated_rows (pygpukit.ops.gated). kGatedGeglu is the exact
// (erf) GELU, kGatedGegluTanh its tanh approximation.
enum GatedMode : int { kGatedSwiglu = 0, kGatedGeglu = 1, kGatedGegluTanh = 2, kGatedRelu2 = 3 };

// elementwise/: the op of a family kernel (functors.cuh), a run-time code (pygpukit.ops.elementwise).
enum ArithOp : int {
  kArithAdd = 0,
  kArithSub = 1,
  kArithMul = 2,
  kArithDiv = 3,
  kArithFloorDivide = 4,
  kArithMod = 5,
  kArithPow = 6,
  kArithMaximum = 7,
  kArithMinimum = 8
};
enum CompareOp : int {
  kCompareEq = 0,
  kCompareNe = 1,
  kCompareLt = 2,
  kCompareLe = 3,
  kCompareGt = 4,
  kCompareGe = 5
};
enum LogicalOp : int { kLogicalAnd = 0, kLogicalOr = 1, kLogicalXor = 2, kLogicalNot = 3 };
enum SignsOp : int { kSignsNeg = 0, kSignsAbs = 1, kSignsSign = 2, kSignsRelu = 3 };
// kMathGelu is the exact (erf) GELU, kMathGeluTanh its tanh approximation.
enum MathOp : int {
  kMathExp = 0,
  kMathExp2 = 1,
  kMathLog = 2,
  kMathLog2 = 3,
  kMathLog1p = 4,
  kMathSqrt = 5,
  kMathRsqrt = 6,
  kMathSin = 7,
  kMathCos = 8,
  kMathTanh = 9,
  kMathSigmoid = 10,
  kMathSilu = 11,
  kMathGelu = 12,
  kMathGeluTanh = 13
};
enum CopyOp : int { kCopyIdentity = 0 };
// elementwise/binary.cu binary_contig: which operand is the scalar argument.
enum BinaryMode : int { kBinaryArrays = 0, kBinaryScalarFirst = 1, kBinaryScalarSecond = 2 };

// reduction/reducers.cuh: the variant of a reducer template (its `mode`), per template: SumR sum or
// mean, ExtremeR max or min, ArgR argmax or argmin, TruthR any or all, VarianceR var or std,
// LogSumExpR its one form (pygpukit.ops.reduction).
enum ReduceMode : int {
  kReduceSum = 0,
  kReduceMean = 1,
  kReduceMax = 0,
  kReduceMin = 1,
  kReduceArgmax = 0,
  kReduceArgmin = 1,
  kReduceAny = 0,
  kReduceAll = 1,
  kReduceVar = 0,
  kReduceStd = 1,
  kReduceLogSumExp = 0
};
// reduction/reduce.cu: an out_code that is no DType: store the accumulator itself (the partial
// results of a split reduction, softmax statistics, cumsum's chunk totals).
enum ReduceOut : int { kReduceOutAccumulator = 255 };

// sampling/sampling.cu: the pass of sample_pass, and the flags of a pass (pygpukit.ops.sampling).
enum SamplePass : int {
  kSampleStats = 0,
  kSampleTopK1 = 1,
  kSampleTopK2 = 2,
  kSampleTopP0 = 3,
  kSampleTopP1 = 4,
  kSampleTopP2 = 5,
  kSampleDraw = 6,
  kSampleProbs = 7
};
enum SampleFlag : int { kSampleFinal = 1, kSampleAdvance = 2, kSamplePenalty = 4, kSampleToken = 8 };

}  // namespace codes
}  // namespace pygpukit
