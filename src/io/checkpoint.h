// A Hugging Face checkpoint folder: one model.safetensors, or shards listed in
// model.safetensors.index.json. Tensors are looked up by name across shards.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace epmoe {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws InputError naming the tensor and the files searched.
  TensorView get(const std::string& name) const;
  std::optional<TensorView> find(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  std::vector<std::string> files() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

}  // namespace epmoe
