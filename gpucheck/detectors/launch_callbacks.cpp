// The launch trace's recorder from CUPTI's callback API (gpucheck/detectors/launch_callbacks.py
// builds and loads it; gpucheck/detectors/launch_trace.py reads it).
//
// While a window is open (gc_open .. gc_close) every kernel launch, copy and memset of the
// process (the runtime's calls, and the driver's made outside them) is recorded as it is made: its place in one sequence that the markers share
// (gc_mark), the device of its context, its stream, its kind and its name. No activity record
// is asked for, so CUPTI instruments no kernel; gc_close unsubscribes, which leaves CUPTI to a
// test's own profiler between windows.
//
// What a launch costs inside a window is kept small, and counted: each name is demangled once
// a process (records hold an index into one table of names, gc_name), the launches of a thread
// inside gpucheck's own work around a call (gc_aside: its re-runs and hashes, which the
// judgement leaves out anyway) are not recorded, and the time the recorder takes at the
// launches is summed (gc_spent_ns: the trace puts it in the case's cost).
//
// Streams: the legacy default stream is 0 (a null handle or CU_STREAM_LEGACY), the per-thread
// default stream 2 (CU_STREAM_PER_THREAD, or a null handle in a per-thread launch), every
// other stream its handle: what torch's Stream.cuda_stream says for the same stream.
//
// A plain C ABI (ctypes): no Python or torch headers, a build of a second.

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

enum Kind : int32_t { KERNEL = 0, MEMCPY = 1, MEMSET = 2 };

struct Record {
  int64_t seq;
  int64_t stream;
  int32_t device;
  int32_t kind;
  int32_t name;  // index into names
};

constexpr int64_t LEGACY = 0;
constexpr int64_t PER_THREAD = 2;

CUpti_SubscriberHandle subscriber = nullptr;
std::atomic<int64_t> sequence{0};
std::mutex lock;  // records and the name table
std::vector<Record> records;
// The name table: each name as recorded (a mangled kernel name, a copy's label) once, its
// index, and what a record reads (the kernel's demangled name). Kept for the process.
std::deque<std::string> raw_names;  // stable storage for the keys below
std::unordered_map<std::string_view, int32_t> name_ids;
std::vector<std::string> names;
std::atomic<int64_t> spent_ns{0};  // the recorder's time at the launches since gc_spent_ns
// Inside a runtime call this thread's driver calls are that call's own, not recorded again.
// The depth is reset by a new window (generation): a window closed between a runtime call's
// entry and exit never sees the exit.
std::atomic<uint64_t> generation{0};
struct Depth {
  uint64_t generation = 0;
  int depth = 0;
};
thread_local Depth runtime;

int& runtime_depth() {
  uint64_t now = generation.load();
  if (runtime.generation != now) runtime = Depth{now, 0};
  return runtime.depth;
}

// gpucheck's own work on this thread (gc_aside), for the window of that generation only: a
// flag a closed window left behind never hides a later window's launches.
thread_local Depth aside;

bool aside_thread() { return aside.depth > 0 && aside.generation == generation.load(); }

int64_t stream_id(const void* handle, bool per_thread) {
  auto h = reinterpret_cast<uintptr_t>(handle);
  if (h == 0) return per_thread ? PER_THREAD : LEGACY;
  if (h == 1) return LEGACY;
  if (h == 2) return PER_THREAD;
  return static_cast<int64_t>(h);
}

std::string demangled(const char* name) {
  if (name == nullptr) return "";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = (status == 0 && out != nullptr) ? out : name;
  std::free(out);
  return result;
}

// The index of a name in the table (demangled there once, for a kernel). Under lock.
int32_t name_id(const char* raw, int32_t kind) {
  std::string_view key(raw == nullptr ? "" : raw);
  auto found = name_ids.find(key);
  if (found != name_ids.end()) return found->second;
  raw_names.emplace_back(key);
  auto id = static_cast<int32_t>(names.size());
  names.push_back(kind == KERNEL ? demangled(raw) : raw_names.back());
  name_ids.emplace(raw_names.back(), id);
  return id;
}

void keep(int32_t device, int64_t stream, int32_t kind, const char* name) {
  int64_t seq = sequence.fetch_add(1) + 1;
  std::lock_guard<std::mutex> guard(lock);
  records.push_back(Record{seq, stream, device, kind, name_id(name, kind)});
}

// The time from its making to its end, added to spent_ns.
struct Timed {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Timed() {
    auto took = std::chrono::steady_clock::now() - start;
    spent_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
  }
};

void record(const CUpti_CallbackData* info, const void* handle, bool per_thread, int32_t kind,
            const char* name) {
  if (aside_thread()) return;
  Timed timed;
  uint32_t device = 0;
  int32_t dev = cuptiGetDeviceId(info->context, &device) == CUPTI_SUCCESS
                    ? static_cast<int32_t>(device)
                    : -1;
  keep(dev, stream_id(handle, per_thread), kind, name);
}

// The runtime's launches, copies and memsets (what <<<>>>, cub, thrust and torch call), then
// the driver's own (what a module loaded with cuModuleLoad launches, what cuMemcpy copies); a
// runtime call's own driver calls are skipped.
const CUpti_CallbackId RUNTIME_CALLS[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000,
};

const char* copy_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return "Memcpy HtoD";
    case cudaMemcpyDeviceToHost:
      return "Memcpy DtoH";
    case cudaMemcpyDeviceToDevice:
      return "Memcpy DtoD";
    case cudaMemcpyHostToHost:
      return "Memcpy HtoH";
    default:
      return "Memcpy";
  }
}

const CUpti_CallbackId DRIVER_CALLS[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds,
};

void on_runtime(CUpti_CallbackId cbid, const CUpti_CallbackData* info) {
  int& depth = runtime_depth();
  if (info->callbackSite == CUPTI_API_EXIT) {
    if (depth > 0) --depth;
    return;
  }
  ++depth;
  const void* p = info->functionParams;
  const void* stream = nullptr;
  bool per_thread = false;
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000: {
      const auto* a = static_cast<const cudaMemcpyAsync_v3020_params*>(p);  // same layout
      return record(info, a->stream, cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000,
                    MEMCPY, copy_name(a->kind));
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000:
      return record(info, static_cast<const cudaMemsetAsync_v3020_params*>(p)->stream,
                    cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000, MEMSET,
                    "Memset");
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000:
      return record(info, nullptr, cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000,
                    MEMCPY, copy_name(static_cast<const cudaMemcpy_v3020_params*>(p)->kind));
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000:
      return record(info, nullptr, cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000,
                    MEMSET, "Memset");
    default:
      break;
  }
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
      per_thread = true;
      [[fallthrough]];
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
      stream = static_cast<const cudaLaunchKernel_v7000_params*>(p)->stream;
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
      per_thread = true;
      [[fallthrough]];
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
      stream = static_cast<const cudaLaunchKernelExC_v11060_params*>(p)->config->stream;
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
      per_thread = true;
      [[fallthrough]];
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
      stream = static_cast<const cudaLaunchCooperativeKernel_v9000_params*>(p)->stream;
      break;
    default:
      return;
  }
  record(info, stream, per_thread, KERNEL, info->symbolName);
}

void on_driver(CUpti_CallbackId cbid, const CUpti_CallbackData* info) {
  if (info->callbackSite != CUPTI_API_ENTER || runtime_depth() > 0) return;
  const void* p = info->functionParams;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
      return record(info, static_cast<const cuLaunchKernel_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, KERNEL,
                    info->symbolName);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
      return record(info, static_cast<const cuLaunchKernelEx_params*>(p)->config->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, KERNEL,
                    info->symbolName);
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
      return record(info, static_cast<const cuLaunchCooperativeKernel_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz, KERNEL,
                    info->symbolName);
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz:
      return record(info, static_cast<const cuMemcpyAsync_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz, MEMCPY, "Memcpy");
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz:
      return record(info, static_cast<const cuMemcpyHtoDAsync_v2_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz, MEMCPY,
                    "Memcpy HtoD");
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz:
      return record(info, static_cast<const cuMemcpyDtoHAsync_v2_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz, MEMCPY,
                    "Memcpy DtoH");
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz:
      return record(info, static_cast<const cuMemcpyDtoDAsync_v2_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz, MEMCPY,
                    "Memcpy DtoD");
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz:
      return record(info, static_cast<const cuMemsetD8Async_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz, MEMSET, "Memset");
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz:
      return record(info, static_cast<const cuMemsetD16Async_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz, MEMSET, "Memset");
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz:
      return record(info, static_cast<const cuMemsetD32Async_params*>(p)->hStream,
                    cbid == CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz, MEMSET, "Memset");
    default:  // the synchronous copies and memsets: the legacy default stream, or the
              // per-thread one for their _ptds variants
      break;
  }
  bool per_thread = false;
  int32_t kind = MEMCPY;
  const char* name = "Memcpy";
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
      per_thread = true;
      break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
      per_thread = true;
      [[fallthrough]];
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
      kind = MEMSET;
      name = "Memset";
      break;
    default:
      break;
  }
  record(info, nullptr, per_thread, kind, name);
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                     const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    on_runtime(cbid, info);
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    on_driver(cbid, info);
  }
}

int enable(uint32_t on) {
  for (auto id : RUNTIME_CALLS) {
    CUptiResult r = cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
    if (r != CUPTI_SUCCESS) return static_cast<int>(r);
  }
  for (auto id : DRIVER_CALLS) {
    CUptiResult r = cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
    if (r != CUPTI_SUCCESS) return static_cast<int>(r);
  }
  return 0;
}

}  // namespace

extern "C" {

// Subscribe and start recording: 0, or CUPTI's error (another subscriber: a profiler holds
// CUPTI; no driver; ...), in which case nothing is held.
int gc_open() {
  if (subscriber != nullptr) return 0;
  generation.fetch_add(1);
  CUptiResult r = cuptiSubscribe(&subscriber, on_api, nullptr);
  if (r != CUPTI_SUCCESS) {
    subscriber = nullptr;
    return static_cast<int>(r);
  }
  int failed = enable(1);
  if (failed != 0) {
    cuptiUnsubscribe(subscriber);
    subscriber = nullptr;
  }
  return failed;
}

// Stop recording and let CUPTI go; the records stay until gc_clear.
int gc_close() {
  if (subscriber == nullptr) return 0;
  enable(0);
  CUptiResult r = cuptiUnsubscribe(subscriber);
  subscriber = nullptr;
  return static_cast<int>(r);
}

// The next place in the sequence (a marker's), shared with the records.
int64_t gc_mark() { return sequence.fetch_add(1) + 1; }

int64_t gc_count() {
  std::lock_guard<std::mutex> guard(lock);
  return static_cast<int64_t>(records.size());
}

// The first n records (fewer when there are fewer): their sequence places, streams, devices,
// kinds and names (indices into the name table, gc_name) into the arrays; how many were copied.
int64_t gc_read(int64_t n, int64_t* seq, int64_t* stream, int32_t* device, int32_t* kind,
                int32_t* name) {
  std::lock_guard<std::mutex> guard(lock);
  int64_t count = std::min(n, static_cast<int64_t>(records.size()));
  for (int64_t i = 0; i < count; ++i) {
    const Record& r = records[static_cast<size_t>(i)];
    seq[i] = r.seq;
    stream[i] = r.stream;
    device[i] = r.device;
    kind[i] = r.kind;
    name[i] = r.name;
  }
  return count;
}

// How many names the table holds (a record's name is an index below it).
int64_t gc_names() {
  std::lock_guard<std::mutex> guard(lock);
  return static_cast<int64_t>(names.size());
}

// The length of name i (to size the buffer), or -1 past the end.
int64_t gc_name_length(int64_t i) {
  std::lock_guard<std::mutex> guard(lock);
  if (i < 0 || i >= static_cast<int64_t>(names.size())) return -1;
  return static_cast<int64_t>(names[static_cast<size_t>(i)].size());
}

// Name i (NUL-terminated, cut to cap - 1 bytes) into out: 0, or -1 past the end.
int gc_name(int64_t i, char* out, int64_t cap) {
  std::lock_guard<std::mutex> guard(lock);
  if (i < 0 || i >= static_cast<int64_t>(names.size())) return -1;
  if (cap > 0) {
    const std::string& s = names[static_cast<size_t>(i)];
    size_t n = std::min(s.size(), static_cast<size_t>(cap - 1));
    std::memcpy(out, s.data(), n);
    out[n] = '\0';
  }
  return 0;
}

// Nanoseconds the recorder took at the launches it recorded since the last call.
int64_t gc_spent_ns() { return spent_ns.exchange(0); }

// gpucheck's own work around a call starts (1) or ends (0) on this thread: while it runs, this
// thread's launches are not recorded (those of the other threads are).
void gc_aside(int on) {
  uint64_t now = generation.load();
  if (aside.generation != now) aside = Depth{now, 0};
  if (on != 0) {
    ++aside.depth;
  } else if (aside.depth > 0) {
    --aside.depth;
  }
}

// A record as a launch callback makes it, without CUPTI (the CPU tests: no callback comes
// without a driver): 0, or 1 where this thread is aside.
int gc_inject(int32_t device, int64_t stream, int32_t kind, const char* name) {
  if (aside_thread()) return 1;
  Timed timed;
  keep(device, stream, kind, name);
  return 0;
}

void gc_clear() {
  std::lock_guard<std::mutex> guard(lock);
  records.clear();
}

}  // extern "C"
