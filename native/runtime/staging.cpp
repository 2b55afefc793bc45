// Staged pageable copies (see staging.hpp).
#include "staging.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "context.hpp"
#include "driver.hpp"
#include "errors.hpp"

namespace pygpukit {

namespace {

constexpr std::size_t kPartBytes = 1 << 20;  // the unit of work of one copy thread
constexpr int kMaxDevices = 64;
constexpr unsigned kMaxBuffers = 8;

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') {
    throw RuntimeFailure(std::string(name) + " must be a non-negative integer, got '" + text + "'");
  }
  return static_cast<std::size_t>(value);
}

// A small persistent thread pool that copies one contiguous range in 1 MiB parts; the calling thread
// takes parts too. Threads start on first use and live as long as the process.
class CopyThreads {
 public:
  explicit CopyThreads(unsigned helpers) {
    for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { run(); });
  }

  void copy(void* dst, const void* src, std::size_t nbytes) {
    if (threads_.empty() || nbytes <= kPartBytes) {
      std::memcpy(dst, src, nbytes);
      return;
    }
    std::lock_guard<std::mutex> one_job_at_a_time(serial_);
    auto job = std::make_shared<Job>();
    job->dst = static_cast<char*>(dst);
    job->src = static_cast<const char*>(src);
    job->bytes = nbytes;
    job->parts = (nbytes + kPartBytes - 1) / kPartBytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    work(*job);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return job->finished.load(std::memory_order_acquire) == job->parts; });
    job_.reset();
  }

 private:
  struct Job {
    char* dst = nullptr;
    const char* src = nullptr;
    std::size_t bytes = 0;
    std::size_t parts = 0;
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> finished{0};
  };

  void work(Job& job) {
    for (std::size_t i = job.next.fetch_add(1); i < job.parts; i = job.next.fetch_add(1)) {
      const std::size_t begin = i * kPartBytes;
      std::memcpy(job.dst + begin, job.src + begin, std::min(kPartBytes, job.bytes - begin));
      if (job.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == job.parts) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  void run() {
    std::uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      if (job) work(*job);
    }
  }

  std::mutex serial_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::shared_ptr<Job> job_;
  std::uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

CopyThreads& copy_threads() {
  // Leaked on purpose: the threads wait forever and must not be joined during interpreter shutdown.
  static CopyThreads* threads = new CopyThreads(staging_config().threads - 1);
  return *threads;
}

struct DeviceStaging {
  std::mutex mutex;
  bool ready = false;
  std::array<void*, kMaxBuffers> buffers{};
  std::array<CUevent, kMaxBuffers> events{};
  std::array<bool, kMaxBuffers> pending{};  // an event was recorded after the buffer's last use
};

std::array<DeviceStaging, kMaxDevices> g_staging;

// Locks the current device's staging state and allocates its buffers on first use.
std::unique_lock<std::mutex> acquire(int device, DeviceStaging** out) {
  if (device < 0 || device >= kMaxDevices) throw RuntimeFailure("device ordinal out of range for staging");
  DeviceStaging& s = g_staging[static_cast<std::size_t>(device)];
  std::unique_lock<std::mutex> lock(s.mutex);
  if (!s.ready) {
    const DriverApi& api = driver();
    const StagingConfig& config = staging_config();
    for (unsigned i = 0; i < config.buffers; ++i) {
      check(api.cuMemHostAlloc(&s.buffers[i], config.chunk_bytes, CU_MEMHOSTALLOC_PORTABLE),
            "cuMemHostAlloc (staging buffer)");
      check(api.cuEventCreate(&s.events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate (staging)");
    }
    s.ready = true;
  }
  *out = &s;
  return lock;
}

}  // namespace

bool staging_forget_device(int device) {
  if (device < 0 || device >= kMaxDevices) return false;
  DeviceStaging& s = g_staging[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(s.mutex);
  const bool had = s.ready;
  s.ready = false;
  s.buffers.fill(nullptr);
  s.events.fill(nullptr);
  s.pending.fill(false);
  return had;
}

namespace {

void wait_buffer(DeviceStaging& s, unsigned b) {
  if (s.pending[b]) {
    check(driver().cuEventSynchronize(s.events[b]), "cuEventSynchronize (staging)");
    s.pending[b] = false;
  }
}

}  // namespace

const StagingConfig& staging_config() {
  static const StagingConfig config = [] {
    StagingConfig c{};
    c.min_bytes = env_size("PYGPUKIT_STAGING_MIN_BYTES", std::size_t{4} << 20);
    c.chunk_bytes =
        std::max<std::size_t>(env_size("PYGPUKIT_STAGING_CHUNK_BYTES", std::size_t{8} << 20), 1 << 16);
    const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
    c.threads = static_cast<unsigned>(
        std::clamp<std::size_t>(env_size("PYGPUKIT_COPY_THREADS", std::min(hardware, 8u)), 1, 64));
    c.buffers = 3;
    return c;
  }();
  return config;
}

void copy_host_to_device(std::uint64_t dst, const void* src, std::size_t nbytes, std::uint64_t stream) {
  if (nbytes == 0) return;
  const int device = ensure_context();
  const DriverApi& api = driver();
  const StagingConfig& config = staging_config();
  auto s_handle = reinterpret_cast<CUstream>(stream);
  if (config.min_bytes == 0 || nbytes < config.min_bytes) {
    // The driver's pageable copy, on `stream` itself: it returns once `src` has been copied to the
    // driver's staging memory (so the caller may reuse it), and the DMA to `dst` is ordered on
    // `stream`, before the work issued there next. (The synchronous cuMemcpyHtoD would put that DMA
    // on the legacy stream, which a non-blocking stream does not wait for: a kernel on `stream`
    // could read `dst` before the data arrived, as seen on an H100 under load.)
    check(api.cuMemcpyHtoDAsync(dst, src, nbytes, s_handle), "cuMemcpyHtoDAsync");
    return;
  }
  CopyThreads& threads = copy_threads();
  DeviceStaging* s = nullptr;
  auto lock = acquire(device, &s);
  const auto* from = static_cast<const char*>(src);
  unsigned last = 0;
  for (std::size_t offset = 0, chunk = 0; offset < nbytes; offset += config.chunk_bytes, ++chunk) {
    const unsigned b = static_cast<unsigned>(chunk % config.buffers);
    const std::size_t n = std::min(config.chunk_bytes, nbytes - offset);
    wait_buffer(*s, b);  // its previous DMA has finished reading it
    threads.copy(s->buffers[b], from + offset, n);
    check(api.cuMemcpyHtoDAsync(dst + offset, s->buffers[b], n, s_handle), "cuMemcpyHtoDAsync (staged)");
    check(api.cuEventRecord(s->events[b], s_handle), "cuEventRecord (staging)");
    s->pending[b] = true;
    last = b;
  }
  wait_buffer(*s, last);  // the copy is complete when this returns, like the driver's pageable copy
}

void copy_device_to_host(void* dst, std::uint64_t src, std::size_t nbytes, std::uint64_t stream) {
  if (nbytes == 0) return;
  const int device = ensure_context();
  const DriverApi& api = driver();
  const StagingConfig& config = staging_config();
  auto s_handle = reinterpret_cast<CUstream>(stream);
  if (config.min_bytes == 0 || nbytes < config.min_bytes) {
    if (stream != 0) check(api.cuStreamSynchronize(s_handle), "cuStreamSynchronize");
    check(api.cuMemcpyDtoH(dst, src, nbytes), "cuMemcpyDtoH");
    return;
  }
  CopyThreads& threads = copy_threads();
  DeviceStaging* s = nullptr;
  auto lock = acquire(device, &s);
  auto* to = static_cast<char*>(dst);
  const std::size_t chunks = (nbytes + config.chunk_bytes - 1) / config.chunk_bytes;
  auto issue = [&](std::size_t chunk) {
    const unsigned b = static_cast<unsigned>(chunk % config.buffers);
    const std::size_t offset = chunk * config.chunk_bytes;
    wait_buffer(*s, b);
    check(api.cuMemcpyDtoHAsync(s->buffers[b], src + offset, std::min(config.chunk_bytes, nbytes - offset),
                                s_handle),
          "cuMemcpyDtoHAsync (staged)");
    check(api.cuEventRecord(s->events[b], s_handle), "cuEventRecord (staging)");
    s->pending[b] = true;
  };
  // Keep (buffers - 1) DMAs in flight ahead of the host copy out of the oldest one.
  const std::size_t ahead = std::max<std::size_t>(1, config.buffers - 1);
  for (std::size_t chunk = 0; chunk < std::min(ahead, chunks); ++chunk) issue(chunk);
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
    const unsigned b = static_cast<unsigned>(chunk % config.buffers);
    const std::size_t offset = chunk * config.chunk_bytes;
    wait_buffer(*s, b);
    if (chunk + ahead < chunks) issue(chunk + ahead);
    threads.copy(to + offset, s->buffers[b], std::min(config.chunk_bytes, nbytes - offset));
  }
}

}  // namespace pygpukit
