// Internal to src/kernels/cuda: the Hopper (sm_90a) wgmma kernel of the bf16 GEMM
// (gemm_wgmma.cu), which gemm() of gemm.cu runs where groups have many rows. Same GemmArgs
// contract and the same bits as the mma.sync kernel (docs/gpu.md, "The wgmma kernel").
#pragma once

#include "kernels/cuda/gemm.cuh"

namespace epmoe::cuda {

// The m-tile height of the wgmma kernel for rows rows per group (the hint of a grouped GEMM, M of
// a dense one), or 0 where the mma.sync kernel is faster.
int wgmma_tile_m(int rows);

// gemm<bf16, TC> on the wgmma kernel with the tile of wgmma_tile_m(rows) (which must be > 0).
template <class TC>
void gemm_wgmma(const GemmArgs& a, Epilogue ep, int rows, cudaStream_t stream);

}  // namespace epmoe::cuda
