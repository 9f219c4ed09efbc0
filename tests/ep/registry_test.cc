// The one registry (src/ep/registry.cc) and the backend traits: which names exist on which device,
// and that an unsupported (backend, device) pair or an option a device lacks is refused as bad
// input, naming the devices that do support it -- before any group, weight or GPU is touched (so
// these run on a CPU-only build too).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "ep/traits.h"
#include "util/error.h"

namespace epmoe {
namespace {

std::string refusal(const std::string& name, Device device, const BackendOptions& opt = {}) {
  const Placement p = Placement::make_default(8, 1, 0);
  try {
    make_backend(name, device, MpiGroup::world(), p, opt);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, NamesPerDeviceFollowTheTraits) {
  EXPECT_EQ(backend_names(), (std::vector<std::string>{"none", "alltoall", "lowlatency", "onesided", "fused"}));
  EXPECT_EQ(backend_names(Device::Cpu), backend_names());
  EXPECT_EQ(backend_names(Device::Cuda), backend_names());
  for (BackendKind k : all_backend_kinds()) {
    const BackendTraits t = traits_of(k);
    EXPECT_TRUE(supports(t, Device::Cpu)) << t.name;
    EXPECT_EQ(mechanism_on(t, Device::Cuda).empty(), !supports(t, Device::Cuda)) << t.name;
  }
}

TEST(Registry, EveryBackendSaysHowItWorksOnEveryDevice) {
  // Every backend exists on both devices now; the refusal of an unsupported pair stays in the
  // registry for the next device, and --help prints each mechanism.
  for (BackendKind k : all_backend_kinds())
    for (Device d : all_devices()) EXPECT_GT(mechanism_on(traits_of(k), d).size(), 20u) << traits_of(k).name;
}

TEST(Registry, UnknownNameListsEveryBackend) {
  for (Device d : all_devices()) {
    const std::string e = refusal("mori", d);
    EXPECT_NE(e.find("unknown backend"), std::string::npos) << e;
    EXPECT_NE(e.find("none, alltoall, lowlatency, onesided, fused"), std::string::npos) << e;
  }
}

TEST(Registry, OptionsTheGpuLacksAreRefusedNamingTheDevice) {
  // The fast combine exists on GPUs in alltoall and onesided; the others refuse it, naming them.
  BackendOptions fast;
  fast.combine = CombineMode::Fast;
  for (const std::string name : {"none", "lowlatency"}) {
    const std::string e = refusal(name, Device::Cuda, fast);
    EXPECT_NE(e.find("--combine fast with --moe-a2a-backend " + name), std::string::npos) << e;
    EXPECT_NE(e.find("implemented by alltoall and onesided"), std::string::npos) << e;
  }
  for (const std::string name : {"alltoall", "onesided"})
    EXPECT_EQ(refusal(name, Device::Cuda, fast).find("--combine fast"), std::string::npos) << name;
  // Every injected fault class exists on GPUs: none is refused as an option.
  for (Fault f : {Fault::DoubleReduce, Fault::SkipReduce, Fault::ReplicaPerRank, Fault::WrongCombineIds,
                  Fault::DropOverflow}) {
    BackendOptions o;
    o.fault = f;
    EXPECT_EQ(refusal("none", Device::Cuda, o).find("--inject"), std::string::npos) << fault_name(f);
  }
}

TEST(Registry, GroupOfOneIsTheLocalPathOnTheCpu) {
  // Without mpirun the group has one rank and MPI is never started: every name is the local path.
  const Placement p = Placement::make_default(8, 1, 0);
  for (const std::string& name : backend_names(Device::Cpu)) {
    auto be = make_backend(name, Device::Cpu, MpiGroup::world(), p, {});
    EXPECT_EQ(be->name(), "local") << name;
    EXPECT_EQ(be->device(), Device::Cpu) << name;
  }
}

}  // namespace
}  // namespace epmoe
