// cuBLASLt matmul (see gemm.hpp). The entry points are declared here from the documented C API and
// bound with dlsym, so no cuBLAS header or library is needed to build.
#include "gemm.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../kernels/common/codes.cuh"
#include "context.hpp"
#include "cublaslt.hpp"
#include "errors.hpp"
#include "memory.hpp"
#include "shared_library.hpp"

namespace pygpukit {

namespace {

using Handle = void*;
using Desc = void*;
using Layout = void*;
using Preference = void*;
using Status = int;

struct Algo {
  std::uint64_t data[8];
};
struct HeuristicResult {
  Algo algo;
  std::size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};

// Attribute ids (cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t, preference).
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescAScale = 17,
              kDescBScale = 18, kDescDScale = 20, kDescBiasDataType = 26, kDescAScaleMode = 31,
              kDescBScaleMode = 32;
// The scale modes GemmArgs takes (cublasLtMatmulMatrixScale_t): SCALAR_32F, OUTER_VEC_32F, VEC128_32F,
// BLK128x128_32F.
constexpr int kScaleScalar = 0, kScaleOuterVec = 3, kScaleVec128 = 4, kScaleBlock128 = 5;
constexpr int kLayoutBatchCount = 5, kLayoutBatchStride = 6;
constexpr int kPrefMaxWorkspace = 1, kPrefReductionMask = 3, kPrefAlignA = 5, kPrefAlignB = 6,
              kPrefAlignC = 7, kPrefAlignD = 8;
// Split-K reductions allowed: only in the compute type (cublasLtReductionScheme_t COMPUTE_TYPE = 2).
// In place (1) and output-type (4) reductions add the partial sums in the output type, which for a
// bf16 or fp16 result loses about three bits at K = 1024 (measured on an H100: 6e-4 of sum|x||w|
// against float32 accumulation's 6e-5); torch allows that by default, pygpukit does not.
constexpr std::uint32_t kReductionComputeType = 2;

struct Api {
  Status (*create)(Handle*);
  Status (*desc_create)(Desc*, int, int);
  Status (*desc_destroy)(Desc);
  Status (*desc_set)(Desc, int, const void*, std::size_t);
  Status (*layout_create)(Layout*, int, std::uint64_t, std::uint64_t, std::int64_t);
  Status (*layout_destroy)(Layout);
  Status (*layout_set)(Layout, int, const void*, std::size_t);
  Status (*pref_create)(Preference*);
  Status (*pref_destroy)(Preference);
  Status (*pref_set)(Preference, int, const void*, std::size_t);
  Status (*heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Preference, int, HeuristicResult*, int*);
  Status (*matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*,
                   const void*, Layout, void*, Layout, const Algo*, void*, std::size_t, void*);
  const char* (*status_name)(Status);
};

constexpr Status kStatusInvalidValue = 7;   // CUBLAS_STATUS_INVALID_VALUE
constexpr Status kStatusNotSupported = 15;  // CUBLAS_STATUS_NOT_SUPPORTED

std::string status_text(const Api& api, Status s) {
  const char* name = api.status_name != nullptr ? api.status_name(s) : nullptr;
  return name != nullptr ? std::string(name) : "cublasStatus_t " + std::to_string(s);
}

void check_lt(const Api& api, Status s, const char* what) {
  if (s != 0) throw CublasLtFailure(status_text(api, s), what, "");
}

const Api& api() {
  static std::once_flag once;
  static Api table{};
  std::call_once(once, [] {
    const CublasLtStatus& status = cublaslt_status();
    if (!status.loaded)
      throw RuntimeFailure("cuBLASLt is not loaded (pygpukit.core.cublaslt.cublaslt_status())");
    auto bind = [&](auto& slot, const char* name) {
      void* symbol = find_symbol(status.handle, name);
      if (symbol == nullptr) throw RuntimeFailure(std::string("cuBLASLt has no ") + name);
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
    };
    bind(table.create, "cublasLtCreate");
    bind(table.desc_create, "cublasLtMatmulDescCreate");
    bind(table.desc_destroy, "cublasLtMatmulDescDestroy");
    bind(table.desc_set, "cublasLtMatmulDescSetAttribute");
    bind(table.layout_create, "cublasLtMatrixLayoutCreate");
    bind(table.layout_destroy, "cublasLtMatrixLayoutDestroy");
    bind(table.layout_set, "cublasLtMatrixLayoutSetAttribute");
    bind(table.pref_create, "cublasLtMatmulPreferenceCreate");
    bind(table.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    bind(table.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    bind(table.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    bind(table.matmul, "cublasLtMatmul");
    table.status_name =
        reinterpret_cast<const char* (*)(Status)>(find_symbol(status.handle, "cublasLtGetStatusName"));
  });
  return table;
}

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // what cuBLAS itself uses on Hopper

// cuBLASLt's values (cudaDataType_t, cublasComputeType_t, cublasLtEpilogue_t), used only here.
enum CudaType : int {
  kR32F = 0,
  kR64F = 1,
  kR16F = 2,
  kR8I = 3,
  kR32I = 10,
  kR16BF = 14,
  kR8FE4M3 = 28,
  kR8FE5M2 = 29
};
enum ComputeType : int { kCompute32F = 68, kCompute32FFastTF32 = 77, kCompute64F = 70, kCompute32I = 72 };
enum Epilogue : int {
  kEpilogueDefault = 1,
  kEpilogueRelu = 2,
  kEpilogueBias = 4,
  kEpilogueReluBias = 6,
  kEpilogueGelu = 32,
  kEpilogueGeluBias = 36
};

int cuda_type(int dtype, const char* what) {
  switch (dtype) {
    case codes::kF64:
      return kR64F;
    case codes::kF32:
      return kR32F;
    case codes::kF16:
      return kR16F;
    case codes::kBF16:
      return kR16BF;
    case codes::kF8E4M3:
      return kR8FE4M3;
    case codes::kF8E5M2:
      return kR8FE5M2;
    case codes::kI8:
      return kR8I;
    case codes::kI32:
      return kR32I;
    default:
      throw RuntimeFailure(std::string("gemm: ") + what + " has dtype code " + std::to_string(dtype) +
                           ", which cuBLASLt matmul does not take");
  }
}

// The cuBLASLt terms of one call shape.
struct LtTypes {
  int a, b, d, bias, compute, scale, epilogue;
};

LtTypes lt_types(const GemmArgs& g) {
  LtTypes t{};
  t.a = cuda_type(g.a_dtype, "A");
  t.b = cuda_type(g.b_dtype, "B");
  t.d = cuda_type(g.d_dtype, "D");
  t.bias = g.bias ? cuda_type(g.bias_dtype, "the bias") : -1;
  if (t.a == kR64F) {
    t.compute = kCompute64F;
    t.scale = kR64F;
  } else if (t.a == kR8I) {
    t.compute = kCompute32I;
    t.scale = kR32I;
  } else {
    t.compute = (t.a == kR32F && g.tf32) ? kCompute32FFastTF32 : kCompute32F;
    t.scale = kR32F;
  }
  switch (g.activation) {
    case codes::kActNone:
      t.epilogue = g.bias ? kEpilogueBias : kEpilogueDefault;
      break;
    case codes::kActRelu:
      t.epilogue = g.bias ? kEpilogueReluBias : kEpilogueRelu;
      break;
    case codes::kActGeluTanh:
      t.epilogue = g.bias ? kEpilogueGeluBias : kEpilogueGelu;
      break;
    default:
      throw RuntimeFailure("gemm: cuBLASLt has no epilogue for activation code " +
                           std::to_string(g.activation) + " (it has none, relu and gelu_tanh)");
  }
  return t;
}

bool known_scale_mode(int mode) {
  return mode == kScaleScalar || mode == kScaleOuterVec || mode == kScaleVec128 || mode == kScaleBlock128;
}

void check_shape(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) {
    throw RuntimeFailure("gemm: empty problem (m=" + std::to_string(g.m) + ", n=" + std::to_string(g.n) +
                         ", k=" + std::to_string(g.k) + ", batch=" + std::to_string(g.batch) + ")");
  }
  if (!known_scale_mode(g.scale_mode_a) || !known_scale_mode(g.scale_mode_b)) {
    throw RuntimeFailure("gemm: scale modes " + std::to_string(g.scale_mode_a) + "/" +
                         std::to_string(g.scale_mode_b) + " are not among 0, 3, 4 and 5");
  }
  if ((g.scale_mode_a != kScaleScalar || g.scale_mode_b != kScaleScalar || g.d_scale) && !g.scales) {
    throw RuntimeFailure("gemm: scale modes and a D scale need `scales`");
  }
}

int alignment(std::uint64_t ptr) {
  int a = 16;
  while (a > 1 && ptr % static_cast<std::uint64_t>(a) != 0) a /= 2;
  return a;
}

using Key = std::tuple<int, int, int, int, int, int, int, bool, bool, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, int, bool, int, int, int, bool, int, int, bool>;

}  // namespace

struct GemmPlan {
  Desc desc = nullptr;
  Layout a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // c: D's layout unless D is fp8
  Algo algo{};
  std::size_t workspace = 0;
  std::mutex mutex;  // the descriptor's pointer attributes are set per call
  ~GemmPlan() {
    const Api& lt = api();
    if (desc) lt.desc_destroy(desc);
    if (a) lt.layout_destroy(a);
    if (b) lt.layout_destroy(b);
    if (d) lt.layout_destroy(d);
    if (c) lt.layout_destroy(c);
  }
};

namespace {

std::mutex g_mutex;
std::map<int, Handle> g_handles;                                      // device -> handle
std::map<Key, std::shared_ptr<GemmPlan>> g_plans;                     // the cuBLASLt plan store
std::map<std::pair<int, std::uint64_t>, std::uint64_t> g_workspaces;  // (device, stream) -> pointer

Handle handle_for(int device) {
  auto it = g_handles.find(device);
  if (it != g_handles.end()) return it->second;
  Handle h = nullptr;
  check_lt(api(), api().create(&h), "cublasLtCreate");
  g_handles[device] = h;
  return h;
}

Layout make_layout(const Api& lt, int type, bool trans, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                   std::int64_t batch, std::int64_t stride) {
  // The stored matrix is rows x cols before op(): transposed operands are stored cols x rows.
  Layout layout = nullptr;
  const std::uint64_t r = static_cast<std::uint64_t>(trans ? cols : rows);
  const std::uint64_t c = static_cast<std::uint64_t>(trans ? rows : cols);
  check_lt(lt, lt.layout_create(&layout, type, r, c, ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    check_lt(lt, lt.layout_set(layout, kLayoutBatchCount, &count, sizeof(count)),
             "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check_lt(lt, lt.layout_set(layout, kLayoutBatchStride, &stride, sizeof(stride)),
             "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
  return layout;
}

// The plan for these args on `device` with these pointer alignments, from the store or made now;
// null when cuBLASLt has no algorithm for it.
std::shared_ptr<GemmPlan> plan_for(const GemmArgs& g, const LtTypes& t, int device, Handle handle,
                                   int align_a, int align_b, int align_d, std::uint64_t a_scale,
                                   std::uint64_t b_scale) {
  Key key{device,
          t.a,
          t.b,
          t.d,
          t.compute,
          t.scale,
          t.epilogue,
          g.trans_a,
          g.trans_b,
          g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.ldd,
          g.batch,
          g.stride_a,
          g.stride_b,
          g.stride_d,
          t.bias,
          g.scales,
          align_a,
          align_b,
          align_d,
          g.beta != 0.0,
          g.scale_mode_a,
          g.scale_mode_b,
          g.d_scale};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) return it->second;
  }
  const Api& lt = api();
  auto plan = std::make_shared<GemmPlan>();
  check_lt(lt, lt.desc_create(&plan->desc, t.compute, t.scale), "cublasLtMatmulDescCreate");
  const std::int32_t ta = g.trans_a ? 1 : 0, tb = g.trans_b ? 1 : 0;
  check_lt(lt, lt.desc_set(plan->desc, kDescTransA, &ta, sizeof(ta)),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_lt(lt, lt.desc_set(plan->desc, kDescTransB, &tb, sizeof(tb)),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
  const std::uint32_t epilogue = static_cast<std::uint32_t>(t.epilogue);
  check_lt(lt, lt.desc_set(plan->desc, kDescEpilogue, &epilogue, sizeof(epilogue)),
           "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (g.scales) {  // the heuristic sees scale pointers set, as a launch sets them and as torch asks
                   // (gemm.hpp)
    check_lt(lt, lt.desc_set(plan->desc, kDescAScale, &a_scale, sizeof(a_scale)),
             "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    check_lt(lt, lt.desc_set(plan->desc, kDescBScale, &b_scale, sizeof(b_scale)),
             "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }
  if (g.scales && (g.scale_mode_a != kScaleScalar || g.scale_mode_b != kScaleScalar)) {
    const std::int32_t mode_a = g.scale_mode_a, mode_b = g.scale_mode_b;
    Status s_a = lt.desc_set(plan->desc, kDescAScaleMode, &mode_a, sizeof(mode_a));
    Status s_b = lt.desc_set(plan->desc, kDescBScaleMode, &mode_b, sizeof(mode_b));
    // An older cuBLASLt without these attributes (before 12.8/12.9) has no such algorithm.
    if (s_a == kStatusInvalidValue || s_b == kStatusInvalidValue) return nullptr;
    check_lt(lt, s_a, "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
    check_lt(lt, s_b, "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
  }
  if (g.bias) {
    const std::int32_t bias_type = t.bias;
    check_lt(lt, lt.desc_set(plan->desc, kDescBiasDataType, &bias_type, sizeof(bias_type)),
             "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
  }
  plan->a = make_layout(lt, t.a, g.trans_a, g.m, g.k, g.lda, g.batch, g.stride_a);
  plan->b = make_layout(lt, t.b, g.trans_b, g.k, g.n, g.ldb, g.batch, g.stride_b);
  plan->d = make_layout(lt, t.d, false, g.m, g.n, g.ldd, g.batch, g.stride_d);
  // An fp8 D takes a 16-bit C (cuBLASLt has no fp8 C; fp16, as torch's scaled matmul gives it); with
  // beta 0 nothing reads it. Only D's layout is kept for other outputs.
  if (t.d == kR8FE4M3 || t.d == kR8FE5M2) {
    if (g.beta != 0.0) throw RuntimeFailure("gemm: an fp8 D cannot also be read as C (beta must be 0)");
    plan->c = make_layout(lt, kR16F, false, g.m, g.n, g.ldd, g.batch, g.stride_d);
  }
  Layout c_layout = plan->c ? plan->c : plan->d;

  Preference pref = nullptr;
  check_lt(lt, lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t max_workspace = kWorkspaceBytes;
  const std::uint32_t aligns[4] = {static_cast<std::uint32_t>(align_a), static_cast<std::uint32_t>(align_b),
                                   static_cast<std::uint32_t>(align_d), static_cast<std::uint32_t>(align_d)};
  lt.pref_set(pref, kPrefMaxWorkspace, &max_workspace, sizeof(max_workspace));
  lt.pref_set(pref, kPrefReductionMask, &kReductionComputeType, sizeof(kReductionComputeType));
  lt.pref_set(pref, kPrefAlignA, &aligns[0], sizeof(aligns[0]));
  lt.pref_set(pref, kPrefAlignB, &aligns[1], sizeof(aligns[1]));
  lt.pref_set(pref, kPrefAlignC, &aligns[2], sizeof(aligns[2]));
  lt.pref_set(pref, kPrefAlignD, &aligns[3], sizeof(aligns[3]));
  HeuristicResult result{};
  int found = 0;
  Status s = lt.heuristic(handle, plan->desc, plan->a, plan->b, c_layout, plan->d, pref, 1, &result, &found);
  lt.pref_destroy(pref);
  // No algorithm: the heuristic says so with NOT_SUPPORTED, or INVALID_VALUE for a combination of
  // layouts, types and alignment that no kernel of this cuBLASLt takes (int8 outside its "TN" form).
  if (s == kStatusNotSupported || s == kStatusInvalidValue || (s == 0 && found == 0)) return nullptr;
  check_lt(lt, s, "cublasLtMatmulAlgoGetHeuristic");
  plan->algo = result.algo;
  plan->workspace = result.workspace_size;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_plans.emplace(key, plan).first->second;
}

std::uint64_t workspace_for(int device, std::uint64_t stream) {
  auto key = std::make_pair(device, stream);
  auto it = g_workspaces.find(key);
  if (it != g_workspaces.end()) return it->second;
  const std::uint64_t ptr = device_allocate(kWorkspaceBytes, stream);
  g_workspaces[key] = ptr;
  return ptr;
}

std::string describe(const GemmArgs& g) {
  return std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + " (batch " +
         std::to_string(g.batch) + "), dtype codes " + std::to_string(g.a_dtype) + "/" +
         std::to_string(g.b_dtype) + "->" + std::to_string(g.d_dtype);
}

}  // namespace

bool gemm_prepare(GemmArgs& g, std::uint64_t a, std::uint64_t b, std::uint64_t d, std::uint64_t a_scale,
                  std::uint64_t b_scale) {
  check_shape(g);
  const LtTypes t = lt_types(g);
  const int device = ensure_context();
  Handle handle;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    handle = handle_for(device);
  }
  const int align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
  std::shared_ptr<GemmPlan> plan = plan_for(g, t, device, handle, align_a, align_b, align_d,
                                            a_scale != 0 ? a_scale : a, b_scale != 0 ? b_scale : b);
  if (!plan) return false;
  g.plan = std::move(plan);
  g.plan_device = device;
  g.plan_align_a = align_a;
  g.plan_align_b = align_b;
  g.plan_align_d = align_d;
  return true;
}

void gemm(const GemmArgs& g, std::uint64_t a, std::uint64_t b, std::uint64_t d, std::uint64_t bias,
          std::uint64_t a_scale, std::uint64_t b_scale, std::uint64_t stream, std::uint64_t d_scale) {
  const int device = ensure_context();
  const Api& lt = api();
  Handle handle;
  std::uint64_t workspace;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    handle = handle_for(device);
    workspace = workspace_for(device, stream);
  }
  std::shared_ptr<GemmPlan> plan = g.plan;
  const int align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
  if (!plan || device != g.plan_device || align_a < g.plan_align_a || align_b < g.plan_align_b ||
      align_d < g.plan_align_d) {
    check_shape(g);
    plan = plan_for(g, lt_types(g), device, handle, align_a, align_b, align_d, a_scale != 0 ? a_scale : a,
                    b_scale != 0 ? b_scale : b);
    if (!plan) {
      throw CublasLtFailure("CUBLAS_STATUS_NOT_SUPPORTED", "cublasLtMatmulAlgoGetHeuristic",
                            "no algorithm for " + describe(g) + " with pointers aligned to " +
                                std::to_string(align_a) + "/" + std::to_string(align_b) + "/" +
                                std::to_string(align_d) + " bytes");
    }
  }
  if (g.bias && bias == 0) throw RuntimeFailure("gemm: the plan adds a bias but no bias pointer was given");
  if (g.scales && (a_scale == 0 || b_scale == 0)) {
    throw RuntimeFailure("gemm: the plan scales A and B but a scale pointer is missing");
  }
  if (g.d_scale && d_scale == 0)
    throw RuntimeFailure("gemm: the plan scales D but no D scale pointer was given");
  // alpha and beta in the scale type
  const bool f64 = g.a_dtype == codes::kF64;
  const bool i32 = g.a_dtype == codes::kI8;
  float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  double alpha_d = g.alpha, beta_d = g.beta;
  std::int32_t alpha_i = static_cast<std::int32_t>(g.alpha), beta_i = static_cast<std::int32_t>(g.beta);
  const void* alpha = f64   ? static_cast<const void*>(&alpha_d)
                      : i32 ? static_cast<const void*>(&alpha_i)
                            : &alpha_f;
  const void* beta = f64   ? static_cast<const void*>(&beta_d)
                     : i32 ? static_cast<const void*>(&beta_i)
                           : &beta_f;
  std::lock_guard<std::mutex> lock(plan->mutex);
  if (g.bias) {
    check_lt(lt, lt.desc_set(plan->desc, kDescBiasPointer, &bias, sizeof(bias)),
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if (g.scales) {
    check_lt(lt, lt.desc_set(plan->desc, kDescAScale, &a_scale, sizeof(a_scale)),
             "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    check_lt(lt, lt.desc_set(plan->desc, kDescBScale, &b_scale, sizeof(b_scale)),
             "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }
  if (g.d_scale) {
    check_lt(lt, lt.desc_set(plan->desc, kDescDScale, &d_scale, sizeof(d_scale)),
             "cublasLtMatmulDescSetAttribute(D_SCALE_POINTER)");
  }
  void* dp = reinterpret_cast<void*>(d);
  check_lt(lt,
           lt.matmul(handle, plan->desc, alpha, reinterpret_cast<const void*>(a), plan->a,
                     reinterpret_cast<const void*>(b), plan->b, beta, dp, plan->c ? plan->c : plan->d, dp,
                     plan->d, &plan->algo, reinterpret_cast<void*>(workspace), kWorkspaceBytes,
                     reinterpret_cast<void*>(stream)),
           "cublasLtMatmul");
}

std::size_t gemm_plan_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_plans.size();
}

void gemm_release_stream(std::uint64_t stream) {
  std::vector<std::pair<int, std::uint64_t>> freed;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto it = g_workspaces.begin(); it != g_workspaces.end();) {
      if (it->first.second == stream) {
        freed.emplace_back(it->first.first, it->second);
        it = g_workspaces.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [device, ptr] : freed) device_free(ptr, device);
}

std::size_t gemm_forget_device(int device) {
  std::vector<std::shared_ptr<GemmPlan>> dropped;  // destroyed (host descriptors only) after the lock
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    // The handle is forgotten, not destroyed: cublasLtDestroy synchronizes the device, which a
    // faulted context cannot do. It is a small host object; a new one is created on next use.
    g_handles.erase(device);
    for (auto it = g_plans.begin(); it != g_plans.end();) {
      if (std::get<0>(it->first) == device) {
        dropped.push_back(std::move(it->second));
        it = g_plans.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = g_workspaces.begin(); it != g_workspaces.end();) {
      if (it->first.first == device) {
        it = g_workspaces.erase(it);
      } else {
        ++it;
      }
    }
  }
  return dropped.size();
}

}  // namespace pygpukit
