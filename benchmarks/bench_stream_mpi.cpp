// Read bandwidth of N MPI ranks streaming at once: each rank reads its own 1 GiB buffer on one
// thread, the ranks start each repetition together (a barrier) and the time is the slowest rank's;
// the node figure is N x buffer / that time. This is what N single-thread ranks of `lattice` get
// while they all stream their weights (one process with N threads, bench_decode's ceiling, reads
// differently and varies more on a VM). The planner's calibration (validate_plan.py) uses it.
// Usage: mpirun -np N bench_stream_mpi [--json FILE]
#include "benchmarks/bench_common.h"
#include "kernels/cpu/huge_pages.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    std::string json;
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
    const size_t bytes = size_t(1) << 30;
    auto* buf = static_cast<uint8_t*>(lattice::map_huge(bytes));  // huge pages, as the engine's weights
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
    std::memset(buf, 1, bytes);
    uint64_t sink = 0;
    double best = 0;
    for (int r = 0; r < 6; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = lattice::bench::now();
        sink ^= lattice::bench::stream_read(buf, bytes);
        double t = lattice::bench::now() - t0, slowest = 0;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r > 0) best = std::max(best, double(n) * double(bytes) / slowest * 1e-9);  // r 0: warm-up
    }
    volatile uint64_t keep = sink;
    (void)keep;
    lattice::unmap_huge(buf, bytes);
    if (rank == 0) {
        std::printf("%d ranks streaming at once: %.2f GB/s in all, %.2f GB/s per rank\n", n, best, best / n);
        lattice::bench::write_json(json, {{"ranks", n}, {"read_bw_gbs_all", best}, {"read_bw_gbs_per_rank", best / n}});
    }
    MPI_Finalize();
    return 0;
}
