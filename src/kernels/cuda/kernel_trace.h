// The kernel timeline of a step on the GPU (issue 33: "profile one 48-layer decode step"): which
// kernel holds the dependent chain for how long, measured inside the CUDA graph that real decode
// steps replay. Nsight Systems does not run on the lent machines and Nsight Compute serializes
// kernels (each small kernel then carries the launch and hand-over that PDL and the graph hide), so
// the kernels stamp the time themselves (kernels/cuda/common.cuh, pdl_wait). No CUDA types here.
//
// Use (bench/cuda/gpu_model_bench.cu --trace):
//   kernel_trace_start(cap);          stamps on; the launches from here on are noted by name
//   ... a step that captures a graph (names in launch order: the graph replays that order) ...
//   kernel_trace_stop_names();
//   kernel_trace_clear(); step; KernelTrace t = kernel_trace_read();   per replayed step
//   kernel_trace_end();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe::cuda {

struct KernelTrace {
  std::vector<std::string> names;  // the kernels launched while names were noted, in order
  std::vector<uint64_t> stamps;    // ns (%globaltimer) at which each one's pdl_wait returned, in order
  bool complete() const { return !names.empty() && names.size() == stamps.size(); }
};

// Whether this build's kernels stamp (configured with -DEPMOE_KERNEL_TRACE=ON); start() throws
// InputError otherwise.
bool kernel_trace_built();
void kernel_trace_start(size_t capacity);
void kernel_trace_stop_names();
void kernel_trace_clear();  // the stamps only (queued on the process's stream)
KernelTrace kernel_trace_read();  // waits for the stream
void kernel_trace_end();

// A kernel's name without its namespace, template arguments and parameters
// ("epmoe::cuda::(anonymous namespace)::split_gemv_ring_kernel<true, false, 32, 1>(...)" ->
// "split_gemv_ring_kernel").
std::string kernel_base_name(const std::string& demangled);

}  // namespace epmoe::cuda
