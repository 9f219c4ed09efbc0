// Where a run's tensors live. One enum for the whole runtime: the engine picks the device once,
// and the layers below receive it as data (the backend registry, the model factory, the buffers).
#pragma once

#include <string>
#include <vector>

namespace epmoe {

enum class Device { Cpu, Cuda };

// "cpu" | "cuda": the spelling of --device.
const char* device_name(Device d);
// InputError naming `what` (a flag) on anything else.
Device parse_device(const std::string& name, const std::string& what);
// Every device, in the order docs and messages list them.
std::vector<Device> all_devices();
// Their names, in that order: what --device accepts (the CLI's choices) and messages list.
std::vector<std::string> device_names();
// Whether this build can run on d (cuda: built with -DEPMOE_CUDA=ON).
bool device_compiled(Device d);

}  // namespace epmoe
