// Large host buffers in transparent huge pages (2 MiB), for weights and the KV cache.
// Why: decode streams every weight once per token. With 4 KiB pages each core walks the page table
// every 64 cache lines; with two ranks streaming at once (tp 2 on two cores) that cost showed up as
// ~15% less bandwidth per core (m = 1 W8A8 over TinyLlama's layers, 2-vCPU EPYC: 15.5 -> 17.6 GB/s
// per rank with huge pages, 17.7 GB/s for one rank alone either way; docs/performance.md).
// Debian (and most distributions) ship THP in "madvise" mode, so a buffer gets huge pages only when
// it asks: map_huge() maps anonymous memory aligned to 2 MiB and calls madvise(MADV_HUGEPAGE) over
// it. Where THP is off or unsupported the madvise fails quietly and the buffer is ordinary pages.
// Invariants: the returned memory is zero and 2 MiB aligned; pages materialize on first touch (a
// large KV cache costs resident memory only as it fills, in 2 MiB steps); unmap_huge(p, bytes)
// takes the same `bytes` that map_huge was given.
#pragma once

#include <cstddef>

namespace lattice {

inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// Zeroed anonymous memory of `bytes` (> 0), 2 MiB aligned, huge pages requested. Returns nullptr
// when the system has no memory to map (the caller names what it was for in its error).
void* map_huge(size_t bytes);
void unmap_huge(void* p, size_t bytes);

}  // namespace lattice
