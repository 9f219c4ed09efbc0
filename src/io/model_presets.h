// The config.json of real models whose shapes benchmarks and `epmoe synth` reproduce without
// their weights, as published on the Hugging Face hub: qwen3-30b-a3b, qwen3-235b-a22b,
// qwen3-30b-a3b-fp8, deepseek-v2-lite, deepseek-v3 (FP8) and glm-4.7-flash.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace epmoe {

// The config of preset `name`, or nothing for an unknown name.
std::optional<nlohmann::json> model_preset(const std::string& name);

}  // namespace epmoe
