// bench_allreduce: nccl-tests style all-reduce benchmark over a Communicator: `--comm mpi` is MpiComm
// as the engine uses it (the shared-memory exchange when every rank is on this machine),
// `mpi-noshm` MpiComm on MPI_Iallreduce only, `mpi-raw` a blocking MPI_Allreduce baseline.
//   mpirun -np 4 bench_allreduce [--min-bytes 4] [--max-bytes 268435456] [--step 4]
//                                [--dtype f32|bf16|i32] [--iters N] [--warmup N] [--json FILE]
// Per size: `warmup` untimed calls, a barrier, then `iters` timed calls back to back, each call's
// end stamped on every rank. time = max over ranks of the per-call mean (the slowest rank bounds the
// step: nccl-tests' figure); p50/p99 are percentiles over the calls of the per-call time maxed over
// ranks (call i's time on the slowest rank). algBw = bytes / time, busBw = algBw * 2 (n - 1) / n
// (data each rank must move in a ring all-reduce: comparable across rank counts). After timing,
// one call on exact integer-valued data is checked element by element (errors column; exit 1 if any).
// Ceiling: single-thread memcpy bandwidth of this machine (measured here), because a host
// all-reduce on one node is shared-memory copies plus a reduction.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "parallel/mpi_comm.h"

using namespace lattice;

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
    int64_t bytes = 0;
    int64_t count = 0;
    int iters = 0;
    int warmup = 0;
    double time_us = 0;  // max over ranks of the mean
    double p50_us = 0;   // percentiles of the per-call time maxed over ranks
    double p99_us = 0;
    double algbw = 0;
    double busbw = 0;
    int64_t errors = 0;
};

// Baseline: blocking MPI_Allreduce with no timeout, to show what the deadline polling costs.
class RawMpiAllReduce final : public Communicator {
public:
    RawMpiAllReduce() { mpi_session(); }
    int rank() const override { return mpi_session().rank(); }
    int size() const override { return mpi_session().size(); }
    std::string name() const override { return "mpi-raw"; }
    void all_reduce_sum(const View& v) override {
        LATTICE_CHECK(v.dtype == DType::kF32 || v.dtype == DType::kI32, "--comm mpi-raw: f32 or i32 only");
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data, int(v.numel()), v.dtype == DType::kF32 ? MPI_FLOAT : MPI_INT32_T,
                                MPI_SUM, MPI_COMM_WORLD));
    }
    void all_gather(const View&, const View&) override { LATTICE_FAIL("mpi-raw: all-reduce only"); }
    void reduce_scatter_sum(const View&, const View&) override { LATTICE_FAIL("mpi-raw: all-reduce only"); }
    void broadcast(const View&, int) override { LATTICE_FAIL("mpi-raw: all-reduce only"); }
    void send(const View&, int) override { LATTICE_FAIL("mpi-raw: all-reduce only"); }
    void recv(const View&, int) override { LATTICE_FAIL("mpi-raw: all-reduce only"); }
    void barrier() override { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
};

std::unique_ptr<Communicator> make_comm(const std::string& kind, double timeout_s) {
    if (kind == "mpi-raw") return std::make_unique<RawMpiAllReduce>();
    if (kind == "mpi" || kind == "mpi-noshm") {
        WaitPolicy p;
        p.timeout_s = timeout_s;
        p.shared_memory = kind == "mpi";
        return MpiComm::world(p, "bench");
    }
    LATTICE_FAIL("--comm {}: not available in this build (mpi, mpi-noshm, mpi-raw)", kind);
}

double memcpy_gbps() {
    const size_t n = 64u << 20;
    std::vector<char> a(n, 1), b(n, 0);
    std::memcpy(b.data(), a.data(), n);  // fault pages in
    auto t0 = Clock::now();
    const int reps = 4;
    for (int i = 0; i < reps; ++i) std::memcpy(b.data(), a.data(), n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (b[n - 1] != 1) return 0;
    return double(n) * reps / s / 1e9;
}

// Nearest-rank percentile (q in (0, 1]) of v (sorted in place).
double percentile(std::vector<double>& v, double q) {
    std::sort(v.begin(), v.end());
    const size_t i = size_t(std::max(1.0, std::ceil(q * double(v.size())))) - 1;
    return v[std::min(i, v.size() - 1)];
}

// Exact values: small multiples of 1/4; sums exact in f32 / i32 for <= 64 ranks, in bf16 for <= 8.
float value(int r, int64_t i) {
    return float(((i * 7 + r * 3) % 9) - 4) * 0.25f * float(r + 1);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"all-reduce latency and bus bandwidth (nccl-tests style)"};
    int64_t min_bytes = 4, max_bytes = 256ll << 20;
    int step = 4, iters = 0, warmup = -1;
    double timeout_s = 60;
    std::string dtype_s = "f32", json_path, comm_kind = "mpi";
    app.add_option("--min-bytes", min_bytes, "smallest message")->check(CLI::Range(int64_t(4), int64_t(1) << 31));
    app.add_option("--max-bytes", max_bytes, "largest message")->check(CLI::Range(int64_t(4), int64_t(1) << 31));
    app.add_option("--step", step, "size multiplier between rows")->check(CLI::Range(2, 16));
    app.add_option("--iters", iters, "timed calls per size (default: adaptive, ~1 GB moved, 20..1000)")
        ->check(CLI::Range(0, 100000));
    app.add_option("--warmup", warmup, "untimed calls per size (default: iters / 5, at least 1)")
        ->check(CLI::Range(-1, 10000));
    app.add_option("--dtype", dtype_s, "f32, bf16 or i32")->check(CLI::IsMember({"f32", "bf16", "i32"}));
    app.add_option("--comm", comm_kind, "communicator: mpi (MpiComm), mpi-noshm (MpiComm without shared memory) or mpi-raw (blocking "
                   "MPI_Allreduce baseline)");
    app.add_option("--timeout", timeout_s, "per-call timeout in seconds");
    app.add_option("--json", json_path, "write results as JSON");
    CLI11_PARSE(app, argc, argv);

    try {
        std::unique_ptr<Communicator> comm = make_comm(comm_kind, timeout_s);
        const int n = comm->size(), me = comm->rank();
        const DType dt = dtype_s == "f32" ? DType::kF32 : dtype_s == "bf16" ? DType::kBF16 : DType::kI32;
        const int64_t esize = dtype_size(dt);
        const double ceiling = me == 0 ? memcpy_gbps() : 0.0;
        if (me == 0) {
            std::printf(
                "# all-reduce sum, %s, %d ranks on %s, comm %s; time = max over ranks; busBw = algBw * 2(n-1)/n\n",
                dtype_s.c_str(), n, mpi_session().host().c_str(), comm_kind.c_str());
            std::printf("# ceiling: single-thread memcpy %.2f GB/s\n", ceiling);
            std::printf("%12s %12s %6s %11s %11s %11s %11s %11s %8s %6s\n", "bytes", "count", "iters", "time(us)",
                        "p50(us)", "p99(us)", "algBw(GB/s)", "busBw(GB/s)", "busBw/cp", "errors");
        }
        std::vector<Row> rows;
        for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= step) {
            Row row;
            row.count = std::max<int64_t>(1, bytes / esize);
            row.bytes = row.count * esize;
            row.iters = iters > 0 ? iters : int(std::clamp<int64_t>((1ll << 30) / row.bytes, 20, 1000));
            const int wu = warmup >= 0 ? warmup : std::max(1, row.iters / 5);
            row.warmup = wu;
            std::vector<uint8_t> buf(size_t(row.bytes), 0);
            View v = View::contiguous(buf.data(), dt, {row.count});
            for (int i = 0; i < wu; ++i) comm->all_reduce_sum(v);
            comm->barrier();
            std::vector<Clock::time_point> stamp(size_t(row.iters) + 1);
            stamp[0] = Clock::now();
            for (int i = 0; i < row.iters; ++i) {
                comm->all_reduce_sum(v);
                stamp[size_t(i) + 1] = Clock::now();
            }
            double t = std::chrono::duration<double>(stamp.back() - stamp[0]).count() / row.iters;
            std::vector<double> per_call(size_t(row.iters));
            for (size_t i = 0; i < per_call.size(); ++i)
                per_call[i] = std::chrono::duration<double>(stamp[i + 1] - stamp[i]).count();
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, per_call.data(), row.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            row.time_us = t * 1e6;
            row.p50_us = percentile(per_call, 0.50) * 1e6;
            row.p99_us = percentile(per_call, 0.99) * 1e6;
            row.algbw = double(row.bytes) / t / 1e9;
            row.busbw = row.algbw * 2.0 * (n - 1) / n;
            // Correctness after timing, on fresh exact data.
            for (int64_t i = 0; i < row.count; ++i) {
                float x = value(me, i);
                if (dt == DType::kF32) reinterpret_cast<float*>(buf.data())[i] = x;
                if (dt == DType::kBF16) reinterpret_cast<uint16_t*>(buf.data())[i] = f32_to_bf16(x);
                if (dt == DType::kI32) reinterpret_cast<int32_t*>(buf.data())[i] = int32_t(x * 4);
            }
            comm->all_reduce_sum(v);
            int64_t errors = 0;
            for (int64_t i = 0; i < row.count; ++i) {
                float e = 0;
                for (int r = 0; r < n; ++r) e += value(r, i);
                float got = dt == DType::kF32    ? reinterpret_cast<float*>(buf.data())[i]
                            : dt == DType::kBF16 ? bf16_to_f32(reinterpret_cast<uint16_t*>(buf.data())[i])
                                                 : float(reinterpret_cast<int32_t*>(buf.data())[i]) / 4;
                errors += got != e;
            }
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &errors, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
            row.errors = errors;
            rows.push_back(row);
            if (me == 0)
                std::printf("%12lld %12lld %6d %11.1f %11.1f %11.1f %11.3f %11.3f %8.3f %6lld\n", (long long)row.bytes,
                            (long long)row.count, row.iters, row.time_us, row.p50_us, row.p99_us, row.algbw, row.busbw,
                            ceiling > 0 ? row.busbw / ceiling : 0.0, (long long)row.errors);
        }
        int64_t total_errors = 0;
        for (const Row& r : rows) total_errors += r.errors;
        if (me == 0 && !json_path.empty()) {
            nlohmann::json j;
            j["bench"] = "allreduce";
            j["comm"] = comm_kind;
            j["dtype"] = dtype_s;
            j["ranks"] = n;
            j["host"] = mpi_session().host();
            j["memcpy_gbps"] = ceiling;
            for (const Row& r : rows)
                j["rows"].push_back({{"bytes", r.bytes},
                                     {"count", r.count},
                                     {"iters", r.iters},
                                     {"warmup", r.warmup},
                                     {"time_us", r.time_us},
                                     {"p50_us", r.p50_us},
                                     {"p99_us", r.p99_us},
                                     {"algbw_gbps", r.algbw},
                                     {"busbw_gbps", r.busbw},
                                     {"errors", r.errors}});
            std::ofstream f(json_path);
            LATTICE_CHECK(f.good(), "cannot write {}", json_path);
            f << j.dump(2) << "\n";
        }
        if (me == 0 && total_errors)
            std::fprintf(stderr, "bench_allreduce: %lld wrong elements\n", (long long)total_errors);
        comm.reset();
        return total_errors ? 1 : 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
        if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
}
