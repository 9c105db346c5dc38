// SHA-256 of checkpoint files (manifests of converted checkpoints, `lattice verify`, --verify).
// Backed by OpenSSL's libcrypto (libssl-dev on Debian): a maintained, audited implementation that
// uses the CPU's SHA extensions where present (~1.5-2 GB/s per core against ~0.3-0.4 GB/s for a plain
// C loop), which matters when a 70B checkpoint is 70-140 GB. Only this file's .cpp touches OpenSSL.
// Digests are printed as 64 lowercase hex characters (what `sha256sum` prints).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace lattice {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher: update() any number of times, then finish() once.
class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    void update(const void* data, size_t bytes);
    Sha256Digest finish();

private:
    struct Ctx;
    std::unique_ptr<Ctx> ctx_;
    bool done_ = false;
};

std::string sha256_hex(const Sha256Digest& d);
std::string sha256_hex(const void* data, size_t bytes);
// True for 64 lowercase hex characters.
bool is_sha256_hex(const std::string& s);

// Hashes a whole file with plain reads (not a mapping, so the pages do not count against the
// process's memory); `on_bytes` (optional) sees each chunk's size. Throws Error naming the path.
std::string sha256_file(const std::string& path, const std::function<void(int64_t)>& on_bytes = {});

}  // namespace lattice
