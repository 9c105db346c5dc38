// Files named from outside, read and written without surprises (header-only, POSIX).
// Reading: a path is stat()ed before it is opened and refused unless it is a regular file, and
// the open itself uses O_NONBLOCK, so a FIFO or device named as a model, config, shard or tokenizer
// never blocks the loader (a FIFO swapped in between the two calls is caught by fstat()).
// read_regular_file() adds a size limit. Errors name the role ("config file", "tokenizer" ...), the
// path and what the path is ("a directory", "a FIFO (named pipe)" ...).
// Writing: AtomicWriter writes "<path>.tmp.<pid>" beside the target and renames it over the target
// only after every write and the close succeeded, so a failure never leaves a torn file (commit(true)
// also puts the file and the rename on the disk before it returns, for a file others build on). The target
// must be absent or a regular file: a rename would replace a symlink, FIFO, device node or socket
// with a regular file, so those are refused (checked before the run and again just before the rename).
// prepare_output() makes the same check when a run starts and removes a previous result, so a run
// stopped by a signal never leaves an older file that looks like its own.
// Appending: AppendFile is a file of lines that a job adds to as results complete (`lattice batch`):
// each line goes out in one write() of the whole line, so a crash leaves at most a partial last line,
// which opening the file again cuts off; the complete lines it held are handed to a visitor one at a
// time (to resume; the file is streamed, never held whole); truncate() empties it (start over). Lines reach the disk (fdatasync) in
// bounded steps: every N lines, or once a line has waited S seconds (set_sync; default: every line).
// The file is locked (an fcntl write lock, gone with the process): a second job on the same file is
// an Error naming the pid that holds it, since both would run every request.
#pragma once

#include "base/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

// What a st_mode is, for messages.
inline const char* file_kind(mode_t m) {
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

enum class PathKind { kMissing, kRegular, kDirectory, kOther };

// stat() (following symlinks) without throwing for a path that is simply absent (ENOENT, ENOTDIR);
// any other failure (a symlink loop, no permission, a name too long) throws Error naming the path.
inline PathKind path_kind(const std::string& path, const std::string& what, mode_t* mode = nullptr) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int e = errno;
        if (e == ENOENT || e == ENOTDIR) return PathKind::kMissing;
        LATTICE_FAIL("{} {}: cannot access ({})", what, path, std::strerror(e));
    }
    if (mode) *mode = st.st_mode;
    if (S_ISREG(st.st_mode)) return PathKind::kRegular;
    if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
    return PathKind::kOther;
}

// An owned file descriptor, closed on destruction.
class FileDescriptor {
public:
    FileDescriptor() = default;
    explicit FileDescriptor(int fd) : fd_(fd) {}
    FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    FileDescriptor& operator=(FileDescriptor&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = o.fd_;
            o.fd_ = -1;
        }
        return *this;
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    ~FileDescriptor() { reset(); }
    int get() const { return fd_; }
    void reset() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    // Closes and reports the result (a deferred write error can surface here).
    int close_checked() {
        const int fd = fd_;
        fd_ = -1;
        return fd >= 0 ? ::close(fd) : 0;
    }

private:
    int fd_ = -1;
};

// Opens a regular file for reading; *size gets its length. Throws Error unless it is one.
inline FileDescriptor open_regular_file(const std::string& path, const std::string& what, int64_t* size = nullptr) {
    mode_t mode = 0;
    const PathKind k = path_kind(path, what, &mode);
    LATTICE_CHECK(k != PathKind::kMissing, "{} {}: no such file", what, path);
    LATTICE_CHECK(k == PathKind::kRegular, "{} {} is {}, not a regular file", what, path, file_kind(mode));
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (fd.get() < 0) {
        const int e = errno;
        LATTICE_FAIL("{} {}: cannot open ({})", what, path, std::strerror(e));
    }
    struct stat st {};
    LATTICE_CHECK(::fstat(fd.get(), &st) == 0, "{} {}: cannot stat ({})", what, path, std::strerror(errno));
    LATTICE_CHECK(S_ISREG(st.st_mode), "{} {} is {}, not a regular file", what, path, file_kind(st.st_mode));
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    if (size) *size = int64_t(st.st_size);
    return fd;
}

// The whole content of a regular file of at most `limit` bytes.
inline std::string read_regular_file(const std::string& path, int64_t limit, const std::string& what) {
    int64_t size = 0;
    FileDescriptor fd = open_regular_file(path, what, &size);
    LATTICE_CHECK(size <= limit, "{} {}: {} bytes exceed the {} byte limit", what, path, size, limit);
    std::string data(size_t(size), '\0');
    size_t got = 0;
    while (got < data.size()) {
        const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
        if (n < 0 && errno == EINTR) continue;
        LATTICE_CHECK(n >= 0, "{} {}: read failed ({})", what, path, std::strerror(errno));
        LATTICE_CHECK(n > 0, "{} {}: file shrank to {} bytes while being read", what, path, got);
        got += size_t(n);
    }
    return data;
}

// Throws unless `path` may receive an output file: absent, or a regular file that is not a symlink,
// in an existing folder. `appended`: the file is appended to in place (AppendFile), not replaced, and
// the message says so.
inline void check_output_path(const std::string& path, const std::string& what, bool appended = false) {
    LATTICE_CHECK(!path.empty(), "{}: empty output path", what);
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        LATTICE_CHECK(S_ISREG(st.st_mode), "{} {} is {}: {}; give the path of a regular file or of a new one", what,
                      path, file_kind(st.st_mode),
                      appended ? "results are appended to a regular file, opened without following a link"
                               : "output files are written atomically (temporary file + rename), which would "
                                 "replace it");
        return;
    }
    const int e = errno;
    LATTICE_CHECK(e == ENOENT, "{} {}: cannot access ({})", what, path, std::strerror(e));
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    mode_t mode = 0;
    const PathKind k = path_kind(dir, what + " folder", &mode);
    LATTICE_CHECK(k == PathKind::kDirectory, "{} {}: folder {} {}", what, path, dir,
                  k == PathKind::kMissing ? "does not exist" : "is not a directory");
    LATTICE_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "{} {}: folder {} is not writable ({})", what, path, dir,
                  std::strerror(errno));
}

// check_output_path, then removes a previous file at `path` (see the header comment).
inline void prepare_output(const std::string& path, const std::string& what) {
    check_output_path(path, what);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        LATTICE_FAIL("{} {}: cannot remove the previous file ({})", what, path, std::strerror(errno));
}

class AtomicWriter {
public:
    AtomicWriter(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
        check_output_path(path_, what_);
        tmp_ = path_ + ".tmp." + std::to_string(::getpid());
        fd_ = FileDescriptor(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666));
        if (fd_.get() < 0) {
            const int e = errno;
            tmp_.clear();
            LATTICE_FAIL("{} {}: cannot create the temporary file {}.tmp.{} ({})", what_, path_, path_, ::getpid(),
                         std::strerror(e));
        }
    }
    ~AtomicWriter() {
        if (!tmp_.empty()) {
            fd_.reset();
            ::unlink(tmp_.c_str());
        }
    }
    AtomicWriter(const AtomicWriter&) = delete;
    AtomicWriter& operator=(const AtomicWriter&) = delete;

    void write(const void* data, size_t n) {
        const auto* p = static_cast<const char*>(data);
        while (n > 0) {
            const ssize_t w = ::write(fd_.get(), p, n);
            if (w < 0 && errno == EINTR) continue;
            LATTICE_CHECK(w > 0, "{} {}: write failed ({})", what_, path_, std::strerror(w < 0 ? errno : EIO));
            p += w;
            n -= size_t(w);
        }
    }
    void write(std::string_view s) { write(s.data(), s.size()); }

    // Closes the temporary file and renames it over the target; Error (temporary removed) on failure.
    // `durable`: the data is synced before the rename and the folder after it.
    void commit(bool durable = false) {
        LATTICE_CHECK(!durable || ::fdatasync(fd_.get()) == 0 || errno == EINVAL, "{} {}: flush failed ({})", what_,
                      path_, std::strerror(errno));
        LATTICE_CHECK(fd_.close_checked() == 0, "{} {}: write failed at close ({})", what_, path_,
                      std::strerror(errno));
        check_output_path(path_, what_);
        LATTICE_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "{} {}: rename from {} failed ({})", what_, path_,
                      tmp_, std::strerror(errno));
        tmp_.clear();
        if (!durable) return;
        const size_t slash = path_.rfind('/');
        const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
        FileDescriptor d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        LATTICE_CHECK(d.get() >= 0 && (::fsync(d.get()) == 0 || errno == EINVAL), "{} {}: flush of folder {} failed ({})",
                      what_, path_, dir, std::strerror(errno));
    }

private:
    std::string path_, what_, tmp_;
    FileDescriptor fd_;
};

class AppendFile {
public:
    // Each complete line of the file at open (without its newline) and its 1-based number.
    using LineVisitor = std::function<void(std::string_view line, int64_t line_no)>;

    // Opens (creates) `path`, locks it, cuts a partial last line, and hands each complete line to
    // `each_line`: streamed, one line in memory at a time, however long the file is.
    AppendFile(std::string path, std::string what, const LineVisitor& each_line = {})
        : path_(std::move(path)), what_(std::move(what)) {
        struct stat st {};
        if (::stat(path_.c_str(), &st) == 0)
            LATTICE_CHECK(S_ISREG(st.st_mode), "{} {}: not a regular file ({})", what_, path_, file_kind(st.st_mode));
        fd_ = FileDescriptor(::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644));
        LATTICE_CHECK(fd_.get() >= 0, "{} {}: cannot open ({})", what_, path_, std::strerror(errno));
        lock();
        recover(each_line);
    }
    int64_t cut_bytes() const { return cut_; }  // of a partial last line removed
    // Empties the file (synced): a job that starts over.
    void truncate() {
        LATTICE_CHECK(::ftruncate(fd_.get(), 0) == 0, "{} {}: cannot empty it ({})", what_, path_, std::strerror(errno));
        sync();
    }
    int64_t syncs() const { return syncs_; }    // fdatasync calls so far

    // Durability in bounded steps: appended lines reach the disk (fdatasync) once `every_lines` of
    // them wait, and by sync_if_due() once the oldest has waited `every_seconds`.
    void set_sync(int64_t every_lines, double every_seconds) {
        sync_lines_ = std::max<int64_t>(every_lines, 1);
        sync_seconds_ = every_seconds;
    }

    // One line (without its newline), in one write.
    void append(std::string_view line) {
        std::string s(line);
        s += '\n';
        size_t off = 0;
        while (off < s.size()) {
            const ssize_t n = ::write(fd_.get(), s.data() + off, s.size() - off);
            if (n < 0 && errno == EINTR) continue;
            LATTICE_CHECK(n > 0, "{} {}: write failed ({})", what_, path_, std::strerror(n < 0 ? errno : EIO));
            off += size_t(n);
        }
        if (unsynced_++ == 0) oldest_ = std::chrono::steady_clock::now();
        if (unsynced_ >= sync_lines_) sync();
    }
    // Syncs when a line has waited every_seconds; cheap otherwise (call it from a job's loop).
    void sync_if_due() {
        if (unsynced_ > 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest_).count() >= sync_seconds_)
            sync();
    }
    void sync() {
        LATTICE_CHECK(::fdatasync(fd_.get()) == 0 || errno == EINVAL, "{} {}: flush failed ({})", what_, path_,
                      std::strerror(errno));
        unsynced_ = 0;
        ++syncs_;
    }
    // Flushes to the disk and closes; Error naming the file when either fails.
    void close() {
        sync();
        LATTICE_CHECK(fd_.close_checked() == 0, "{} {}: close failed ({})", what_, path_, std::strerror(errno));
    }

private:
    void lock() {
        struct flock fl {};
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;  // the whole file (l_start 0, l_len 0)
        if (::fcntl(fd_.get(), F_SETLK, &fl) == 0) return;
        const int e = errno;
        LATTICE_CHECK(e == EACCES || e == EAGAIN, "{} {}: cannot lock ({})", what_, path_, std::strerror(e));
        struct flock who {};
        who.l_type = F_WRLCK;
        who.l_whence = SEEK_SET;
        const bool known = ::fcntl(fd_.get(), F_GETLK, &who) == 0 && who.l_type != F_UNLCK;
        LATTICE_FAIL("{} {}: in use by another job ({}): two jobs on one output would run every request twice; "
                     "wait for it or pick another file",
                     what_, path_, known ? "pid " + std::to_string(who.l_pid) : std::string("its pid unknown"));
    }
    // Bytes [at, at + n) of the file into buf (n of them, or Error).
    void read_at(char* buf, size_t n, off_t at) const {
        for (size_t got = 0; got < n;) {
            const ssize_t r = ::pread(fd_.get(), buf + got, n - got, at + off_t(got));
            if (r < 0 && errno == EINTR) continue;
            LATTICE_CHECK(r >= 0, "{} {}: read failed ({})", what_, path_, std::strerror(errno));
            LATTICE_CHECK(r > 0, "{} {}: file shrank while being read", what_, path_);
            got += size_t(r);
        }
    }
    void recover(const LineVisitor& each_line) {
        struct stat st {};
        LATTICE_CHECK(::fstat(fd_.get(), &st) == 0, "{} {}: cannot stat ({})", what_, path_, std::strerror(errno));
        const off_t size = st.st_size;
        std::vector<char> buf(size_t(1) << 16);
        off_t keep = 0;  // after the last newline, found from the end
        for (off_t end = size; end > 0 && keep == 0;) {
            const off_t start = std::max<off_t>(0, end - off_t(buf.size()));
            read_at(buf.data(), size_t(end - start), start);
            for (off_t i = end - start; i > 0; --i)
                if (buf[size_t(i - 1)] == '\n') {
                    keep = start + i;
                    break;
                }
            end = start;
        }
        if (keep < size) {  // a line cut short by a crash: drop it, its job reruns it
            LATTICE_CHECK(::ftruncate(fd_.get(), keep) == 0, "{} {}: cannot cut the partial last line ({})", what_,
                          path_, std::strerror(errno));
            cut_ = int64_t(size - keep);
        }
        std::string line;
        int64_t line_no = 0;
        for (off_t at = 0; at < keep;) {
            const size_t n = size_t(std::min<off_t>(off_t(buf.size()), keep - at));
            read_at(buf.data(), n, at);
            at += off_t(n);
            for (size_t pos = 0; pos < n;) {
                const char* nl = static_cast<const char*>(std::memchr(buf.data() + pos, '\n', n - pos));
                const size_t end = nl ? size_t(nl - buf.data()) : n;
                line.append(buf.data() + pos, end - pos);
                pos = end;
                if (!nl) break;
                ++pos;
                ++line_no;
                if (each_line) each_line(line, line_no);
                line.clear();
            }
        }
    }
    std::string path_, what_;
    FileDescriptor fd_;
    int64_t cut_ = 0, syncs_ = 0, unsynced_ = 0, sync_lines_ = 1;
    double sync_seconds_ = 0;
    std::chrono::steady_clock::time_point oldest_{};
};

}  // namespace lattice
