// MaskWorker (see grammar_worker.h).
#include "runtime/engine/grammar_worker.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace lattice {

void mask_for(const GrammarMatcher& m, int64_t tokens_left, std::span<uint32_t> words) {
    // Near max_tokens, only tokens after which the output can still end well-formed within the tokens
    // left: it does whenever max_tokens was at least the shortest document. "Near" counts from the
    // shortest completion (in bytes: never fewer than its tokens), so a document longer than the
    // window is still reserved for in time.
    if (tokens_left <= kFinishWindow || tokens_left - kFinishWindow <= int64_t(m.distance()))
        m.fill_mask_within(words, tokens_left);
    else
        m.fill_mask(words);
}

MaskWorker::~MaskWorker() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void MaskWorker::request(int64_t seq, int64_t generation, const GrammarMatcher& m, int64_t tokens_left) {
    auto job = std::make_shared<Job>();
    job->seq = seq;
    job->generation = generation;
    job->tokens_left = tokens_left;
    job->matcher = std::make_unique<GrammarMatcher>(m);
    {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_[seq] = job;
        queue_.push_back(std::move(job));
        if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    work_cv_.notify_one();
}

std::shared_ptr<MaskWorker::Job> MaskWorker::find(int64_t seq, int64_t generation) const {
    const auto it = jobs_.find(seq);
    return it != jobs_.end() && it->second->generation == generation ? it->second : nullptr;
}

bool MaskWorker::ready(int64_t seq, int64_t generation, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    const std::shared_ptr<Job> job = find(seq, generation);
    if (!job) return true;  // take() computes it (nothing to wait for)
    if (job->done) return true;
    const auto t0 = Clock::now();
    if (deadline == Clock::time_point::max())  // (no deadline arithmetic near the clock's end)
        done_cv_.wait(lock, [&] { return job->done; });
    else
        done_cv_.wait_until(lock, deadline, [&] { return job->done; });
    ++stats_.waited;
    stats_.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
    return job->done;
}

void MaskWorker::take(int64_t seq, int64_t generation, const GrammarMatcher& m, int64_t tokens_left,
                      std::span<uint32_t> words) {
    std::unique_lock<std::mutex> lock(mu_);
    const std::shared_ptr<Job> job = find(seq, generation);
    if (!job || job->tokens_left != tokens_left) {
        ++stats_.inline_;
        lock.unlock();
        mask_for(m, tokens_left, words);
        return;
    }
    if (!job->done) {
        const auto t0 = Clock::now();
        done_cv_.wait(lock, [&] { return job->done; });
        ++stats_.waited;
        stats_.wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::copy(job->mask.begin(), job->mask.end(), words.begin());
}

void MaskWorker::forget(int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(seq);
}

void MaskWorker::hold(bool on) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        hold_ = on;
    }
    work_cv_.notify_all();
}

MaskWorkerStats MaskWorker::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void MaskWorker::run() {
    // Lower this thread's priority only (Linux: a thread is a task); failing that it runs as it is.
    setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), kNice);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || (!hold_ && !queue_.empty()); });
        if (stop_) return;
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        const auto it = jobs_.find(job->seq);
        if (it == jobs_.end() || it->second != job) continue;  // replaced or forgotten
        lock.unlock();
        std::vector<uint32_t> mask(size_t((job->matcher->vocab().size() + 31) / 32));
        mask_for(*job->matcher, job->tokens_left, mask);
        lock.lock();
        job->mask = std::move(mask);
        job->done = true;
        ++stats_.computed;
        done_cv_.notify_all();
    }
}

}  // namespace lattice
