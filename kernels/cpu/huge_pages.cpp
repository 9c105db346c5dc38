// map_huge / unmap_huge (see huge_pages.h). The mapping is over-allocated by 2 MiB and trimmed to
// the aligned range at once, so unmap_huge needs only the pointer and size it handed out.
#include "kernels/cpu/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace lattice {

namespace {
size_t page_rounded(size_t bytes) {
    constexpr size_t kPage = 4096;
    return (bytes + kPage - 1) / kPage * kPage;
}
}  // namespace

void* map_huge(size_t bytes) { return map_pages(bytes, true); }

void* map_pages(size_t bytes, bool huge) {
    const size_t len = page_rounded(bytes);
    void* raw = ::mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHugePageBytes - 1) & ~uintptr_t(kHugePageBytes - 1);
    if (aligned > base) ::munmap(raw, aligned - base);
    const size_t tail = base + len + kHugePageBytes - (aligned + len);
    if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + len), tail);
    void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
    // advisory: EINVAL without THP
    if (len >= kHugePageBytes) (void)::madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
    return p;
}

void prefault(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    if (p && bytes > 0) (void)::madvise(p, page_rounded(bytes), MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)bytes;
#endif
}

void unmap_huge(void* p, size_t bytes) {
    if (p) ::munmap(p, page_rounded(bytes));
}

}  // namespace lattice
