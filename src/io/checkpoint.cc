#include "io/checkpoint.h"

#include "io/json_util.h"
#include "util/error.h"

namespace epmoe {

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  if (file_exists(index_path)) {
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
      if (fname.find('/') != std::string::npos)
        throw InputError(index_path + ": shard name '" + fname + "' must be a plain file name");
      auto it = shard_index.find(fname);
      if (it == shard_index.end()) {
        const std::string path = dir + "/" + fname;
        if (!file_exists(path))
          throw InputError(index_path + ": shard '" + fname + "' (listed for tensor '" + name + "') is missing");
        files_.push_back(std::make_unique<SafetensorsFile>(path));
        it = shard_index.emplace(fname, files_.size() - 1).first;
      }
      if (!files_[it->second]->contains(name))
        throw InputError(files_[it->second]->path() + ": lacks tensor '" + name + "' that " + index_path +
                         " lists in it");
      where_[name] = it->second;
    }
  } else if (file_exists(single_path)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path));
    for (auto& n : files_[0]->names()) where_[n] = 0;
  } else {
    throw InputError(dir + ": no model.safetensors or model.safetensors.index.json");
  }
}

std::optional<TensorView> Checkpoint::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return std::nullopt;
  return files_[it->second]->get(name);
}

TensorView Checkpoint::get(const std::string& name) const {
  auto v = find(name);
  if (!v) {
    std::string searched;
    for (auto& f : files_) searched += (searched.empty() ? "" : ", ") + f->path();
    throw InputError("tensor '" + name + "' not found in checkpoint " + dir_ + " (searched " + searched + ")");
  }
  return *v;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, i] : where_) out.push_back(n);
  return out;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (auto& f : files_) out.push_back(f->path());
  return out;
}

}  // namespace epmoe
