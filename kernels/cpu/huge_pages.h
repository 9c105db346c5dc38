// Large host buffers in transparent huge pages (2 MiB), for weights and the KV cache.
// Why: decode streams every weight once per token. With 4 KiB pages each core walks the page table
// every 64 cache lines; with two ranks streaming at once (tp 2 on two cores) that cost showed up as
// ~15% less bandwidth per core (m = 1 W8A8 over TinyLlama's layers, 2-vCPU EPYC: 15.5 -> 17.6 GB/s
// per rank with huge pages, 17.7 GB/s for one rank alone either way; docs/benchmark-results.md).
// Debian (and most distributions) ship THP in "madvise" mode, so a buffer gets huge pages only when
// it asks: map_huge() maps anonymous memory aligned to 2 MiB and calls madvise(MADV_HUGEPAGE) over
// it. Where THP is off or unsupported the madvise fails quietly and the buffer is ordinary pages.
// Invariants: the returned memory is zero and 2 MiB aligned; pages materialize on first touch;
// unmap_huge(p, bytes) takes the same `bytes` that map_huge (or map_pages) was given.
// Not everything large wants huge pages: memory that is touched sparsely pays for a whole 2 MiB
// page (zeroed by the kernel) on the first write to any byte of it. The KV cache is such memory: a
// sequence writes one 16 KiB block per layer at a time, so its first step faulted one 2 MiB page
// per layer for K and for V. On a VM whose host backs freed guest memory lazily (virtio-balloon
// free-page reporting, the development VM) a 2 MiB fault measured ~17 ms (0.12 GB/s) against
// 2.5 GB/s for 4 KiB faults, and the first 64-token prefill of TinyLlama paid 0.5 s of it (44
// faults). map_pages(bytes, false) maps the same zeroed memory in 4 KiB pages (MADV_NOHUGEPAGE,
// also where THP is "always"); decode attention read it as fast (bench_attention, both ways).
#pragma once

#include <cstddef>

namespace lattice {

inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// Zeroed anonymous memory of `bytes` (> 0), 2 MiB aligned, huge pages requested. Returns nullptr
// when the system has no memory to map (the caller names what it was for in its error).
void* map_huge(size_t bytes);
// map_huge when `huge`; otherwise the same mapping in ordinary 4 KiB pages (see above).
void* map_pages(size_t bytes, bool huge);
// Materializes the pages of [p, p + bytes) now (MADV_POPULATE_WRITE; the contents stay zero), so that
// the first step to use a scratch buffer does not pay for its faults. Advisory: where the kernel
// cannot (before Linux 5.14, or out of memory now) the pages fault on first touch as before.
void prefault(void* p, size_t bytes);
void unmap_huge(void* p, size_t bytes);

}  // namespace lattice
