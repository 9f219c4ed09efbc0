// The kernel timeline (kernel_trace.h): the registry of the per-translation-unit sinks, the names
// noted at launch, the stamps read back.
#include "kernels/cuda/kernel_trace.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

bool g_kernel_trace_recording = false;

namespace {

std::vector<TraceSinkSetter>& setters() {
  static std::vector<TraceSinkSetter> v;  // (filled by static initialisers: a function-local static)
  return v;
}

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

void set_all(const TraceSink& t) {
  for (TraceSinkSetter f : setters()) f(t);
}

}  // namespace

bool register_trace_sink(TraceSinkSetter set) {
  setters().push_back(set);
  return true;
}

std::string kernel_base_name(const std::string& d) {
  // The name ends where its template arguments or parameters begin (at depth 0 of the brackets).
  size_t end = d.size();
  for (size_t i = 0; i < d.size(); i++)
    if (d[i] == '<' || d[i] == '(') {
      end = i;
      break;
    }
  const std::string path = d.substr(0, end);
  const size_t colon = path.rfind("::");
  return colon == std::string::npos ? path : path.substr(colon + 2);
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
  TraceState& st = state();
  st.stamps.reserve(capacity);
  st.count.reserve(1);
  st.capacity = capacity;
  st.names.clear();
  kernel_trace_clear();
  set_all({st.stamps.data(), st.count.data(), unsigned(capacity)});
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
  set_all({});
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace epmoe::cuda
