// The config.json of real models whose shapes benchmarks and `epmoe synth` reproduce without
// their weights: qwen3-30b-a3b and qwen3-235b-a22b, as published on the Hugging Face hub.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace epmoe {

// The config of preset `name`, or nothing for an unknown name.
std::optional<nlohmann::json> model_preset(const std::string& name);

}  // namespace epmoe
