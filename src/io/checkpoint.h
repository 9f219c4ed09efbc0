// A Hugging Face checkpoint folder: one model.safetensors, or shards listed in
// model.safetensors.index.json. Tensors are looked up by name across shards.
//
// Shards are opened (mapped and validated) on first use, not when the index is read: a rank of an
// expert-parallel group touches only the shards that hold its weights, so a node may lack the
// shards of other ranks' experts, and a shard missing for one rank's experts fails only that rank
// (which then aborts the group, naming itself; docs/hostile-inputs.md).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace epmoe {

class Checkpoint {
 public:
  // Reads and validates the index (or finds model.safetensors); opens no shard yet.
  explicit Checkpoint(const std::string& dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws InputError naming the tensor and the files searched, or the shard at fault when the
  // shard holding it is missing or malformed.
  TensorView get(const std::string& name) const;
  std::optional<TensorView> find(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  // Every shard file, opened or not.
  std::vector<std::string> files() const;
  // The shard file that holds `name` ("" when no shard does).
  std::string file_of(const std::string& name) const;

  // Weights from elsewhere than the files (a trainer's update: serve's
  // /update_weights_from_safetensors): get() and find() return these views instead of the files'
  // for their names, whose bytes `owner` keeps alive. Every name must be a tensor of the checkpoint
  // with the same dtype and shape (InputError naming the first that is not); replaces an earlier
  // overlay. The files stay open for the names not overlaid.
  void overlay(std::map<std::string, TensorView> views, std::shared_ptr<const void> owner);
  // That check for one tensor: `name` is a tensor of the checkpoint with this dtype and shape.
  void check_like(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorView>& overlaid() const { return overlay_; }
  const std::shared_ptr<const void>& overlay_owner() const { return overlay_owner_; }

 private:
  struct Shard {
    std::string path;
    std::string first_tensor;                // a tensor the index lists in it, for messages
    std::unique_ptr<SafetensorsFile> file;   // null until first use
  };
  const SafetensorsFile& open(size_t shard) const;

  std::string dir_;
  std::string index_path_;  // "" for a single model.safetensors
  mutable std::mutex open_mutex_;  // loaders may look tensors up from several threads
  mutable std::vector<Shard> shards_;
  std::map<std::string, size_t> where_;  // tensor name -> index in shards_
  std::map<std::string, TensorView> overlay_;
  std::shared_ptr<const void> overlay_owner_;
};

}  // namespace epmoe
