// SHA-256 through OpenSSL's EVP interface (see sha256.h for why OpenSSL).
#include "runtime/weights/sha256.h"

#include <fcntl.h>
#if defined(LATTICE_HAVE_OPENSSL)
#include <openssl/evp.h>
#endif
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace lattice {

#if defined(LATTICE_HAVE_OPENSSL)
struct Sha256::Ctx {
    EVP_MD_CTX* md = nullptr;
    ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
    ctx_->md = EVP_MD_CTX_new();
    LATTICE_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
                  "SHA-256: OpenSSL could not initialize a digest context");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t bytes) {
    LATTICE_CHECK(!done_, "SHA-256: update after finish");
    if (bytes > 0) LATTICE_CHECK(EVP_DigestUpdate(ctx_->md, data, bytes) == 1, "SHA-256: OpenSSL update failed");
}

Sha256Digest Sha256::finish() {
    LATTICE_CHECK(!done_, "SHA-256: finish called twice");
    done_ = true;
    Sha256Digest d{};
    unsigned int n = 0;
    LATTICE_CHECK(EVP_DigestFinal_ex(ctx_->md, d.data(), &n) == 1 && n == d.size(), "SHA-256: OpenSSL final failed");
    return d;
}

#else
// Built without libcrypto: every use of a digest names the missing library.
struct Sha256::Ctx {};

Sha256::Sha256() {
    LATTICE_FAIL("SHA-256 (lattice convert, verify, --verify) needs OpenSSL's libcrypto, which this lattice was "
                 "built without (apt install libssl-dev, then reconfigure)");
}
Sha256::~Sha256() = default;
void Sha256::update(const void*, size_t) {}
Sha256Digest Sha256::finish() { return {}; }
#endif

std::string sha256_hex(const Sha256Digest& d) {
    static const char* kHex = "0123456789abcdef";
    std::string s(64, '0');
    for (size_t i = 0; i < d.size(); ++i) {
        s[2 * i] = kHex[d[i] >> 4];
        s[2 * i + 1] = kHex[d[i] & 15];
    }
    return s;
}

std::string sha256_hex(const void* data, size_t bytes) {
    Sha256 h;
    h.update(data, bytes);
    return sha256_hex(h.finish());
}

bool is_sha256_hex(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

std::string sha256_file(const std::string& path, const std::function<void(int64_t)>& on_bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LATTICE_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    std::vector<uint8_t> buf(size_t(4) << 20);
    Sha256 h;
    int64_t off = 0;
    for (;;) {
        const ssize_t n = ::pread(fd, buf.data(), buf.size(), off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            LATTICE_FAIL("{}: read failed at byte {} ({})", path, off, std::strerror(err));
        }
        if (n == 0) break;
        h.update(buf.data(), size_t(n));
        off += n;
        if (on_bytes) on_bytes(n);
    }
    ::close(fd);
    return sha256_hex(h.finish());
}

}  // namespace lattice
