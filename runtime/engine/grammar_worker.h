// MaskWorker: the next token mask of every sequence with a grammar, computed on a helper thread off
// the engine step's critical path.
//
// Why: a mask is computed from the sequence's grammar state after its last token, and the scheduler
// used to compute it while building the step plan, so every sequence in the step waited for it. Most
// masks take microseconds (grammar.h), but near max_tokens the reserve's mask (fill_mask_within)
// searches for completions, and for a schema of hundreds of properties that is 10-200 ms per token
// (benchmarks/bench_grammar, "props"): a plain request beside it ran 15x slower. Measured, the cost
// is in that search, per state and per tokens-left, so a cache per state cannot bound it; the mask is
// therefore computed on this thread as soon as the token that fixes its state is accepted (Scheduler
// ::complete), overlapped with the next step, and the scheduler waits for it at most a small budget
// per step (Scheduler: kMaskWaitShare of the modelled step time): a sequence whose mask is not ready
// then sits that step out, and only it waits (vLLM computes its bitmasks beside the forward, xgrammar
// makes them cheap; this is the first half).
//
// Layout: one job per sequence, keyed by (sequence, generation = tokens generated so far): a copy of
// the matcher and the tokens left, the mask once done. request() queues it (replacing an older one of
// the sequence), ready() waits for it with a deadline, take() hands the mask over (waiting without
// bound, or computing it here when it was never requested). The thread starts with the first job and
// runs at a lower priority (nice kNice) so that on a machine with fewer cores than threads it takes
// what the forward leaves. hold() keeps the thread from starting jobs (tests: a mask that never
// finishes, to show that other sequences' steps do not wait for it).
// Invariants: a mask handed over is exactly mask_for(matcher, tokens_left) of that generation; the
// thread touches only its jobs' own matcher copies and the shared Grammar's DfaCache (its mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "runtime/engine/grammar.h"

namespace lattice {

// Tokens left, beyond the shortest completion's bytes (GrammarMatcher::distance(), at least its tokens),
// below which the mask keeps only tokens after which the grammar can still be completed in the tokens
// that remain (counted in this vocabulary's tokens: GrammarMatcher::min_remaining_tokens). Above it
// the plain mask: no single token lengthens the shortest completion by 256 tokens.
constexpr int64_t kFinishWindow = 256;

// The mask a sequence samples from with `tokens_left` tokens left to max_tokens.
void mask_for(const GrammarMatcher& m, int64_t tokens_left, std::span<uint32_t> words);

struct MaskWorkerStats {
    int64_t computed = 0;  // masks computed on the worker thread
    int64_t inline_ = 0;   // masks computed by take() on the caller's thread (never requested)
    int64_t waited = 0;    // take() / ready() calls that had to wait for the thread
    double wait_s = 0;     // ... and how long, in all
};

class MaskWorker {
public:
    static constexpr int kNice = 5;
    using Clock = std::chrono::steady_clock;

    MaskWorker() = default;
    ~MaskWorker();
    MaskWorker(const MaskWorker&) = delete;
    MaskWorker& operator=(const MaskWorker&) = delete;

    // Queues the mask of sequence `seq` at `generation` (m is copied).
    void request(int64_t seq, int64_t generation, const GrammarMatcher& m, int64_t tokens_left);
    // Whether take() would hand that mask over without waiting for the thread (done, or none requested:
    // take() computes it), waiting until `deadline` at most.
    bool ready(int64_t seq, int64_t generation, Clock::time_point deadline);
    // The mask into `words`: the job's (waiting for it) or, when none matches, computed here from m.
    void take(int64_t seq, int64_t generation, const GrammarMatcher& m, int64_t tokens_left,
              std::span<uint32_t> words);
    void forget(int64_t seq);  // the sequence ended: its job is dropped (a running one finishes unseen)
    void hold(bool on);        // tests: while on, the thread starts no job
    MaskWorkerStats stats() const;

private:
    struct Job {
        int64_t seq = 0, generation = 0, tokens_left = 0;
        std::unique_ptr<GrammarMatcher> matcher;
        std::vector<uint32_t> mask;
        bool done = false;
    };
    void run();
    // The job of (seq, generation) or null. Needs mu_.
    std::shared_ptr<Job> find(int64_t seq, int64_t generation) const;

    mutable std::mutex mu_;
    std::condition_variable work_cv_, done_cv_;
    std::map<int64_t, std::shared_ptr<Job>> jobs_;  // by sequence
    std::deque<std::shared_ptr<Job>> queue_;        // jobs not started (skipped once replaced or forgotten)
    bool hold_ = false, stop_ = false;
    std::thread thread_;
    MaskWorkerStats stats_;
};

}  // namespace lattice
