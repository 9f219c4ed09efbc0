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

Device parse_device(const std::string& name, const std::string& what) {
  for (Device d : all_devices())
    if (name == device_name(d)) return d;
  throw InputError(what + " '" + name + "': unknown device (choose cpu or cuda)");
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
