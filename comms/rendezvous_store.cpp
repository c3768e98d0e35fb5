#include "comms/rendezvous_store.hpp"
#include <dpactor/error.hpp>

#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace dpactor {
namespace {

class memory_store final : public rendezvous_store {
 public:
  explicit memory_store(std::function<void(const std::string&)> on_set) : on_set_(std::move(on_set)) {}

  void set(const std::string& key, const std::vector<char>& value) override {
    {
      std::lock_guard lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
    if (on_set_) on_set_(key);
  }

  std::optional<std::vector<char>> get(const std::string& key, clock::time_point until) override {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_until(lock, until, [&] { return values_.contains(key); })) return std::nullopt;
    return values_.at(key);
  }

  void erase_prefix(const std::string& prefix) override {
    std::lock_guard lock(mutex_);
    for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.starts_with(prefix);)
      it = values_.erase(it);
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
  std::function<void(const std::string&)> on_set_;
};

// How often a directory store looks for a key it waits for.
constexpr std::chrono::milliseconds directory_poll_interval{2};

class directory_store final : public rendezvous_store {
 public:
  explicit directory_store(std::filesystem::path directory) : directory_(std::move(directory)) {
    std::error_code ec;
    std::filesystem::create_directories(directory_, ec);
    if (ec) throw error(error_kind::internal, "rendezvous store: cannot create " + directory_.string() + ": " + ec.message());
  }

  void set(const std::string& key, const std::vector<char>& value) override {
    const auto path = file_of(key);
    const auto temporary = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) throw error(error_kind::internal, "rendezvous store: cannot write " + temporary);
    }
    std::error_code ec;
    std::filesystem::rename(temporary, path, ec);
    if (ec) throw error(error_kind::internal, "rendezvous store: cannot rename " + temporary + ": " + ec.message());
  }

  std::optional<std::vector<char>> get(const std::string& key, clock::time_point until) override {
    const auto path = file_of(key);
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      if (in) return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::min<clock::duration>(directory_poll_interval, until - clock::now()));
    }
  }

  void erase_prefix(const std::string& prefix) override {
    const std::string escaped = "key-" + escape(prefix);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(directory_, ec))
      if (entry.path().filename().string().starts_with(escaped)) std::filesystem::remove(entry.path(), ec);
  }

 private:
  // '/' and '%' escaped, so every key is one file name in the directory.
  static std::string escape(const std::string& key) {
    std::string name;
    for (const char c : key) {
      if (c == '/') name += "%2F";
      else if (c == '%') name += "%25";
      else name += c;
    }
    return name;
  }
  std::filesystem::path file_of(const std::string& key) const { return directory_ / ("key-" + escape(key)); }

  std::filesystem::path directory_;
};

}  // namespace

std::shared_ptr<rendezvous_store> make_memory_store(std::function<void(const std::string& key)> on_set) {
  return std::make_shared<memory_store>(std::move(on_set));
}

std::shared_ptr<rendezvous_store> make_directory_store(const std::filesystem::path& directory) {
  return std::make_shared<directory_store>(directory);
}

}  // namespace dpactor
