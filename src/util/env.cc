#include "util/env.h"

#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace epmoe {

const std::vector<EnvVar>& env_table() {
  static const std::vector<EnvVar> table = {
      // CPU kernels
      {"EPMOE_KERNELS", "auto | generic | avx2 | avx512",
       "caps the CPU kernel path for the process (comparing paths in one binary, bit-equality checks between "
       "machines); a path the CPU lacks falls back to the next one down"},
      // GPU kernel paths (each measured against the default in docs/gpu.md)
      {"EPMOE_PDL", "1 | 0", "0 launches every kernel the ordinary way instead of with programmatic dependent launch"},
      {"EPMOE_CUDA_GRAPH", "1 | 0", "0 runs decode steps kernel by kernel instead of replaying a CUDA graph"},
      {"EPMOE_ATTN_TILED", "1 | 0", "0 uses the per-(token, head) attention kernel instead of the shared-K/V tiles"},
      {"EPMOE_ATTN_DECODE", "32 | N", "decode steps of up to N sequences use the decode attention kernel (0: never)"},
      {"EPMOE_DENSE_WGMMA", "0 | 1", "1 runs dense GEMMs of up to 16 rows on the wgmma kernel (same bits; slower)"},
      {"EPMOE_EXPERT_TILE", "32 | 64",
       "64 runs the routed experts' GEMMs of decode-sized groups on 64-column tiles instead of 32 (half the "
       "CTAs; the same bits; for measuring)"},
      {"EPMOE_PLANLESS_JOBS", "16 | N",
       "the routed experts of a step with up to N (token, slot) pairs run without the plan kernel, each pair a "
       "one-row group whose GEMM picks its expert's weights (0: always plan; the same bits)"},
      {"EPMOE_FUSED_COMBINE", "1 | 0",
       "0: a planless step's slot-order combine runs as its own kernel after the experts instead of in the "
       "down GEMM's last CTA of each column tile (the same bits; for measuring)"},
      {"EPMOE_ROUTE_BLOCK", "1 | 0",
       "0 routes SoftmaxTopK one warp per token instead of one block per token, a thread per expert (the same "
       "bits; for measuring)"},
      {"EPMOE_ROUTER_ROUTES", "0 | 1 | 2 | 3",
       "who routes a decode step instead of the route kernel after the router (the same bits): 1 the router's "
       "last CTA (measured slower at 8 sequences, run 23), 2 the router run as one cluster whose CTA t routes "
       "row t, 3 that cluster with its weights asked for before its PDL wait"},
      {"EPMOE_RMSNORM_REGS", "1 | 0",
       "0 runs RMSNorm on the loop kernel instead of the one that keeps the row in registers (rows up to 4096 "
       "wide; the same bits; for measuring)"},
      {"EPMOE_NORM_SPLITS", "1 | 0",
       "0: the q/k/v and o projections of a decode step split their x themselves instead of the input norm and "
       "decode attention writing it split (the same bits; for measuring)"},
      {"EPMOE_ATTN_EARLY_TILES", "1 | 0",
       "0: decode attention requests no K/V tiles of earlier positions before its PDL wait (the same values; for "
       "measuring)"},
      {"EPMOE_ATTN_DECODE_WARPS", "8 | 4 | 16",
       "warps of a decode attention block where the blocks are one per SM (4: its shape before run 30; the same "
       "bits; for measuring)"},
      {"EPMOE_ATTN_DECODE_STAGES", "8 | 4",
       "4: decode attention stages 4 K/V tiles instead of 8 where its blocks are one per SM and 8 fit (the same "
       "bits; for measuring)"},
      {"EPMOE_ATTN_ROPE", "1 | 0",
       "0: the rope kernel does decode steps' q/k norm, RoPE and KV-cache write before decode attention instead of "
       "the attention kernel doing its own token's where its blocks are one per SM (the same bits; for measuring)"},
      {"EPMOE_SPLIT_GEMV", "1 | 0 | v5 | v4 | v3",
       "0 runs decode steps' split projections on the tile kernel instead of split_gemv (same bits), and packs no "
       "fragment copy of their weights; v5 runs split_gemv's earlier version (its ring filled by every lane's "
       "cp.async instead of bulk copies), v4 the one before (x as the MMA's A operand, 8 columns per warp), v3 that "
       "one with the weights prefetched into registers instead of the shared-memory ring (same bits)"},
      // Launchers
      {"EPMOE_WORLD_SIZE", "unset | N", "ranks of a GPU run started by scripts/gpu-launch.sh (unset: mpirun's, or 1)"},
      {"EPMOE_RANK", "0 | r", "this process's rank under scripts/gpu-launch.sh"},
      {"EPMOE_NCCL_ID_FILE", "path", "where rank 0 leaves the NCCL unique id for the others (scripts/gpu-launch.sh)"},
      {"EPMOE_COMM_TIMEOUT", "seconds", "the GPU group's wait limit when no --comm-timeout is given"},
      {"OMPI_COMM_WORLD_SIZE", "(mpirun)", "set by OpenMPI's mpirun: the process runs as one rank of an MPI group"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "(mpirun)", "the rank on its host: which GPU it takes"},
      {"PMIX_RANK", "(launcher)", "set by PMIx launchers: the process runs under one"},
      {"PMIX_LOCAL_RANK", "(launcher)", "the rank on its host under a PMIx launcher: which GPU it takes"},
      {"PMI_SIZE", "(launcher)", "set by PMI launchers: the process runs under one"},
      {"TMPDIR", "/tmp", "where the GPU group's per-rank status files go"},
      // Tests
      {"EPMOE_TEST_FAULT", "unset | spec", "test-only: a fault injected at a rank's group waits (comm/test_fault.h)"},
  };
  return table;
}

const char* env_get(const char* name) {
  bool known = false;
  for (const EnvVar& v : env_table()) known |= std::strcmp(v.name, name) == 0;
  EPMOE_ASSERT(known, std::string("environment variable ") + name + " is not in util/env.cc's table");
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

bool env_off(const char* name) {
  const char* v = env_get(name);
  return v && std::strcmp(v, "0") == 0;
}

bool env_on(const char* name) {
  const char* v = env_get(name);
  return v && std::strcmp(v, "1") == 0;
}

long long env_int(const char* name, long long dflt) {
  const char* v = env_get(name);
  return v ? std::atoll(v) : dflt;
}

}  // namespace epmoe
