// One naming rule for devices (tensor/device.h): the names --device accepts, the ones messages and
// JSON print, and the parser are the same list, so a device added to the enum is spelled once.
#include <gtest/gtest.h>

#include "tensor/device.h"
#include "util/error.h"

namespace epmoe {
namespace {

TEST(DeviceNames, EveryDeviceRoundTripsThroughItsName) {
  const std::vector<Device> devices = all_devices();
  const std::vector<std::string> names = device_names();
  ASSERT_EQ(names.size(), devices.size());
  for (size_t i = 0; i < devices.size(); i++) {
    EXPECT_EQ(names[i], device_name(devices[i]));
    EXPECT_EQ(parse_device(names[i], "--device"), devices[i]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cpu", "cuda"}));  // the spelling users and scripts rely on
}

TEST(DeviceNames, AnUnknownNameIsRefusedNamingTheFlagAndTheChoices) {
  try {
    parse_device("gpu", "--device");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--device 'gpu': unknown device (choose cpu or cuda)");
  }
}

}  // namespace
}  // namespace epmoe
