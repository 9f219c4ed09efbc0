#include "tensor/device.h"

#include "util/error.h"

namespace epmoe {

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

std::vector<Device> all_devices() { return {Device::Cpu, Device::Cuda}; }

std::vector<std::string> device_names() {
  std::vector<std::string> names;
  for (Device d : all_devices()) names.emplace_back(device_name(d));
  return names;
}

Device parse_device(const std::string& name, const std::string& what) {
  for (Device d : all_devices())
    if (name == device_name(d)) return d;
  std::string choices;
  for (const std::string& n : device_names()) choices += (choices.empty() ? "" : " or ") + n;
  throw InputError(what + " '" + name + "': unknown device (choose " + choices + ")");
}

bool device_compiled(Device d) {
  switch (d) {
    case Device::Cpu: return true;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      return true;
#else
      return false;
#endif
  }
  return false;
}

}  // namespace epmoe
