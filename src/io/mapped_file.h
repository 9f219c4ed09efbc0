// A read-only memory map of a whole file. Weights are used in place from the map; pages of
// experts a rank does not own are never touched, so they are never read from disk.
#pragma once

#include <cstddef>
#include <string>

namespace epmoe {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws InputError naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace epmoe
