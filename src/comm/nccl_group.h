// The group over NCCL (comm/group.h): one process per GPU, started either by mpirun (rank, size
// and the local rank's GPU from MPI; rank 0's NCCL unique id reaches the others through MPI, so
// the ranks may span hosts) or, on one host without MPI, by scripts/gpu-launch.sh with EPMOE_RANK,
// EPMOE_WORLD_SIZE and EPMOE_NCCL_ID_FILE (rank 0 writes the NCCL unique id there). A group of one
// never initialises NCCL.
//
// Every collective runs on the process's stream (kernels/cuda/device.h) and is waited for with
// sync(): host values go through the device. A wait longer than the timeout aborts the group with a
// message that names this rank, the operation and the peers at fault. Those are found through a
// side channel of small files next to the NCCL id file, `<id file>.rank<r>.status` (under mpirun:
// `$TMPDIR/epmoe-nccl-<run>.rank<r>.status`, each host's own): a rank that has waited more than
// 50 ms rewrites its own every 100 ms (operation count, operation, time); a rank whose wait times
// out reads its peers': a missing or stale file (not rewritten for 2 s) means a peer that is not
// waiting -- dead, hung, or stuck outside communication; a fresh one in
// another operation says where that peer waits. Nothing is written while waits complete quickly.
//
// No CUDA or NCCL types here: the backend registry (a .cc) includes this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace epmoe {

class NcclGroup final : public Group {
 public:
  // The process-wide group (selects this process's GPU: init_device(rank)). Created on first use.
  // The process's group, made on first use. `timeout_s` (> 0) is the deadline of every wait,
  // the group's creation included; otherwise EPMOE_COMM_TIMEOUT, else 60 s.
  static NcclGroup& world(double timeout_s = 0);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  double timeout() const override { return timeout_s_; }
  void set_idle_waits(bool on) override { idle_waits_ = on; }
  const char* transport() const override { return "NCCL"; }

  void barrier() override;
  void allgather(const void* send, size_t bytes, void* recv) override;
  // Moves every rank's bytes padded to the largest count (one ncclAllGather), then packs them.
  void allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) override;
  int64_t allreduce_max(int64_t v) override;
  int64_t allreduce_sum(int64_t v) override;
  double allreduce_max_f64(double v) override;
  // Every rank's value gathered and summed in rank order: the same bits everywhere.
  double allreduce_sum_f64(double v) override;

  void wait_device(const char* what) override { sync(what); }
  [[noreturn]] void abort_group(const std::string& message, int exit_code) override;

  uint64_t bytes_sent() const override { return bytes_sent_; }
  void add_bytes_sent(uint64_t n) override { bytes_sent_ += n; }

  // The ncclComm_t of the group (nullptr in a group of one), for the NCCL backends.
  void* nccl_comm() const { return comm_; }
  // Waits for the process's stream under the group's timeout; on an NCCL error or when the timeout
  // passes, aborts the group (see above). `what` names the operation in messages.
  void sync(const char* what);

  // Operations (waits) this rank has entered so far.
  uint64_t operations() const { return ops_; }

  // The word a device-side wait reports a silent peer in (the one-sided backends spin on flags
  // that peers write over NVLink; no NCCL call is there to time out). Page-locked, mapped: the
  // device pointer is for kernels, which write {1, peer, stage} when a wait passes the group's
  // timeout and then stop waiting; sync() reads it and aborts the group naming the peer. Stages:
  // peer_fault_stage_name().
  int32_t* device_peer_fault();
  static const char* peer_fault_stage_name(int stage);

 private:
  explicit NcclGroup(double timeout_s);
  // Rewrites this rank's status file: waiting in operation ops_ (`what`).
  void write_status(const char* what) const;
  // After a timeout: what each peer's status file says, as one clause of the abort message.
  std::string diagnose_peers() const;
  // Device scratch and page-locked host staging of the host-value collectives (grow-only).
  unsigned char* scratch(size_t bytes);
  unsigned char* staging(size_t bytes);
  // One int64 or double through ncclAllReduce (op, type: NCCL enums).
  void allreduce_one(void* value, int op, int type, const char* what);

  int rank_ = 0, size_ = 1;
  void* comm_ = nullptr;
  double timeout_s_ = 60.0;
  bool idle_waits_ = false;  // set_idle_waits
  uint64_t bytes_sent_ = 0;
  uint64_t ops_ = 0;
  std::string status_base_;  // "<id file>.rank" (empty in a group of one)
  struct Buffers;  // a DeviceArray and a PinnedArray (kernels/cuda/common.cuh): no CUDA types here
  std::unique_ptr<Buffers> buffers_;
  int32_t* peer_fault_host_ = nullptr;  // [4], mapped (device_peer_fault)
  int32_t* peer_fault_dev_ = nullptr;
};

}  // namespace epmoe
