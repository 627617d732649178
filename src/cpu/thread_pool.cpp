#include "src/cpu/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashmsa::cpu {
namespace {

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()); }

  void run(std::int64_t n, const std::function<void(std::int64_t)>& task, int helpers) {
    std::unique_lock lock(run_mutex_);  // one parallel_for at a time; nested calls run inline
    Job job{&task, n};
    {
      std::lock_guard guard(mutex_);
      job_ = &job;
      helpers_wanted_ = helpers;
      ++generation_;
    }
    wake_.notify_all();
    job.drain();
    {
      std::unique_lock guard(mutex_);
      job_ = nullptr;  // no new helper may join
      done_.wait(guard, [&] { return job.active == 0; });
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    const std::function<void(std::int64_t)>* task;
    std::int64_t n;
    std::atomic<std::int64_t> next{0};
    int active = 0;  // helpers inside drain(), guarded by Pool::mutex_
    std::exception_ptr error;
    std::mutex error_mutex;

    void drain() {
      for (std::int64_t i; (i = next.fetch_add(1)) < n;) {
        try {
          (*task)(i);
        } catch (...) {
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    }
  };

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      Job* job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock,
                   [&] { return stop_ || (generation_ != seen && job_ && helpers_wanted_ > 0); });
        if (stop_) return;
        seen = generation_;
        job = job_;
        --helpers_wanted_;
        ++job->active;
      }
      job->drain();
      {
        std::lock_guard lock(mutex_);
        --job->active;
      }
      done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  int helpers_wanted_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

thread_local bool inside_task = false;

}  // namespace

int hardware_threads() noexcept {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int worker_threads(int max_threads) noexcept {
  return max_threads > 0 ? std::min(max_threads, hardware_threads()) : hardware_threads();
}

void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& task, int max_threads) {
  if (n <= 0) return;
  static Pool pool(hardware_threads() - 1);
  const int threads = worker_threads(max_threads);
  if (threads == 1 || n == 1 || inside_task || pool.size() == 0) {
    for (std::int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  // Tasks that call parallel_for again run their inner loop inline.
  const std::function<void(std::int64_t)> marked = [&](std::int64_t i) {
    struct Mark {
      Mark() { inside_task = true; }
      ~Mark() { inside_task = false; }
    } mark;
    task(i);
  };
  pool.run(n, marked, static_cast<int>(std::min<std::int64_t>(threads - 1, n - 1)));
}

}  // namespace flashmsa::cpu
