# Sourced by the gpu-*.sh scripts on a GPU machine: libraries of .gpu/lib and NCCL on the loader
# path, NVLink multicast off (device README: it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0
GPU_BIN=${GPU_BIN:-$PWD/.gpu/bin}
nccl_dir=""
for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  [[ -e $d/libnccl.so.2 ]] && nccl_dir=$d && break
done
if [[ -z $nccl_dir ]]; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
if [[ -z $nccl_dir ]]; then
  nccl_dir=$(dirname "$(find / -name libnccl.so.2 -not -path '*/proc/*' 2>/dev/null | head -1)")
fi
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${nccl_dir}:${LD_LIBRARY_PATH:-}"
# Nsight Compute, where the machine has it (empty otherwise): the profiling scripts' one lookup.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
