// Communicator: the only way the model talks to other ranks.
// LocalComm (one rank, no-ops), MpiComm (host memory, OpenMPI), NcclComm (device memory).
// Buffers are Views; a host communicator requires Device::kCpu views, a device one kCuda.
// Every call that can wait on a peer is bounded by the communicator's timeout and throws an
// Error naming the peer that did not answer: never a hang.
#pragma once

#include "base/view.h"

#include <memory>
#include <string>

namespace lattice {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string name() const = 0;

    // In-place sum across the group (f32, f16, bf16, i32).
    virtual void all_reduce_sum(const View& inout) = 0;
    // out = concat over ranks of in (rank order); out.numel() == size() * in.numel().
    virtual void all_gather(const View& out, const View& in) = 0;
    // out = this rank's slice of the sum over ranks of in; in.numel() == size() * out.numel().
    virtual void reduce_scatter_sum(const View& out, const View& in) = 0;
    virtual void broadcast(const View& inout, int root) = 0;
    virtual void send(const View& in, int peer) = 0;
    virtual void recv(const View& out, int peer) = 0;
    virtual void barrier() = 0;
    // Waits, bounded by the timeout, until every call made so far has completed. Host communicators
    // complete each call before it returns (a no-op); a device one may queue its calls on a stream
    // without a host wait (NcclComm's deferred mode), and then this is where a dead peer is found.
    virtual void wait_idle() {}
    // Seconds send() has waited for a receiver so far: for room in a full send queue, or for the
    // match of a synchronous send (MpiComm); 0 for communicators whose sends never wait on one.
    virtual double send_wait_seconds() const { return 0; }
    // The deadline of each later call, in seconds (a no-op where nothing waits: LocalComm).
    virtual void set_timeout(double seconds) { (void)seconds; }
};

// One rank: every collective is the identity; send/recv are errors.
class LocalComm final : public Communicator {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "local"; }
    void all_reduce_sum(const View&) override {}
    void all_gather(const View& out, const View& in) override;
    void reduce_scatter_sum(const View& out, const View& in) override;
    void broadcast(const View&, int root) override {
        LATTICE_CHECK(root == 0, "LocalComm::broadcast: root {} of a 1-rank group", root);
    }
    void send(const View&, int peer) override { LATTICE_FAIL("LocalComm::send to rank {}: no peers", peer); }
    void recv(const View&, int peer) override { LATTICE_FAIL("LocalComm::recv from rank {}: no peers", peer); }
    void barrier() override {}
};

}  // namespace lattice
