// One 64-bit mixer for host and device code: the replica that serves a (token, slot) is chosen
// with it on the CPU (Placement::choose) and inside the GPU router (moe/cuda/routing.cu), and the
// two must agree bit for bit. Also the counter-based generator of synthesized weights.
#pragma once

#include <cstdint>

#include "util/host_device.h"

namespace epmoe {

// splitmix64 (Steele, Lea, Flood 2014): a bijection of 64-bit values with full avalanche.
EPMOE_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Which of a logical expert's n replicas serves slot `slot` of the token with global id
// `token_gid`: a pure function of the token and the slot, never of the rank.
EPMOE_HOST_DEVICE inline uint64_t replica_index(uint64_t token_gid, int slot, uint64_t n) {
  return splitmix64(token_gid * 64 + uint64_t(slot)) % n;
}

}  // namespace epmoe
