// cuBLASLt matmul (see gemm.hpp). The entry points are declared here from the documented C API and
// bound with dlsym, so no cuBLAS header or library is needed to build.
#include "gemm.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

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
              kDescBScale = 18, kDescBiasDataType = 26;
constexpr int kLayoutBatchCount = 5, kLayoutBatchStride = 6;
constexpr int kPrefMaxWorkspace = 1, kPrefAlignA = 5, kPrefAlignB = 6, kPrefAlignC = 7, kPrefAlignD = 8;

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

std::string status_text(const Api& api, Status s) {
  const char* name = api.status_name != nullptr ? api.status_name(s) : nullptr;
  return name != nullptr ? std::string(name) : "status " + std::to_string(s);
}

void check_lt(const Api& api, Status s, const char* what) {
  if (s != 0) throw RuntimeFailure(std::string("cuBLASLt ") + what + " failed: " + status_text(api, s));
}

const Api& api() {
  static std::once_flag once;
  static Api table{};
  std::call_once(once, [] {
    const CublasLtStatus& status = cublaslt_status();
    if (!status.loaded) throw RuntimeFailure("cuBLASLt is not loaded");
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

int alignment(std::uint64_t ptr) {
  int a = 16;
  while (a > 1 && ptr % static_cast<std::uint64_t>(a) != 0) a /= 2;
  return a;
}

using Key = std::tuple<int, int, int, int, int, int, bool, bool, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, int, int, bool, int, int, int>;

struct Plan {
  Desc desc = nullptr;
  Layout a = nullptr, b = nullptr, d = nullptr;
  Algo algo{};
  std::size_t workspace = 0;
  std::mutex mutex;  // the descriptor's pointer attributes are set per call
  ~Plan() {
    const Api& lt = api();
    if (desc) lt.desc_destroy(desc);
    if (a) lt.layout_destroy(a);
    if (b) lt.layout_destroy(b);
    if (d) lt.layout_destroy(d);
  }
};

std::mutex g_mutex;
std::map<int, Handle> g_handles;                                      // device -> handle
std::map<Key, std::shared_ptr<Plan>> g_plans;                         // plan cache
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
    check_lt(lt, lt.layout_set(layout, kLayoutBatchCount, &count, sizeof(count)), "layout batch count");
    check_lt(lt, lt.layout_set(layout, kLayoutBatchStride, &stride, sizeof(stride)), "layout batch stride");
  }
  return layout;
}

std::shared_ptr<Plan> plan_for(const GemmArgs& g, int device, Handle handle) {
  const bool has_bias = g.bias != 0;
  const bool fp8 = g.a_scale != 0 || g.b_scale != 0;
  Key key{device,
          g.a_type,
          g.b_type,
          g.d_type,
          g.compute,
          g.scale_type,
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
          g.epilogue,
          g.bias_type,
          fp8 || has_bias,
          alignment(g.a) * 100 + alignment(g.b),
          alignment(g.d),
          g.beta != 0.0 ? 1 : 0};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) return it->second;
  }
  const Api& lt = api();
  auto plan = std::make_shared<Plan>();
  check_lt(lt, lt.desc_create(&plan->desc, g.compute, g.scale_type), "cublasLtMatmulDescCreate");
  const std::int32_t ta = g.trans_a ? 1 : 0, tb = g.trans_b ? 1 : 0;
  check_lt(lt, lt.desc_set(plan->desc, kDescTransA, &ta, sizeof(ta)), "desc transa");
  check_lt(lt, lt.desc_set(plan->desc, kDescTransB, &tb, sizeof(tb)), "desc transb");
  const std::uint32_t epilogue = static_cast<std::uint32_t>(g.epilogue);
  check_lt(lt, lt.desc_set(plan->desc, kDescEpilogue, &epilogue, sizeof(epilogue)), "desc epilogue");
  if (has_bias) {
    const std::int32_t bias_type = g.bias_type;
    check_lt(lt, lt.desc_set(plan->desc, kDescBiasDataType, &bias_type, sizeof(bias_type)), "desc bias type");
    check_lt(lt, lt.desc_set(plan->desc, kDescBiasPointer, &g.bias, sizeof(g.bias)), "desc bias");
  }
  if (fp8) {
    check_lt(lt, lt.desc_set(plan->desc, kDescAScale, &g.a_scale, sizeof(g.a_scale)), "desc A scale");
    check_lt(lt, lt.desc_set(plan->desc, kDescBScale, &g.b_scale, sizeof(g.b_scale)), "desc B scale");
  }
  plan->a = make_layout(lt, g.a_type, g.trans_a, g.m, g.k, g.lda, g.batch, g.stride_a);
  plan->b = make_layout(lt, g.b_type, g.trans_b, g.k, g.n, g.ldb, g.batch, g.stride_b);
  plan->d = make_layout(lt, g.d_type, false, g.m, g.n, g.ldd, g.batch, g.stride_d);

  Preference pref = nullptr;
  check_lt(lt, lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t max_workspace = kWorkspaceBytes;
  const std::uint32_t align_a = static_cast<std::uint32_t>(alignment(g.a));
  const std::uint32_t align_b = static_cast<std::uint32_t>(alignment(g.b));
  const std::uint32_t align_d = static_cast<std::uint32_t>(alignment(g.d));
  lt.pref_set(pref, kPrefMaxWorkspace, &max_workspace, sizeof(max_workspace));
  lt.pref_set(pref, kPrefAlignA, &align_a, sizeof(align_a));
  lt.pref_set(pref, kPrefAlignB, &align_b, sizeof(align_b));
  lt.pref_set(pref, kPrefAlignC, &align_d, sizeof(align_d));
  lt.pref_set(pref, kPrefAlignD, &align_d, sizeof(align_d));
  HeuristicResult result{};
  int found = 0;
  Status s = lt.heuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  lt.pref_destroy(pref);
  if (s != 0 || found == 0) {
    throw RuntimeFailure("cuBLASLt has no algorithm for this matmul (" + std::to_string(g.m) + "x" +
                         std::to_string(g.n) + "x" + std::to_string(g.k) + ", types " +
                         std::to_string(g.a_type) + "/" + std::to_string(g.b_type) + "->" +
                         std::to_string(g.d_type) + ", compute " + std::to_string(g.compute) +
                         "): " + status_text(lt, s));
  }
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

}  // namespace

void gemm(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) throw RuntimeFailure("gemm: empty problem");
  const int device = ensure_context();
  const Api& lt = api();
  Handle handle;
  std::uint64_t workspace;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    handle = handle_for(device);
    workspace = workspace_for(device, g.stream);
  }
  std::shared_ptr<Plan> plan = plan_for(g, device, handle);
  // alpha and beta in the scale type
  float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  double alpha_d = g.alpha, beta_d = g.beta;
  std::int32_t alpha_i = static_cast<std::int32_t>(g.alpha), beta_i = static_cast<std::int32_t>(g.beta);
  const void* alpha = &alpha_f;
  const void* beta = &beta_f;
  if (g.scale_type == kR64F) {
    alpha = &alpha_d;
    beta = &beta_d;
  } else if (g.scale_type == kR32I) {
    alpha = &alpha_i;
    beta = &beta_i;
  }
  std::lock_guard<std::mutex> lock(plan->mutex);
  if (g.bias != 0) {
    check_lt(lt, lt.desc_set(plan->desc, kDescBiasPointer, &g.bias, sizeof(g.bias)), "desc bias");
  }
  if (g.a_scale != 0 || g.b_scale != 0) {
    check_lt(lt, lt.desc_set(plan->desc, kDescAScale, &g.a_scale, sizeof(g.a_scale)), "desc A scale");
    check_lt(lt, lt.desc_set(plan->desc, kDescBScale, &g.b_scale, sizeof(g.b_scale)), "desc B scale");
  }
  void* d = reinterpret_cast<void*>(g.d);
  check_lt(lt,
           lt.matmul(handle, plan->desc, alpha, reinterpret_cast<const void*>(g.a), plan->a,
                     reinterpret_cast<const void*>(g.b), plan->b, beta, d, plan->d, d, plan->d, &plan->algo,
                     reinterpret_cast<void*>(workspace), kWorkspaceBytes, reinterpret_cast<void*>(g.stream)),
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

}  // namespace pygpukit
