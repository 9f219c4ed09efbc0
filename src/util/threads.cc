#include "util/threads.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

namespace epmoe {

namespace {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_local bool t_inside_pool = false;  // nested parallel_for runs inline (the pool is not reentrant)

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 1; i < n; i++) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int tasks, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> lk(mu_);
    task_ = &task;
    tasks_ = tasks;
    next_ = 0;
    done_ = 0;
    error_ = nullptr;
    generation_++;
    lk.unlock();
    cv_.notify_all();
    work();
    lk.lock();
    done_cv_.wait(lk, [&] { return done_ == tasks_; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      int i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!task_ || next_ >= tasks_) return;
        i = next_++;
      }
      try {
        t_inside_pool = true;
        (*task_)(i);
        t_inside_pool = false;
      } catch (...) {
        t_inside_pool = false;
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (++done_ == tasks_) done_cv_.notify_all();
    }
  }
  void loop(int) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int tasks_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

int g_threads = 0;
Pool* g_pool = nullptr;
std::mutex g_pool_mu;

Pool& pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) g_pool = new Pool(g_threads > 0 ? g_threads : available_cores());  // lives until exit
  return *g_pool;
}

}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_threads = n;
  delete g_pool;
  g_pool = nullptr;
}

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t min_per_task, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (t_inside_pool) {
    fn(0, n);
    return;
  }
  Pool& p = pool();
  int64_t tasks = std::min<int64_t>(p.size() * 4, n / std::max<int64_t>(1, min_per_task));
  if (tasks <= 1 || p.size() == 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + tasks - 1) / tasks;
  tasks = (n + chunk - 1) / chunk;
  std::function<void(int)> task = [&](int i) { fn(i * chunk, std::min(n, (i + 1) * chunk)); };
  p.run(int(tasks), task);
}

}  // namespace epmoe
