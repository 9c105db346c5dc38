// ShmExchange: POSIX shared memory, per-rank flags and double-buffered slots (see shm_exchange.h).
#include "parallel/shm_exchange.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "parallel/watchdog.h"

namespace lattice {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "flags are shared between processes");

ShmExchange::ShmExchange(void* base, int64_t bytes, int ranks, int rank, std::string name)
    : base_(static_cast<char*>(base)), bytes_(bytes), ranks_(ranks), rank_(rank), name_(std::move(name)) {}

ShmExchange::~ShmExchange() {
    munmap(base_, size_t(bytes_));
}

std::unique_ptr<ShmExchange> ShmExchange::map(const std::string& name, int ranks, int rank, bool make,
                                              std::string* err) {
    const int64_t bytes = int64_t(ranks) * region_bytes();
    const int fd = shm_open(name.c_str(), make ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0) {
        *err = std::string("shm_open ") + name + ": " + std::strerror(errno);
        return nullptr;
    }
    if (make && ftruncate(fd, off_t(bytes)) != 0) {
        *err = std::string("ftruncate ") + name + ": " + std::strerror(errno);
        close(fd);
        shm_unlink(name.c_str());
        return nullptr;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size != off_t(bytes)) {
        *err = std::string("shared object ") + name + " has the wrong size";
        close(fd);
        return nullptr;
    }
    void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *err = std::string("mmap ") + name + ": " + std::strerror(errno);
        if (make) shm_unlink(name.c_str());
        return nullptr;
    }
    // A new object reads as zeros: every flag starts at 0 (no call published).
    return std::unique_ptr<ShmExchange>(new ShmExchange(p, bytes, ranks, rank, name));
}

std::unique_ptr<ShmExchange> ShmExchange::create(const std::string& name, int ranks, int rank, std::string* err) {
    return map(name, ranks, rank, true, err);
}

std::unique_ptr<ShmExchange> ShmExchange::open(const std::string& name, int ranks, int rank, std::string* err) {
    return map(name, ranks, rank, false, err);
}

void ShmExchange::unlink() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
}

void ShmExchange::publish(uint64_t seq, int64_t bytes) {
    header(rank_)->bytes[seq & 1] = bytes;
    flag(rank_)->store(seq, std::memory_order_release);
}

std::vector<int> ShmExchange::wait_all(uint64_t seq, const WaitPolicy& policy) const {
    WaitPacer pace(policy);
    int next = 0;  // ranks below `next` have published
    for (;;) {
        while (next < ranks_ && flag(next)->load(std::memory_order_acquire) >= seq) ++next;
        if (next == ranks_) return {};
        if (!pace.next()) break;
    }
    std::vector<int> behind;
    for (int r = next; r < ranks_; ++r)
        if (flag(r)->load(std::memory_order_acquire) < seq) behind.push_back(r);
    return behind;
}

}  // namespace lattice
