// EPMOE_HOST_DEVICE: a function that host code and CUDA kernels both call (the one definition that
// keeps both sides' arithmetic or layout math the same). Empty outside nvcc.
#pragma once

#if defined(__CUDACC__)
#define EPMOE_HOST_DEVICE __host__ __device__
#else
#define EPMOE_HOST_DEVICE
#endif
