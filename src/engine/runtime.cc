#include "engine/runtime.h"

#include "comm/mpi_group.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/threads.h"
#ifdef EPMOE_HAVE_CUDA
#include "comm/nccl_group.h"
#include "model/cuda/gpu_model.h"
#endif

namespace epmoe {

namespace {

[[noreturn]] void no_cuda() {
  throw InputError(std::string("--device ") + device_name(Device::Cuda) +
                   ": this epmoe was built without CUDA (configure with -DEPMOE_CUDA=ON on a machine with nvcc and "
                   "NCCL)");
}

}  // namespace

std::string resolve_compute(Device device, const std::string& compute) {
  if (compute.empty()) {
    switch (device) {
      case Device::Cpu: return "f32";
      case Device::Cuda: return "bf16";  // bf16 tensor cores, fp32-grade products outside the experts
    }
  }
  if (compute != "f32" && compute != "bf16") throw InputError("--compute '" + compute + "': choose f32 or bf16");
  return compute;
}

Group& start_group(Device device, double comm_timeout) {
  Group* g = nullptr;
  switch (device) {
    case Device::Cpu: g = &MpiGroup::world(); break;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      // The deadline goes in at creation: ncclCommInitRank runs under it too.
      g = &NcclGroup::world(comm_timeout);
      break;
#else
      no_cuda();
#endif
  }
  g->set_timeout(comm_timeout);
  set_active_group(g);
  return *g;
}

void apply_run_context(const EngineOptions& o) {
  switch (o.device) {
    case Device::Cpu: set_num_threads(o.threads); return;  // the pool is the process's
    case Device::Cuda: return;
  }
}

Placement make_placement(const EngineOptions& o, int E, int R) {
  return o.placement_file.empty() ? Placement::make_default(E, R, o.redundant_experts)
                                  : Placement::from_file(o.placement_file, E, R);
}

std::unique_ptr<LanguageModel> make_model(Device device, const ModelConfig& cfg, const Checkpoint& ckpt,
                                          const Placement& placement, int rank, const std::string& compute,
                                          const KvOptions& kv, const std::string& fp8_compute,
                                          const std::string& lm_head) {
  if (fp8_compute != "dequant" && fp8_compute != "tensor-core")
    throw InputError("--fp8-compute '" + fp8_compute + "': expected dequant or tensor-core");
  const LmHeadForm head = parse_lm_head_form(lm_head);
  KvOptions kvr = kv;  // with the dtype resolved
  switch (device) {
    case Device::Cpu:
      if (kv.dtype == KvDtype::BF16)
        throw InputError("--kv-cache-dtype bf16: a bf16 KV cache exists on --device cuda only (the CPU keeps K and V "
                         "in fp32)");
      if (kv.mem_fraction > 0)
        throw InputError("--mem-fraction sizes the GPU's KV cache; on the CPU give --kv-cache-tokens (default: a "
                         "quarter of the available memory)");
      kvr.dtype = KvDtype::F32;
      if (fp8_compute != "dequant")
        throw InputError("--fp8-compute " + fp8_compute +
                         ": the fp8 tensor-core path exists on --device cuda only (the CPU dequantizes fp8 weights "
                         "per 128-block inside its kernels)");
      return std::make_unique<Model>(cfg, ckpt, placement, rank,
                                     resolve_compute(device, compute) == "bf16" ? ComputeMode::BF16 : ComputeMode::F32,
                                     kvr, head);
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
    {
      if (head != LmHeadForm::Checkpoint)
        throw InputError("--lm-head " + lm_head + ": int8 rows exist on --device cpu only (the GPU reads the "
                         "checkpoint's head)");
      GpuModelOptions opt;
      opt.f32 = resolve_compute(device, compute) == "f32";
      opt.fp8 = fp8_compute == "tensor-core" ? GpuFp8Compute::TensorCore : GpuFp8Compute::Dequant;
      opt.kv = kvr;
      // auto: the model's dtype -- bf16 for a bf16 checkpoint computed in bf16 (its K and V are
      // products of bf16 weights already), fp32 otherwise (an fp32 checkpoint, or --compute f32).
      if (kv.dtype == KvDtype::Auto)
        opt.kv.dtype = !opt.f32 && cfg.torch_dtype == "bfloat16" ? KvDtype::BF16 : KvDtype::F32;
      return make_gpu_model(cfg, ckpt, placement, rank, opt);
    }
#else
      (void)compute;
      (void)kvr;
      no_cuda();
#endif
  }
  throw Error("make_model: unknown device");
}

Runtime prepare_runtime(const EngineOptions& o) {
  if (!device_compiled(o.device)) no_cuda();
  Runtime rt;
  rt.options = o;
  rt.options.compute = resolve_compute(o.device, o.compute);
  rt.device = o.device;
  rt.group = &start_group(o.device, o.comm_timeout);
  apply_run_context(rt.options);
  rt.cfg = load_model_config(o.model_dir);
  rt.ckpt = std::make_unique<Checkpoint>(o.model_dir);
  const int E = rt.cfg.routing.num_experts, R = rt.group->size();
  if (o.solo) {
    rt.placement = Placement::make_default(E, 1, 0);
    rt.model_rank = 0;
    rt.backend = make_local_backend(o.device, rt.placement);
    return rt;
  }
  rt.placement = make_placement(o, E, R);
  rt.model_rank = rt.group->rank();
  // The backend before the weights: a bad name or an unsupported pair costs no loading.
  rt.backend = make_backend(o.backend, o.device, *rt.group, rt.placement, o.backend_options);
  return rt;
}

void load_model(Runtime& rt) {
  const EngineOptions& o = rt.options;
  if (o.check_weights) check_weights_finite(rt.cfg, *rt.ckpt, rt.placement.logical_owned_by(rt.model_rank));
  rt.model = make_model(o.device, rt.cfg, *rt.ckpt, rt.placement, rt.model_rank, o.compute, o.kv, o.fp8_compute,
                        o.lm_head);
}

Runtime make_runtime(const EngineOptions& o) {
  Runtime rt = prepare_runtime(o);
  load_model(rt);
  return rt;
}

}  // namespace epmoe
