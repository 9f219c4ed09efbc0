// What one dispatched record carries and where, for every expert-parallel backend that sends
// records: the MPI ones (ep/mpi/), the NCCL ones (ep/nccl/backends.cu) and the ones that write
// into peers' memory over CUDA IPC (ep/nccl/ipc_backends.cu). One struct sizes every buffer and
// locates every field, on the host and in kernels (DeepEP's config header is the model): packing,
// serving, window sizes and the expert jobs that read rows in place all go through it.
//
//   [row: H values of `elt` bytes]                 the token's activations (read in place by the experts)
//   [physical: K int32]                            the slot's physical expert, -1 where this
//                                                  destination serves no slot of the token
//   [origin: int32 token, int32 source rank]       only when records do not arrive in an order the
//                                                  home plan knows (MPI's exchanges; writes into
//                                                  peers' windows, which land in a racy order)
//   [weights: K fp32]                              only when the serving rank weighs its answers
//                                                  (the fast combine; MPI always carries them)
//   padding to `align` bytes                       16 on GPUs: rows and records copied as uint4
//
// A record for one slot only (per-(token, expert) messages, lowlatency) is the same record with
// every other slot's physical id -1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/host_device.h"

namespace epmoe {

struct DispatchRecordLayout {
  int H = 0, K = 0;
  int elt = 4;           // bytes of one row value: 4 (fp32) or 2 (bf16 activations on GPUs)
  bool origin = false;   // carries (token, source rank)
  bool weights = false;  // carries the K top-k weights
  int align = 4;         // a record's size is a multiple of this (16 where kernels copy uint4)

  EPMOE_HOST_DEVICE size_t row_bytes() const { return size_t(H) * size_t(elt); }
  EPMOE_HOST_DEVICE size_t phys_off() const { return row_bytes(); }
  EPMOE_HOST_DEVICE size_t origin_off() const { return phys_off() + 4 * size_t(K); }
  EPMOE_HOST_DEVICE size_t weight_off() const { return origin_off() + (origin ? 8 : 0); }
  EPMOE_HOST_DEVICE size_t bytes() const {
    const size_t end = weight_off() + (weights ? 4 * size_t(K) : 0);
    return (end + size_t(align) - 1) / size_t(align) * size_t(align);
  }

  // Bytes of one answer row coming back for a served slot: the fast combine's fp32 partial where the
  // serving rank weighs (weights carried), else a row of the activation type. (MPI carries the
  // weights in either mode; its rows are fp32, so the two agree there.)
  EPMOE_HOST_DEVICE size_t answer_bytes() const { return weights ? size_t(H) * 4 : row_bytes(); }

  // Field access of the record at `rec` (bytes() apart in a buffer).
  EPMOE_HOST_DEVICE const int32_t* physical(const unsigned char* rec) const {
    return reinterpret_cast<const int32_t*>(rec + phys_off());
  }
  EPMOE_HOST_DEVICE int32_t* physical(unsigned char* rec) const { return reinterpret_cast<int32_t*>(rec + phys_off()); }
  EPMOE_HOST_DEVICE int32_t token(const unsigned char* rec) const {
    return reinterpret_cast<const int32_t*>(rec + origin_off())[0];
  }
  EPMOE_HOST_DEVICE int32_t source(const unsigned char* rec) const {
    return reinterpret_cast<const int32_t*>(rec + origin_off())[1];
  }
  EPMOE_HOST_DEVICE void set_origin(unsigned char* rec, int32_t token, int32_t source) const {
    reinterpret_cast<int32_t*>(rec + origin_off())[0] = token;
    reinterpret_cast<int32_t*>(rec + origin_off())[1] = source;
  }
  EPMOE_HOST_DEVICE const float* weight(const unsigned char* rec) const {
    return reinterpret_cast<const float*>(rec + weight_off());
  }
  EPMOE_HOST_DEVICE float* weight(unsigned char* rec) const { return reinterpret_cast<float*>(rec + weight_off()); }
};

// The int32 and fp32 fields are 4-byte words after the row: aligned whenever the row's bytes are a
// multiple of 4 (fp32 rows always; the GPU backends assert rows of a multiple of 16 bytes).
static_assert(sizeof(int32_t) == 4 && sizeof(float) == 4, "record fields are 4-byte words");

}  // namespace epmoe
