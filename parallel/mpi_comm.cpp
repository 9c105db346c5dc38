// MpiComm: non-blocking MPI calls completed under a deadline, with peer diagnosis on timeout
// (see mpi_comm.h and watchdog.h).
#include "parallel/mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

#include "base/log.h"
#include "parallel/mpi_comm_internal.h"

namespace lattice {

namespace mpi_detail {

std::string join_ints(const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) s += ',';
        s += std::to_string(v[i]);
    }
    return s;
}

// Completes a request of communicator setup by setup_deadline(policy) (wait_policy.h); `step` ("" or
// ": what") names the part of the setup in the error.
void wait_setup(MPI_Request* req, const WaitPolicy& policy, const std::string& what, const std::string& step) {
    WaitPolicy setup = policy;
    setup.timeout_s = setup_deadline(policy);
    int rc = MPI_SUCCESS;
    const WaitResult r = poll_request(req, MPI_STATUS_IGNORE, setup, &rc);
    LATTICE_CHECK(r != WaitResult::kTimedOut,
                  "creating communicator '{}'{}: not every rank arrived within {} s (a rank is missing or calls a "
                  "different collective)",
                  what, step, setup.timeout_s);
    LATTICE_CHECK(r == WaitResult::kDone, "creating communicator '{}'{} failed: {}", what, step, mpi_error_string(rc));
}

}  // namespace mpi_detail

using mpi_detail::join_ints;
using mpi_detail::wait_setup;

namespace {

constexpr int kDataTag = 1;

int checked_count(int64_t n, const std::string& comm, const char* op) {
    LATTICE_CHECK(n >= 0 && n <= INT_MAX,
                  "{} on '{}': {} elements/bytes exceed MPI's int count limit; split the message", op, comm, n);
    return int(n);
}

bool overlaps(const View& a, const View& b) {
    auto* pa = static_cast<const char*>(a.data);
    auto* pb = static_cast<const char*>(b.data);
    return pa < pb + b.bytes() && pb < pa + a.bytes();
}

MPI_Comm timed_dup(MPI_Comm comm, const WaitPolicy& policy, const std::string& what) {
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Comm_idup(comm, &out, &req));
    wait_setup(&req, policy, what, "");
    MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
    return out;
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, std::string name, const WaitPolicy& policy)
    : comm_(comm), name_(std::move(name)), policy_(policy) {
    LATTICE_CHECK(comm_ != MPI_COMM_NULL, "MpiComm '{}': null MPI communicator", name_);
    mpi_session();  // peer table for diagnostics
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    MPI_CHECK(MPI_Comm_group(comm_, &g));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
    std::vector<int> mine(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) mine[size_t(i)] = i;
    world_ranks_.resize(size_t(size_));
    MPI_CHECK(MPI_Group_translate_ranks(g, size_, mine.data(), wg, world_ranks_.data()));
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    ctl_ = std::make_unique<ControlChannel>(timed_dup(comm_, policy_, name_), &calls_);
    setup_shared_memory();
}

MpiComm::~MpiComm() {
    if (mpi_active()) {
        for (PendingSend& ps : sends_) {
            int flag = 0;
            if (MPI_Test(&ps.req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) continue;
            MPI_Request_free(&ps.req);  // the transfer goes on without us; its copy must outlive it
            (void)new std::vector<char>(std::move(ps.data));
        }
    }
    ctl_.reset();
    if (mpi_active() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiComm> MpiComm::world(const WaitPolicy& policy, std::string name) {
    mpi_session();
    return std::make_unique<MpiComm>(timed_dup(MPI_COMM_WORLD, policy, name), std::move(name), policy);
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key, std::string name) {
    barrier();  // everyone is here: the blocking split below cannot hang on a missing rank
    MPI_Comm out = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(out, std::move(name), policy_);
}

std::string MpiComm::describe_rank(int r) const {
    const MpiSession& s = mpi_session();
    const int w = world_ranks_[size_t(r)];
    const PeerInfo& p = s.peers()[size_t(w)];
    if (w == r) return fmt::format("rank {} [pid {} on {}]", r, p.pid, p.host);
    return fmt::format("rank {} [world rank {}, pid {} on {}]", r, w, p.pid, p.host);
}

void MpiComm::check_host(const View& v, const char* op, const char* which) const {
    LATTICE_CHECK(v.device == Device::kCpu,
                  "{} on '{}': {} is device memory; MpiComm moves host buffers (use NcclComm)", op, name_, which);
    LATTICE_CHECK(v.is_contiguous(), "{} on '{}': {} {} is not contiguous", op, name_, which, v.shape_str());
    LATTICE_CHECK(v.data != nullptr || v.numel() == 0, "{} on '{}': {} has no data", op, name_, which);
}

void MpiComm::start_call(const char* op, int peer) {
    LATTICE_CHECK(!broken_, "{} on '{}': the communicator is broken by an earlier timeout or MPI error", op, name_);
    if (!sends_.empty()) reap_sends();
    ++calls_;
    set_activity(name_, op, calls_, peer);
}

void MpiComm::leak_inflight() {
    (void)new std::vector<float>(std::move(scratch_));
    (void)new std::deque<PendingSend>(std::move(sends_));
    sends_.clear();
}

void MpiComm::reap_sends() {
    while (!sends_.empty()) {
        PendingSend& ps = sends_.front();
        int flag = 0;
        int rc = MPI_Test(&ps.req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            broken_ = true;
            set_activity(name_, "send", ps.call, ps.peer);
            const std::string what = ps.what + " (buffered)";
            const int peer = ps.peer;
            fail_mpi("send", what, peer, rc);
        }
        if (!flag) break;  // in order: later sends to the same peer cannot have finished first
        spare_bufs_.push_back(std::move(ps.data));
        sends_.pop_front();
    }
    for (const PendingSend& ps : sends_) {
        const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - ps.started).count();
        if (policy_.timeout_s > 0 && age > policy_.timeout_s) {
            broken_ = true;
            set_activity(name_, "send", ps.call, ps.peer);
            const std::string what = ps.what + fmt::format(" (buffered, call #{})", ps.call);
            const int peer = ps.peer;
            fail_timeout("send", what, peer, age);
        }
    }
}

void MpiComm::wait_oldest_send() {
    PendingSend& ps = sends_.front();
    const double age = std::chrono::duration<double>(std::chrono::steady_clock::now() - ps.started).count();
    WaitPolicy p = policy_;
    if (p.timeout_s > 0) p.timeout_s = std::max(1e-3, p.timeout_s - age);
    int rc = MPI_SUCCESS;
    WaitResult r = poll_request(&ps.req, MPI_STATUS_IGNORE, p, &rc);
    if (r == WaitResult::kDone) {
        spare_bufs_.push_back(std::move(ps.data));
        sends_.pop_front();
        return;
    }
    broken_ = true;
    set_activity(name_, "send", ps.call, ps.peer);
    const std::string what = ps.what + fmt::format(" (buffered, call #{})", ps.call);
    const int peer = ps.peer;
    if (r == WaitResult::kMpiError) fail_mpi("send", what, peer, rc);
    fail_timeout("send", what, peer, age + p.timeout_s);
}

void MpiComm::issued(int rc, const char* op, const std::string& what, int peer) {
    if (rc == MPI_SUCCESS) [[likely]]
        return;
    broken_ = true;
    fail_mpi(op, what, peer, rc);
}

void MpiComm::wait(MPI_Request* req, MPI_Status* status, const char* op, const std::string& what, int peer) {
    int rc = MPI_SUCCESS;
    WaitResult r = poll_request(req, status, policy_, &rc);
    if (r == WaitResult::kDone) {
        clear_activity();
        return;
    }
    broken_ = true;
    if (r == WaitResult::kMpiError) fail_mpi(op, what, peer, rc);
    fail_timeout(op, what, peer, policy_.timeout_s);
}

void MpiComm::fail_mpi(const char* op, const std::string& what, int peer, int rc) {
    clear_activity();
    const MpiSession& s = mpi_session();
    std::vector<std::string> dead;
    for (int r = 0; r < size_; ++r) {
        if (r == rank_ || (peer >= 0 && r != peer)) continue;
        if (s.peer_state(world_ranks_[size_t(r)]) == PeerState::kDead) dead.push_back(describe_rank(r));
    }
    std::string d;
    for (size_t i = 0; i < dead.size(); ++i) {
        d += i ? ", " : "; dead: ";
        d += dead[i];
    }
    leak_inflight();  // MPI may still touch these buffers: keep them alive
    LATTICE_FAIL("{} on communicator '{}' (call #{}, {}) failed: {}{}", op, name_, calls_, what, mpi_error_string(rc),
                 d);
}

void MpiComm::fail_timeout(const char* op, const std::string& what, int peer, double waited_s) {
    leak_inflight();  // MPI may still touch these buffers: keep them alive
    std::vector<int> targets;
    for (int r = 0; r < size_; ++r)
        if (r != rank_ && (peer < 0 || r == peer)) targets.push_back(r);
    // Still marked as inside this call: peers probing us at the same time see we wait with them.
    std::vector<std::optional<PeerReport>> reps = ctl_->probe(targets, policy_.grace_s);
    clear_activity();

    const MpiSession& s = mpi_session();
    std::vector<int> silent, same;
    std::vector<std::string> silent_desc, elsewhere;
    for (size_t i = 0; i < targets.size(); ++i) {
        const int t = targets[i];
        if (!reps[i]) {
            silent.push_back(t);
            PeerState st = s.peer_state(world_ranks_[size_t(t)]);
            silent_desc.push_back(describe_rank(t) +
                                  (st == PeerState::kDead ? ": the process is dead"
                                   : st == PeerState::kAlive
                                       ? ": the process is alive, so it is busy outside "
                                         "communication or hung"
                                       : ": on another machine; dead, or busy outside communication"));
            continue;
        }
        const PeerReport& rep = *reps[i];
        const Activity& a = rep.now;
        const bool here = std::strncmp(a.comm, name_.c_str(), sizeof(a.comm)) == 0;
        if (peer < 0 && here && a.call == calls_ && std::strncmp(a.op, op, sizeof(a.op)) == 0) {
            same.push_back(t);
            continue;
        }
        std::string doing;
        if (a.comm[0] == 0)
            doing = "is not inside any communication call";
        else
            doing = fmt::format("is blocked in {}{} (call #{}) on '{}'", a.op,
                                a.peer >= 0 ? fmt::format(" with rank {}", a.peer) : std::string(), a.call, a.comm);
        elsewhere.push_back(fmt::format("{} answered but {}; it has started {} calls on '{}' (this rank {})",
                                        describe_rank(t), doing, rep.calls_started, name_, calls_));
    }
    std::string msg =
        fmt::format("{} on communicator '{}' ({} ranks, this is rank {}) timed out after {:.1f} s (call #{}, {})", op,
                    name_, size_, rank_, waited_s, calls_, what);
    if (!silent.empty())
        msg += fmt::format("; no answer from rank{} {}", silent.size() > 1 ? "s" : "", join_ints(silent));
    for (const std::string& d : silent_desc) msg += "; " + d;
    for (const std::string& e : elsewhere) msg += "; " + e;
    if (!same.empty())
        msg += fmt::format("; rank{} {} waiting in the same call", same.size() > 1 ? "s" : "",
                           join_ints(same) + (same.size() > 1 ? " are" : " is"));
    if (silent.empty() && elsewhere.empty()) msg += "; every peer answered from this call (MPI progress stalled?)";
    LATTICE_FAIL("{}", msg);
}

// ---------------------------------------------------------------------------------------------
// Operations

void MpiComm::reduce_staged(const View& out, const View& in, bool scatter) {
    // f16/bf16: convert to f32, reduce in f32, round once.
    const int64_t n_in = in.numel(), n_out = out.numel();
    scratch_.resize(size_t(n_in + (scatter ? n_out : 0)));
    float* sin = scratch_.data();
    float* sout = scratch_.data() + (scatter ? n_in : 0);
    const bool f16 = in.dtype == DType::kF16;
    const auto* src = in.ptr<const uint16_t>();
    for (int64_t i = 0; i < n_in; ++i) sin[i] = f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
    MPI_Request req = MPI_REQUEST_NULL;
    const std::string what = fmt::format("{} x {} via f32", n_in, dtype_name(in.dtype));
    if (scatter) {
        issued(MPI_Ireduce_scatter_block(sin, sout, int(n_out), MPI_FLOAT, MPI_SUM, comm_, &req), "reduce_scatter_sum",
               what, -1);
        wait(&req, MPI_STATUS_IGNORE, "reduce_scatter_sum", what, -1);
    } else {
        reduce_sum(sin, n_in, DType::kF32, what);
    }
    auto* dst = out.ptr<uint16_t>();
    for (int64_t i = 0; i < n_out; ++i) dst[i] = f16 ? f32_to_f16(sout[i]) : f32_to_bf16(sout[i]);
}

void MpiComm::all_reduce_sum(const View& inout) {
    check_host(inout, "all_reduce_sum", "inout");
    const DType t = inout.dtype;
    LATTICE_CHECK(t == DType::kF32 || t == DType::kI32 || t == DType::kF16 || t == DType::kBF16,
                  "all_reduce_sum on '{}': dtype {} not supported (f32, f16, bf16, i32)", name_, dtype_name(t));
    const int cnt = checked_count(inout.numel(), name_, "all_reduce_sum");
    start_call("all_reduce_sum", -1);
    if (t == DType::kF16 || t == DType::kBF16) return reduce_staged(inout, inout, false);
    reduce_sum(inout.data, cnt, t, fmt::format("{} x {}", cnt, dtype_name(t)));
}

void MpiComm::all_gather(const View& out, const View& in) {
    check_host(out, "all_gather", "out");
    check_host(in, "all_gather", "in");
    LATTICE_CHECK(out.dtype == in.dtype && out.numel() == int64_t(size_) * in.numel(),
                  "all_gather on '{}': out {} {} must hold {} x in {} {}", name_, dtype_name(out.dtype),
                  out.shape_str(), size_, dtype_name(in.dtype), in.shape_str());
    const int bytes = checked_count(in.bytes(), name_, "all_gather");
    checked_count(out.bytes(), name_, "all_gather");
    const void* send = in.data;
    if (in.data == static_cast<char*>(out.data) + int64_t(rank_) * bytes) {
        send = MPI_IN_PLACE;
    } else {
        LATTICE_CHECK(!overlaps(out, in), "all_gather on '{}': in overlaps out other than at this rank's slice", name_);
    }
    start_call("all_gather", -1);
    const std::string what = fmt::format("{} x {} per rank", in.numel(), dtype_name(in.dtype));
    if (shm_) {
        // Chunks of every rank's block at the same offset: slot r of a call holds rank r's chunk.
        const char* src = static_cast<const char*>(in.data);
        for (int64_t off = 0; off < bytes; off += ShmExchange::kSlotBytes) {
            const int64_t n = std::min<int64_t>(ShmExchange::kSlotBytes, bytes - off);
            const uint64_t seq = ++shm_seq_;
            std::memcpy(shm_->my_slot(seq), src + off, size_t(n));
            shm_exchange(seq, n, "all_gather", what);
            for (int r = 0; r < size_; ++r)
                if (r != rank_ || send != MPI_IN_PLACE)
                    std::memcpy(static_cast<char*>(out.data) + int64_t(r) * bytes + off, shm_->slot(r, seq), size_t(n));
        }
        clear_activity();
        return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    issued(MPI_Iallgather(send, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE, comm_, &req), "all_gather", what, -1);
    wait(&req, MPI_STATUS_IGNORE, "all_gather", what, -1);
}

void MpiComm::reduce_scatter_sum(const View& out, const View& in) {
    check_host(out, "reduce_scatter_sum", "out");
    check_host(in, "reduce_scatter_sum", "in");
    LATTICE_CHECK(out.dtype == in.dtype && in.numel() == int64_t(size_) * out.numel(),
                  "reduce_scatter_sum on '{}': in {} {} must hold {} x out {} {}", name_, dtype_name(in.dtype),
                  in.shape_str(), size_, dtype_name(out.dtype), out.shape_str());
    const DType t = in.dtype;
    LATTICE_CHECK(t == DType::kF32 || t == DType::kI32 || t == DType::kF16 || t == DType::kBF16,
                  "reduce_scatter_sum on '{}': dtype {} not supported (f32, f16, bf16, i32)", name_, dtype_name(t));
    const int cnt = checked_count(out.numel(), name_, "reduce_scatter_sum");
    checked_count(in.numel(), name_, "reduce_scatter_sum");
    start_call("reduce_scatter_sum", -1);
    if (t == DType::kF16 || t == DType::kBF16) return reduce_staged(out, in, true);
    const void* src = in.data;
    if (overlaps(out, in)) {  // MPI forbids aliasing (its IN_PLACE form has other semantics)
        scratch_.resize(size_t((in.bytes() + 3) / 4));
        std::memcpy(scratch_.data(), in.data, size_t(in.bytes()));
        src = scratch_.data();
    }
    const std::string what = fmt::format("{} x {} per rank", cnt, dtype_name(t));
    MPI_Request req = MPI_REQUEST_NULL;
    issued(
        MPI_Ireduce_scatter_block(src, out.data, cnt, t == DType::kF32 ? MPI_FLOAT : MPI_INT32_T, MPI_SUM, comm_, &req),
        "reduce_scatter_sum", what, -1);
    wait(&req, MPI_STATUS_IGNORE, "reduce_scatter_sum", what, -1);
}

int64_t MpiComm::chunk_bytes() const {
    return std::clamp<int64_t>(policy_.max_chunk_bytes, 64, int64_t(1) << 30);
}

void MpiComm::broadcast(const View& inout, int root) {
    check_host(inout, "broadcast", "inout");
    LATTICE_CHECK(root >= 0 && root < size_, "broadcast on '{}': root {} out of range for {} ranks", name_, root,
                  size_);
    start_call("broadcast", -1);
    const std::string what = fmt::format("{} x {} from root {}", inout.numel(), dtype_name(inout.dtype), root);
    const int64_t total = inout.bytes(), chunk = chunk_bytes();
    for (int64_t off = 0; off < total || off == 0; off += chunk) {  // every rank has the same size: same chunks
        const int n = int(std::min(chunk, total - off));
        MPI_Request req = MPI_REQUEST_NULL;
        issued(MPI_Ibcast(static_cast<char*>(inout.data) + off, n, MPI_BYTE, root, comm_, &req), "broadcast", what, -1);
        wait(&req, MPI_STATUS_IGNORE, "broadcast", what, -1);
        if (total == 0) break;
    }
}

void MpiComm::send(const View& in, int peer) {
    check_host(in, "send", "in");
    LATTICE_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send on '{}' (rank {} of {}): invalid peer {}", name_,
                  rank_, size_, peer);
    start_call("send", peer);
    std::string what = fmt::format("{} x {} {} to rank {}", in.numel(), dtype_name(in.dtype), in.shape_str(), peer);
    const int64_t total = in.bytes(), chunk = chunk_bytes();
    if (total > chunk) {
        // Large: a header with the total (so a receiver expecting another size fails instead of
        // mis-pairing chunks), then synchronous chunks straight from the caller's buffer (no copy).
        int64_t header = total;
        MPI_Request req = MPI_REQUEST_NULL;
        issued(MPI_Isend(&header, 8, MPI_BYTE, peer, kDataTag, comm_, &req), "send", what, peer);
        wait(&req, MPI_STATUS_IGNORE, "send", what, peer);
        for (int64_t off = 0; off < total; off += chunk) {
            const int n = int(std::min(chunk, total - off));
            issued(MPI_Isend(static_cast<const char*>(in.data) + off, n, MPI_BYTE, peer, kDataTag, comm_, &req), "send",
                   what, peer);
            wait(&req, MPI_STATUS_IGNORE, "send", what, peer);
        }
        return;
    }
    const int bytes = int(total);
    if (policy_.send_buffers <= 0) {
        MPI_Request req = MPI_REQUEST_NULL;
        const auto t0 = std::chrono::steady_clock::now();
        issued(MPI_Isend(in.data, bytes, MPI_BYTE, peer, kDataTag, comm_, &req), "send", what, peer);
        wait(&req, MPI_STATUS_IGNORE, "send", what, peer);
        send_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return;
    }
    if (int(sends_.size()) >= policy_.send_buffers) {
        const auto t0 = std::chrono::steady_clock::now();
        while (int(sends_.size()) >= policy_.send_buffers) wait_oldest_send();
        send_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    PendingSend ps;
    if (!spare_bufs_.empty()) {
        ps.data = std::move(spare_bufs_.back());
        spare_bufs_.pop_back();
    }
    ps.data.resize(size_t(bytes));
    if (bytes) std::memcpy(ps.data.data(), in.data, size_t(bytes));
    ps.peer = peer;
    ps.call = calls_;
    ps.started = std::chrono::steady_clock::now();
    ps.what = std::move(what);
    issued(MPI_Isend(ps.data.data(), bytes, MPI_BYTE, peer, kDataTag, comm_, &ps.req), "send", ps.what, peer);
    sends_.push_back(std::move(ps));
    clear_activity();
}

void MpiComm::recv_exact(void* dst, int64_t bytes, int peer, const std::string& what, const View& out) {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Status st;
    issued(MPI_Irecv(dst, int(bytes), MPI_BYTE, peer, kDataTag, comm_, &req), "recv", what, peer);
    wait(&req, &st, "recv", what, peer);
    int got = 0;
    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
    if (got != bytes) broken_ = true;  // the pair is out of step: later messages would mis-pair
    LATTICE_CHECK(got == bytes,
                  "recv on '{}' from {}: got a message of {} bytes, expected {} ({} x {} {}): sender and receiver "
                  "disagree",
                  name_, describe_rank(peer), got, bytes, out.numel(), dtype_name(out.dtype), out.shape_str());
}

void MpiComm::recv(const View& out, int peer) {
    check_host(out, "recv", "out");
    LATTICE_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv on '{}' (rank {} of {}): invalid peer {}", name_,
                  rank_, size_, peer);
    start_call("recv", peer);
    const std::string what =
        fmt::format("{} x {} {} from rank {}", out.numel(), dtype_name(out.dtype), out.shape_str(), peer);
    const int64_t total = out.bytes(), chunk = chunk_bytes();
    if (total <= chunk) return recv_exact(out.data, total, peer, what, out);
    int64_t header = -1;
    recv_exact(&header, 8, peer, what, out);
    if (header != total) broken_ = true;
    LATTICE_CHECK(header == total, "recv on '{}' from {}: the sender sends {} bytes, this rank expects {} ({} x {} {})",
                  name_, describe_rank(peer), header, total, out.numel(), dtype_name(out.dtype), out.shape_str());
    for (int64_t off = 0; off < total; off += chunk)
        recv_exact(static_cast<char*>(out.data) + off, std::min(chunk, total - off), peer, what, out);
}

void MpiComm::barrier() {
    start_call("barrier", -1);
    while (!sends_.empty()) wait_oldest_send();  // a barrier also means "my sends are delivered"
    set_activity(name_, "barrier", calls_, -1);
    MPI_Request req = MPI_REQUEST_NULL;
    issued(MPI_Ibarrier(comm_, &req), "barrier", "no data", -1);
    wait(&req, MPI_STATUS_IGNORE, "barrier", "no data", -1);
}

}  // namespace lattice
