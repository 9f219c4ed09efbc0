#include "io/checkpoint.h"

#include "io/json_util.h"
#include "util/error.h"

namespace epmoe {

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  if (file_exists(index_path)) {
    index_path_ = index_path;
    const std::string text = read_text_file(index_path);
    nlohmann::json index = parse_json_text(index_path, text);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw InputError(index_path + ": missing object 'weight_map'");
    std::string dup = find_duplicate_key(text, "weight_map");
    if (!dup.empty()) throw InputError(index_path + ": tensor '" + dup + "' is listed twice in weight_map");
    std::map<std::string, size_t> shard_index;
    for (auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) throw InputError(index_path + ": weight_map['" + name + "'] is not a file name");
      const std::string fname = shard.get<std::string>();
      if (fname.empty() || fname.find('/') != std::string::npos)
        throw InputError(index_path + ": shard name '" + fname + "' (for tensor '" + name +
                         "') must be a plain file name");
      auto it = shard_index.find(fname);
      if (it == shard_index.end()) {
        shards_.push_back({dir + "/" + fname, name, nullptr});
        it = shard_index.emplace(fname, shards_.size() - 1).first;
      }
      where_[name] = it->second;
    }
    if (shards_.empty()) throw InputError(index_path + ": weight_map lists no tensor");
  } else if (file_exists(single_path)) {
    shards_.push_back({single_path, "", nullptr});
    for (auto& n : open(0).names()) where_[n] = 0;
  } else {
    throw InputError(dir + ": no model.safetensors or model.safetensors.index.json");
  }
}

const SafetensorsFile& Checkpoint::open(size_t i) const {
  std::lock_guard<std::mutex> lock(open_mutex_);
  Shard& s = shards_[i];
  if (s.file) return *s.file;
  if (!index_path_.empty()) {
    if (!file_exists(s.path))
      throw InputError(index_path_ + ": shard '" + s.path.substr(dir_.size() + 1) + "' (listed for tensor '" +
                       s.first_tensor + "') is missing");
  }
  auto file = std::make_unique<SafetensorsFile>(s.path);
  // Every tensor the index places in this shard must be there; checked once, when it opens.
  for (auto& [name, shard] : where_)
    if (shard == i && !file->contains(name))
      throw InputError(s.path + ": lacks tensor '" + name + "' that " + index_path_ + " lists in it");
  s.file = std::move(file);
  return *s.file;
}

std::optional<TensorView> Checkpoint::find(const std::string& name) const {
  if (auto o = overlay_.find(name); o != overlay_.end()) return o->second;
  auto it = where_.find(name);
  if (it == where_.end()) return std::nullopt;
  return open(it->second).get(name);
}

TensorView Checkpoint::get(const std::string& name) const {
  auto v = find(name);
  if (!v) {
    std::string searched;
    for (auto& f : files()) searched += (searched.empty() ? "" : ", ") + f;
    throw InputError("tensor '" + name + "' not found in checkpoint " + dir_ + " (searched " + searched + ")");
  }
  return *v;
}

void Checkpoint::check_like(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw InputError("tensor '" + name + "' is not a tensor of the loaded model (" + dir_ + ")");
  const TensorView have = open(it->second).get(name);
  if (have.dtype != dtype || have.shape != shape) {
    TensorView got;
    got.dtype = dtype, got.shape = shape;
    throw InputError("tensor '" + name + "' is " + std::string(dtype_name(dtype)) + " " + got.shape_str() +
                     ", the loaded model's is " + std::string(dtype_name(have.dtype)) + " " + have.shape_str());
  }
}

void Checkpoint::overlay(std::map<std::string, TensorView> views, std::shared_ptr<const void> owner) {
  for (auto& [name, v] : views) check_like(name, v.dtype, v.shape);
  overlay_ = std::move(views);
  overlay_owner_ = std::move(owner);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, i] : where_) out.push_back(n);
  return out;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (auto& s : shards_) out.push_back(s.path);
  return out;
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : shards_[it->second].path;
}

}  // namespace epmoe
