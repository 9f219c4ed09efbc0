// The kernel timeline (kernel_trace.h): the registry of the per-translation-unit sinks, the names
// noted at launch, the stamps read back.
#include "kernels/cuda/kernel_trace.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

bool g_kernel_trace_recording = false;

bool kernel_trace_built() {
#ifdef EPMOE_KERNEL_TRACE
  return true;
#else
  return false;
#endif
}

#ifdef EPMOE_KERNEL_TRACE
namespace {

std::vector<TraceSinkSetter>& setters() {
  static std::vector<TraceSinkSetter> v;  // (filled by static initialisers: a function-local static)
  return v;
}

}  // namespace

bool register_trace_sink(TraceSinkSetter set) {
  setters().push_back(set);
  return true;
}
#endif

namespace {

struct TraceState {
  DeviceArray<unsigned long long> stamps;
  DeviceArray<unsigned> count;
  size_t capacity = 0;
  std::vector<std::string> names;
};
TraceState& state() {
  static TraceState s;
  return s;
}

// Every translation unit's sink: the stamps' arrays, or none.
void set_all(bool on) {
#ifdef EPMOE_KERNEL_TRACE
  TraceState& st = state();
  const TraceSink t = on ? TraceSink{st.stamps.data(), st.count.data(), unsigned(st.capacity)} : TraceSink{};
  for (TraceSinkSetter f : setters()) f(t);
#else
  (void)on;
#endif
}

}  // namespace

std::string kernel_base_name(const std::string& demangled) {
  // "(anonymous namespace)" is a scope like any other; the name ends where its template arguments
  // or parameters begin, and a template's demangled name starts with its return type.
  std::string d = demangled;
  for (size_t p; (p = d.find("(anonymous namespace)")) != std::string::npos;) d.erase(p, 21);
  const std::string path = d.substr(0, d.find_first_of("<("));
  const size_t start = path.find_last_of(": ");
  return start == std::string::npos ? path : path.substr(start + 1);
}

void kernel_trace_note(const void* kernel) {
  const char* mangled = nullptr;
  std::string name = "?";
  if (cudaFuncGetName(&mangled, kernel) == cudaSuccess && mangled) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
    name = kernel_base_name(status == 0 && d ? std::string(d.get()) : std::string(mangled));
  }
  state().names.push_back(name);
}

void kernel_trace_start(size_t capacity) {
  if (!kernel_trace_built())
    throw InputError("the kernel trace needs a build configured with -DEPMOE_KERNEL_TRACE=ON "
                     "(scripts/gpu-package.sh TRACE=1): the runtime's kernels carry no stamps");
  TraceState& st = state();
  st.stamps.reserve(capacity);
  st.count.reserve(1);
  st.capacity = capacity;
  st.names.clear();
  kernel_trace_clear();
  set_all(true);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  g_kernel_trace_recording = true;
}

void kernel_trace_stop_names() { g_kernel_trace_recording = false; }

void kernel_trace_clear() {
  EPMOE_CUDA_CHECK(cudaMemsetAsync(state().count.data(), 0, sizeof(unsigned), stream()));
}

KernelTrace kernel_trace_read() {
  TraceState& st = state();
  KernelTrace t;
  t.names = st.names;
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const unsigned n = st.count.download(1)[0];
  const size_t kept = std::min<size_t>(n, st.capacity);
  const std::vector<unsigned long long> s = st.stamps.download(kept);
  t.stamps.assign(s.begin(), s.end());
  if (n > st.capacity) t.stamps.push_back(0);  // (more kernels than room: never complete())
  return t;
}

void kernel_trace_end() {
  g_kernel_trace_recording = false;
  set_all(false);
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace epmoe::cuda
