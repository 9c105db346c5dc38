// Test helpers for the engine's parts without MPI: FakeComm, ranks of one process exchanging messages
// through shared in-memory queues (a send copies its bytes and returns, as MpiComm's buffered plan
// sends do; a receive takes the oldest message from that peer and checks its size), and FakeRunner, a
// ModelRunner that records each plan (and the sequences it releases) and answers the sampled sequences with a token that depends only
// on the sequence and its position.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "parallel/communicator.h"
#include "runtime/engine/model_runner.h"

namespace lattice::testing {

struct Mailboxes {
    std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> queues;  // (from, to) -> messages
    size_t pending(int from, int to) { return queues[{from, to}].size(); }
};

class FakeComm final : public Communicator {
public:
    FakeComm(std::shared_ptr<Mailboxes> boxes, int rank, int size) : boxes_(std::move(boxes)), rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return "fake"; }
    void all_reduce_sum(const View&) override { LATTICE_FAIL("fake communicator: no all_reduce"); }
    void all_gather(const View&, const View&) override { LATTICE_FAIL("fake communicator: no all_gather"); }
    void reduce_scatter_sum(const View&, const View&) override { LATTICE_FAIL("fake communicator: no reduce_scatter"); }
    void broadcast(const View&, int) override { LATTICE_FAIL("fake communicator: no broadcast"); }
    void barrier() override {}
    void send(const View& in, int peer) override {
        const auto* p = static_cast<const uint8_t*>(in.data);
        boxes_->queues[{rank_, peer}].emplace_back(p, p + in.bytes());
    }
    void recv(const View& out, int peer) override {
        auto& q = boxes_->queues[{peer, rank_}];
        LATTICE_CHECK(!q.empty(), "fake communicator: rank {} receives from {} but nothing was sent", rank_, peer);
        LATTICE_CHECK(int64_t(q.front().size()) == out.bytes(), "fake communicator: a message of {} bytes for {}",
                      q.front().size(), out.bytes());
        std::memcpy(out.data, q.front().data(), q.front().size());
        q.pop_front();
    }

private:
    std::shared_ptr<Mailboxes> boxes_;
    int rank_, size_;
};

// The token FakeRunner samples for sequence `seq` at position `pos` (never 0: tests use 0 as eos).
inline int32_t fake_token(int64_t seq, int64_t pos) {
    return int32_t(1 + (seq * 31 + pos * 7) % 50);
}

class FakeRunner final : public ModelRunner {
public:
    explicit FakeRunner(bool samples = true) : samples_(samples) {}
    void execute(const StepPlan& p, StepResults* out) override {
        plans.push_back(p);
        released.insert(released.end(), p.released.begin(), p.released.end());  // (as the sampler rank drops them)
        if (!samples_) return;
        if (p.kind == StepPlan::Kind::kScore) {
            out->logits.assign(p.tokens.size() * 4, float(p.number));
            return;
        }
        out->tokens.clear();
        for (const PlanSeq& ps : p.seqs) {
            if (!ps.sample) continue;
            out->tokens.push_back(SampledToken{fake_token(ps.id, ps.start + ps.count - ps.n_draft), -0.5f});
            out->tokens.insert(out->tokens.end(), size_t(ps.n_draft), SampledToken{-1, 0.0f});
            out->top.insert(out->top.end(), size_t(ps.sampling.logprobs), SampledToken{3, -1.0f});
        }
    }
    void release(std::span<const int64_t> ids) override { released.insert(released.end(), ids.begin(), ids.end()); }
    int64_t reserved_blocks() const override { return 0; }

    std::vector<StepPlan> plans;    // every plan executed, in order
    std::vector<int64_t> released;  // every sequence released

private:
    bool samples_;
};

}  // namespace lattice::testing
