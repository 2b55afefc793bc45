// The elementwise operations as functors over a compute type C (float, double, an integer type or
// bool; see types.cuh), grouped into families. A kernel is instantiated per family and dtype, and
// the op is a run-time code switched once per pack of elements: one compilation serves every op of a
// family. The codes are the enums <Family>Op of common/codes.cuh, which pygpukit.ops.elementwise reads.
//
// Semantics follow NumPy where it defines them: integer arithmetic wraps; integer // and % by zero
// give 0; // rounds toward minus infinity and % takes the divisor's sign (floats too); maximum and
// minimum propagate NaN; integer powers with a negative exponent give 1 / base**-e truncated (1 for
// base 1, +-1 for base -1, else 0), where NumPy raises.
#pragma once

#include "../common/codes.cuh"
#include "../common/fast_math.cuh"
#include "../common/types.cuh"

namespace pygpukit {
namespace ops {

// -- float/double overloads of the math library -----------------------------------------------------
#define PYGPUKIT_MATH1(NAME, FLOAT_FN, DOUBLE_FN)                        \
  __device__ __forceinline__ float NAME(float x) { return FLOAT_FN(x); } \
  __device__ __forceinline__ double NAME(double x) { return DOUBLE_FN(x); }
PYGPUKIT_MATH1(m_exp, expf, exp)
PYGPUKIT_MATH1(m_exp2, exp2f, exp2)
PYGPUKIT_MATH1(m_log, logf, log)
PYGPUKIT_MATH1(m_log2, log2f, log2)
PYGPUKIT_MATH1(m_log1p, log1pf, log1p)
PYGPUKIT_MATH1(m_sqrt, sqrtf, sqrt)
PYGPUKIT_MATH1(m_rsqrt, rsqrtf, rsqrt)
PYGPUKIT_MATH1(m_sin, sinf, sin)
PYGPUKIT_MATH1(m_cos, cosf, cos)
PYGPUKIT_MATH1(m_tanh, tanhf, tanh)
PYGPUKIT_MATH1(m_erf, erff, erf)
PYGPUKIT_MATH1(m_floor, floorf, floor)
#undef PYGPUKIT_MATH1
__device__ __forceinline__ float m_fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double m_fmod(double a, double b) { return fmod(a, b); }
__device__ __forceinline__ float m_copysign(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double m_copysign(double a, double b) { return copysign(a, b); }
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

template <typename C>
__device__ __forceinline__ bool is_nan(C x) {
  if constexpr (is_floating<C>()) {
    return x != x;
  } else {
    return false;
  }
}

// Integer arithmetic that wraps (through an unsigned type at least as wide as int).
template <typename C>
__device__ __forceinline__ C wrap_add(C a, C b) {
  using W = typename Wide<C>::type;
  return static_cast<C>(static_cast<W>(a) + static_cast<W>(b));
}
template <typename C>
__device__ __forceinline__ C wrap_sub(C a, C b) {
  using W = typename Wide<C>::type;
  return static_cast<C>(static_cast<W>(a) - static_cast<W>(b));
}
template <typename C>
__device__ __forceinline__ C wrap_mul(C a, C b) {
  using W = typename Wide<C>::type;
  return static_cast<C>(static_cast<W>(a) * static_cast<W>(b));
}

// -- binary -----------------------------------------------------------------------------------------
template <typename C>
struct Add {
  using compute = C;
  __device__ C operator()(C a, C b) const {
    if constexpr (Traits<C>::kind == Kind::kBool) {
      return a || b;
    } else if constexpr (is_integer<C>()) {
      return wrap_add(a, b);
    } else {
      return a + b;
    }
  }
};

template <typename C>
struct Sub {
  using compute = C;
  __device__ C operator()(C a, C b) const {
    if constexpr (is_integer<C>()) {
      return wrap_sub(a, b);
    } else {
      return a - b;
    }
  }
};

template <typename C>
struct Mul {
  using compute = C;
  __device__ C operator()(C a, C b) const {
    if constexpr (Traits<C>::kind == Kind::kBool) {
      return a && b;
    } else if constexpr (is_integer<C>()) {
      return wrap_mul(a, b);
    } else {
      return a * b;
    }
  }
};

template <typename C>
struct Div {  // true division; C is float or double (integers are divided as float64)
  using compute = C;
  __device__ C operator()(C a, C b) const { return a / b; }
};

template <typename C>
__device__ __forceinline__ C float_floor_divide(C a, C b) {
  if (b == C(0)) return a / b;
  const C mod = m_fmod(a, b);
  C div = (a - mod) / b;
  if (mod != C(0) && ((b < C(0)) != (mod < C(0)))) div -= C(1);
  if (div == C(0)) return m_copysign(C(0), a / b);
  C floored = m_floor(div);
  if (div - floored > C(0.5)) floored += C(1);
  return floored;
}

// The longer functions are called rather than inlined into every lane of every kernel: one copy per
// compute type serves all storage types, which keeps NVRTC compile times reasonable.
template <typename C>
struct FloorDivide {
  using compute = C;
  __device__ __noinline__ C operator()(C a, C b) const {
    if constexpr (is_floating<C>()) {
      return float_floor_divide(a, b);
    } else if constexpr (Traits<C>::kind == Kind::kUnsigned) {
      return b == C(0) ? C(0) : static_cast<C>(a / b);
    } else {
      if (b == C(0)) return C(0);
      if (b == C(-1)) return wrap_sub(C(0), a);  // the most negative value / -1 wraps, as in NumPy
      C q = static_cast<C>(a / b);
      if (static_cast<C>(q * b) != a && ((a < C(0)) != (b < C(0)))) q = static_cast<C>(q - 1);
      return q;
    }
  }
};

template <typename C>
struct Mod {
  using compute = C;
  __device__ __noinline__ C operator()(C a, C b) const {
    if constexpr (is_floating<C>()) {
      C r = m_fmod(a, b);
      if (b == C(0)) return r;
      if (r != C(0)) {
        if ((b < C(0)) != (r < C(0))) r += b;
      } else {
        r = m_copysign(C(0), b);
      }
      return r;
    } else if constexpr (Traits<C>::kind == Kind::kUnsigned) {
      return b == C(0) ? C(0) : static_cast<C>(a % b);
    } else {
      if (b == C(0) || b == C(-1)) return C(0);
      C r = static_cast<C>(a % b);
      if (r != C(0) && ((r < C(0)) != (b < C(0)))) r = static_cast<C>(r + b);
      return r;
    }
  }
};

template <typename C>
struct Pow {
  using compute = C;
  __device__ __noinline__ C operator()(C a, C b) const {
    if constexpr (is_floating<C>()) {
      return m_pow(a, b);
    } else {
      if constexpr (Traits<C>::kind == Kind::kSigned) {
        if (b < C(0)) {
          if (a == C(1)) return C(1);
          if (a == C(-1)) return (b & C(1)) ? C(-1) : C(1);
          return C(0);
        }
      }
      C result = C(1);
      C base = a;
      auto e = static_cast<typename Traits<C>::unsigned_type>(b);
      while (e) {
        if (e & 1u) result = wrap_mul(result, base);
        base = wrap_mul(base, base);
        e >>= 1;
      }
      return result;
    }
  }
};

template <typename C>
struct Maximum {
  using compute = C;
  __device__ C operator()(C a, C b) const {
    if constexpr (Traits<C>::kind == Kind::kBool) {
      return a || b;
    } else {
      if (is_nan(a)) return a;
      if (is_nan(b)) return b;
      return a < b ? b : a;
    }
  }
};

template <typename C>
struct Minimum {
  using compute = C;
  __device__ C operator()(C a, C b) const {
    if constexpr (Traits<C>::kind == Kind::kBool) {
      return a && b;
    } else {
      if (is_nan(a)) return a;
      if (is_nan(b)) return b;
      return b < a ? b : a;
    }
  }
};

#define PYGPUKIT_COMPARE(NAME, OP)                                \
  template <typename C>                                           \
  struct NAME {                                                   \
    using compute = C;                                            \
    __device__ bool operator()(C a, C b) const { return a OP b; } \
  };
PYGPUKIT_COMPARE(Equal, ==)
PYGPUKIT_COMPARE(NotEqual, !=)
PYGPUKIT_COMPARE(Less, <)
PYGPUKIT_COMPARE(LessEqual, <=)
PYGPUKIT_COMPARE(Greater, >)
PYGPUKIT_COMPARE(GreaterEqual, >=)
#undef PYGPUKIT_COMPARE

// Logical ops compute on truth values: C is bool, operands convert with "!= 0".
template <typename C>
struct LogicalAnd {
  using compute = C;
  __device__ bool operator()(bool a, bool b) const { return a && b; }
};
template <typename C>
struct LogicalOr {
  using compute = C;
  __device__ bool operator()(bool a, bool b) const { return a || b; }
};
template <typename C>
struct LogicalXor {
  using compute = C;
  __device__ bool operator()(bool a, bool b) const { return a != b; }
};

// -- unary ------------------------------------------------------------------------------------------
template <typename C>
struct Identity {  // conversion copies: strided astype, concatenate with promotion
  using compute = C;
  __device__ C operator()(C x) const { return x; }
};

template <typename C>
struct Negative {
  using compute = C;
  __device__ C operator()(C x) const {
    if constexpr (is_integer<C>()) {
      return wrap_sub(C(0), x);
    } else {
      return -x;
    }
  }
};

template <typename C>
struct Absolute {
  using compute = C;
  __device__ C operator()(C x) const {
    if constexpr (Traits<C>::kind == Kind::kBool || Traits<C>::kind == Kind::kUnsigned) {
      return x;
    } else if constexpr (is_integer<C>()) {
      return x < C(0) ? wrap_sub(C(0), x) : x;
    } else {
      return x < C(0) ? -x : (x == C(0) ? C(0) : x);
    }
  }
};

template <typename C>
struct Sign {
  using compute = C;
  __device__ C operator()(C x) const {
    if (is_nan(x)) return x;
    if (x > C(0)) return C(1);
    if constexpr (Traits<C>::kind != Kind::kUnsigned) {
      if (x < C(0)) return C(-1);
    }
    return C(0);
  }
};

template <typename C>
struct Relu {  // max(x, 0) with NaN kept
  using compute = C;
  __device__ C operator()(C x) const { return x < C(0) ? C(0) : x; }
};

template <typename C>
struct LogicalNot {
  using compute = C;
  __device__ bool operator()(bool x) const { return !x; }
};

#define PYGPUKIT_FLOAT_UNARY(NAME, EXPR)                                \
  template <typename C>                                                 \
  struct NAME {                                                         \
    using compute = C;                                                  \
    __device__ __forceinline__ C operator()(C x) const { return EXPR; } \
  };
PYGPUKIT_FLOAT_UNARY(Exp, m_exp(x))
PYGPUKIT_FLOAT_UNARY(Exp2, m_exp2(x))
PYGPUKIT_FLOAT_UNARY(Log, m_log(x))
PYGPUKIT_FLOAT_UNARY(Log2, m_log2(x))
PYGPUKIT_FLOAT_UNARY(Log1p, m_log1p(x))
PYGPUKIT_FLOAT_UNARY(Sqrt, m_sqrt(x))
PYGPUKIT_FLOAT_UNARY(Rsqrt, m_rsqrt(x))
PYGPUKIT_FLOAT_UNARY(Sin, m_sin(x))
PYGPUKIT_FLOAT_UNARY(Cos, m_cos(x))
PYGPUKIT_FLOAT_UNARY(Tanh, m_tanh(x))
PYGPUKIT_FLOAT_UNARY(Sigmoid, C(1) / (C(1) + m_exp(-x)))
PYGPUKIT_FLOAT_UNARY(Silu, x / (C(1) + m_exp(-x)))
PYGPUKIT_FLOAT_UNARY(GeluErf, C(0.5) * x * (C(1) + m_erf(x * C(0.7071067811865476))))
PYGPUKIT_FLOAT_UNARY(GeluTanh,
                     C(0.5) * x * (C(1) + m_tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x))))
#undef PYGPUKIT_FLOAT_UNARY

// GELU (erf form) for results of 16 bits or fewer (fp16, bf16, fp8), where m_erf's accuracy is lost
// in the rounding but its cost (two polynomials and a select per element) makes large bf16 arrays
// compute-bound. With t = |x| / sqrt(2) and tau = 1 / (1 + t / 2), h = erfc(t) / 2 is
// tau * 2^(-t^2 log2(e) + Q(tau)), Q a degree-7 minimax polynomial (native/kernels/tools/
// fit_gelu_erfc.py fits it and checks it), and gelu(x) = x * (x < 0 ? h : 1 - h). The relative error
// of h is below 1e-6 and carries over to the result for either sign (no cancellation); over every
// finite fp16 and bf16 input this form rounds correctly more often than m_erf does. One rcp and one
// exp2 on the special function unit, about 15 instructions per element.
struct GeluErfNarrow {
  using compute = float;
  __device__ __forceinline__ float operator()(float x) const {
    const float tau = fast_rcp(fmaf(fabsf(x), 0.353553390593f, 1.0f));  // 1 / (1 + |x| / (2 sqrt 2))
    float q = -0.263318419f;
    q = fmaf(q, tau, 1.05167508f);
    q = fmaf(q, tau, -1.38636398f);
    q = fmaf(q, tau, 0.450060904f);
    q = fmaf(q, tau, -0.027627755f);
    q = fmaf(q, tau, 0.559243739f);
    q = fmaf(q, tau, 1.44212115f);
    q = fmaf(q, tau, -2.8257916f);
    const float h = tau * fast_exp2(fmaf(x, x * -0.721347520444f, q));  // -t^2 log2(e) = -x^2 log2(e) / 2
    return x * (x < 0.0f ? h : 1.0f - h);
  }
};

// -- families ---------------------------------------------------------------------------------------
// Each family F<C> has `compute` (C), `result` (the op's value type before the store converts it) and
// apply(op, x, y, r) over V lanes. Codes a compute type does not support compile to nothing.
template <typename F, typename A, typename R, int V>
__device__ __forceinline__ void lanes(F f, const A (&x)[V], const A (&y)[V], R (&r)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) r[j] = f(x[j], y[j]);
}
template <typename F, typename A, typename R, int V>
__device__ __forceinline__ void lanes(F f, const A (&x)[V], R (&r)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) r[j] = f(x[j]);
}

template <typename C>
struct Arith {  // codes::ArithOp
  using compute = C;
  using result = C;
  template <int V>
  __device__ static void apply(int op, const C (&x)[V], const C (&y)[V], C (&r)[V]) {
    constexpr bool boolean = Traits<C>::kind == Kind::kBool;
    switch (op) {
      case codes::kArithAdd:
        lanes(Add<C>(), x, y, r);
        break;
      case codes::kArithMul:
        lanes(Mul<C>(), x, y, r);
        break;
      case codes::kArithMaximum:
        lanes(Maximum<C>(), x, y, r);
        break;
      case codes::kArithMinimum:
        lanes(Minimum<C>(), x, y, r);
        break;
      default:
        if constexpr (!boolean) {
          switch (op) {
            case codes::kArithSub:
              lanes(Sub<C>(), x, y, r);
              break;
            case codes::kArithDiv:
              if constexpr (is_floating<C>()) lanes(Div<C>(), x, y, r);
              break;
            case codes::kArithFloorDivide:
              lanes(FloorDivide<C>(), x, y, r);
              break;
            case codes::kArithMod:
              lanes(Mod<C>(), x, y, r);
              break;
            default:  // codes::kArithPow
              lanes(Pow<C>(), x, y, r);
              break;
          }
        }
        break;
    }
  }
};

template <typename C>
struct Compare {  // codes::CompareOp
  using compute = C;
  using result = bool;
  template <int V>
  __device__ static void apply(int op, const C (&x)[V], const C (&y)[V], bool (&r)[V]) {
    switch (op) {
      case codes::kCompareEq:
        lanes(Equal<C>(), x, y, r);
        break;
      case codes::kCompareNe:
        lanes(NotEqual<C>(), x, y, r);
        break;
      case codes::kCompareLt:
        lanes(Less<C>(), x, y, r);
        break;
      case codes::kCompareLe:
        lanes(LessEqual<C>(), x, y, r);
        break;
      case codes::kCompareGt:
        lanes(Greater<C>(), x, y, r);
        break;
      default:  // codes::kCompareGe
        lanes(GreaterEqual<C>(), x, y, r);
        break;
    }
  }
};

template <typename C>
struct Logical {  // C is bool. codes::LogicalOp: binary and, or, xor; unary not
  using compute = C;
  using result = bool;
  template <int V>
  __device__ static void apply(int op, const C (&x)[V], const C (&y)[V], bool (&r)[V]) {
    switch (op) {
      case codes::kLogicalAnd:
        lanes(LogicalAnd<C>(), x, y, r);
        break;
      case codes::kLogicalOr:
        lanes(LogicalOr<C>(), x, y, r);
        break;
      default:  // codes::kLogicalXor
        lanes(LogicalXor<C>(), x, y, r);
        break;
    }
  }
  template <bool kNarrow = false, int V>
  __device__ static void apply(int, const C (&x)[V], bool (&r)[V]) {  // codes::kLogicalNot
    lanes(LogicalNot<C>(), x, r);
  }
};

template <typename C>
struct Signs {  // codes::SignsOp
  using compute = C;
  using result = C;
  template <bool kNarrow = false, int V>
  __device__ static void apply(int op, const C (&x)[V], C (&r)[V]) {
    if constexpr (Traits<C>::kind == Kind::kBool) {
      lanes(Identity<C>(), x, r);  // absolute value of bool; the others are refused by the host
    } else {
      switch (op) {
        case codes::kSignsNeg:
          lanes(Negative<C>(), x, r);
          break;
        case codes::kSignsAbs:
          lanes(Absolute<C>(), x, r);
          break;
        case codes::kSignsSign:
          lanes(Sign<C>(), x, r);
          break;
        default:  // codes::kSignsRelu
          lanes(Relu<C>(), x, r);
          break;
      }
    }
  }
};

template <typename C>
struct Math {  // C is float or double. codes::MathOp (kMathGelu: the exact erf GELU; kMathGeluTanh: the
               // tanh approximation)
  using compute = C;
  using result = C;
  template <bool kNarrow = false, int V>
  __device__ static void apply(int op, const C (&x)[V], C (&r)[V]) {
    switch (op) {
      case codes::kMathExp:
        lanes(Exp<C>(), x, r);
        break;
      case codes::kMathExp2:
        lanes(Exp2<C>(), x, r);
        break;
      case codes::kMathLog:
        lanes(Log<C>(), x, r);
        break;
      case codes::kMathLog2:
        lanes(Log2<C>(), x, r);
        break;
      case codes::kMathLog1p:
        lanes(Log1p<C>(), x, r);
        break;
      case codes::kMathSqrt:
        lanes(Sqrt<C>(), x, r);
        break;
      case codes::kMathRsqrt:
        lanes(Rsqrt<C>(), x, r);
        break;
      case codes::kMathSin:
        lanes(Sin<C>(), x, r);
        break;
      case codes::kMathCos:
        lanes(Cos<C>(), x, r);
        break;
      case codes::kMathTanh:
        lanes(Tanh<C>(), x, r);
        break;
      case codes::kMathSigmoid:
        lanes(Sigmoid<C>(), x, r);
        break;
      case codes::kMathSilu:
        lanes(Silu<C>(), x, r);
        break;
      case codes::kMathGelu:
        if constexpr (kNarrow && SameType<C, float>::value) {
          lanes(GeluErfNarrow(), x, r);
        } else {
          lanes(GeluErf<C>(), x, r);
        }
        break;
      default:  // codes::kMathGeluTanh
        lanes(GeluTanh<C>(), x, r);
        break;
    }
  }
};

template <typename C>
struct Copy {  // conversions: strided astype, concatenate with promotion (codes::kCopyIdentity)
  using compute = C;
  using result = C;
  template <bool kNarrow = false, int V>
  __device__ static void apply(int, const C (&x)[V], C (&r)[V]) {
    lanes(Identity<C>(), x, r);
  }
};

}  // namespace ops
}  // namespace pygpukit
