// base/file.h: the checks on paths named from outside.
//  - path_kind: missing (also under a file, or a dangling symlink), regular, directory, other (FIFO);
//    a symlink loop throws naming the path;
//  - open_regular_file / read_regular_file: refuse a missing path, a folder, a FIFO (returning at once:
//    never opened, so never blocked on) and a character device, each message naming the role, the path
//    and what the path is; a regular file's descriptor is blocking and close-on-exec; the size limit
//    is exact (limit bytes read, limit + 1 refused); contents with NUL bytes arrive whole;
//  - check_output_path / prepare_output: a folder, a symlink, a FIFO or a missing folder are refused
//    and left as they were (for a file appended in place, the message says so, not "rename"); a
//    previous result is removed;
//  - AtomicWriter: the target changes only at commit; a writer dropped or failing (a write refused
//    by RLIMIT_FSIZE, the target turned into a folder before commit) leaves the old target and no
//    temporary file; a stale temporary of the same name is refused and not deleted;
//  - AppendFile: lines appended one write each, handed to the visitor on reopen with their numbers
//    (a line longer than the reader's chunk whole, an empty one too); a partial last line (a job
//    killed mid-write), also one longer than a chunk, is cut on reopen and reported, the complete ones
//    kept; fdatasync every N lines and once a line has waited S seconds; a folder is refused;
//    while one process holds the file another is refused, naming the holder's pid; truncate() starts
//    over (AtomicWriter::commit(true), the durable commit, beside it);
//  - "[perm]" (its own ctest entry, test_kernels_cpu_perm): an unreadable file and an unwritable folder
//    are refused; SKIP as root, whom permissions do not stop.
#include "base/file.h"
#include "tests/test_skip.h"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace lattice;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the temporary directory, removed with everything in it.
struct Scratch {
    std::string dir;
    Scratch() {
        std::string tmpl = (fs::temp_directory_path() / "lattice-file-XXXXXX").string();
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        dir = tmpl;
    }
    ~Scratch() {
        std::error_code ec;
        fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(dir, ec);
    }
    std::string operator/(const std::string& name) const { return dir + "/" + name; }
};

void write_file(const std::string& path, const std::string& content) {
    std::ofstream f(path, std::ios::binary);
    f << content;
    REQUIRE(f.good());
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The message of the Error `fn` throws; "" when it returns.
template <class Fn>
std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.message();
    }
    return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// How many names `dir` holds (a temporary left behind shows here).
int count_entries(const std::string& dir) {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
    return n;
}

// A FIFO nobody has open: opening it for writing without a reader fails with ENXIO, so this says
// whether some descriptor still holds its read end (a leaked or blocked open would).
bool fifo_has_reader(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
}

// Guards a case that would block forever if the code under test opened a FIFO blocking: the
// default SIGALRM action ends the process (a failure) instead of a hang until the ctest timeout.
struct HangGuard {
    HangGuard() { ::alarm(120); }
    ~HangGuard() { ::alarm(0); }
};

}  // namespace

TEST_CASE("path_kind: missing, regular, directory, other; a symlink loop throws naming the path") {
    Scratch s;
    write_file(s / "f", "x");
    REQUIRE(::mkfifo((s / "fifo").c_str(), 0600) == 0);
    REQUIRE(::symlink("f", (s / "link").c_str()) == 0);
    REQUIRE(::symlink("nowhere", (s / "dangling").c_str()) == 0);
    REQUIRE(::symlink("loop", (s / "loop").c_str()) == 0);
    mode_t mode = 0;
    CHECK(path_kind(s / "absent", "thing") == PathKind::kMissing);
    CHECK(path_kind(s / "f/below", "thing") == PathKind::kMissing);  // ENOTDIR
    CHECK(path_kind(s / "dangling", "thing") == PathKind::kMissing);
    CHECK(path_kind(s / "f", "thing", &mode) == PathKind::kRegular);
    CHECK(S_ISREG(mode));
    CHECK(path_kind(s / "link", "thing") == PathKind::kRegular);  // follows symlinks
    CHECK(path_kind(s.dir, "thing", &mode) == PathKind::kDirectory);
    CHECK(S_ISDIR(mode));
    CHECK(path_kind(s / "fifo", "thing", &mode) == PathKind::kOther);
    CHECK(S_ISFIFO(mode));
    const std::string m = error_of([&] { path_kind(s / "loop", "model file"); });
    CHECK(has(m, "model file " + (s / "loop") + ": cannot access"));
}

TEST_CASE("open_regular_file: refuses a missing path, a folder, a FIFO and a device, naming role and path") {
    Scratch s;
    HangGuard guard;
    REQUIRE(::mkfifo((s / "pipe").c_str(), 0600) == 0);
    std::string m = error_of([&] { open_regular_file(s / "absent", "config file"); });
    CHECK(has(m, "config file " + (s / "absent") + ": no such file"));
    m = error_of([&] { open_regular_file(s.dir, "tokenizer"); });
    CHECK(has(m, "tokenizer " + s.dir + " is a directory, not a regular file"));
    // A FIFO without a writer: a blocking open would never return (the guard ends the process).
    m = error_of([&] { open_regular_file(s / "pipe", "model shard"); });
    CHECK(has(m, "model shard " + (s / "pipe") + " is a FIFO (named pipe), not a regular file"));
    CHECK_FALSE(fifo_has_reader(s / "pipe"));  // and no descriptor was left on it
    m = error_of([&] { read_regular_file(s / "pipe", 1 << 20, "prompt file"); });
    CHECK(has(m, "prompt file " + (s / "pipe") + " is a FIFO (named pipe)"));
    m = error_of([&] { open_regular_file("/dev/null", "config file"); });
    CHECK(has(m, "config file /dev/null is a character device, not a regular file"));
}

TEST_CASE("open_regular_file: a regular file (or a symlink to one) opens blocking, close-on-exec, with its size") {
    Scratch s;
    write_file(s / "f", std::string(1000, 'a'));
    REQUIRE(::symlink("f", (s / "link").c_str()) == 0);
    for (const std::string& p : {s / "f", s / "link"}) {
        CAPTURE(p);
        int64_t size = -1;
        FileDescriptor fd = open_regular_file(p, "file", &size);
        REQUIRE(fd.get() >= 0);
        CHECK(size == 1000);
        const int fl = ::fcntl(fd.get(), F_GETFL);
        CHECK((fl & O_NONBLOCK) == 0);  // opened O_NONBLOCK for the FIFO race, then made blocking
        CHECK((fl & O_ACCMODE) == O_RDONLY);
        CHECK((::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0);
        char c = 0;
        CHECK(::read(fd.get(), &c, 1) == 1);
        CHECK(c == 'a');
    }
}

TEST_CASE("read_regular_file: exact content, the limit inclusive, one byte over refused") {
    Scratch s;
    std::string content = "line one\n";
    content.push_back('\0');
    content += std::string(4096 + 3, 'z');  // not a multiple of any buffer size
    write_file(s / "f", content);
    write_file(s / "empty", "");
    const int64_t n = int64_t(content.size());
    CHECK(read_regular_file(s / "f", n, "file") == content);
    CHECK(read_regular_file(s / "empty", 0, "file").empty());
    const std::string m = error_of([&] { read_regular_file(s / "f", n - 1, "chat template"); });
    CHECK(has(m, "chat template " + (s / "f") + ": " + std::to_string(n) + " bytes exceed the " + std::to_string(n - 1) +
                     " byte limit"));
    CHECK(has(error_of([&] { read_regular_file(s / "absent", 10, "file"); }), "no such file"));
}

TEST_CASE("check_output_path: new or regular files pass; a folder, symlink, FIFO or missing folder are refused") {
    Scratch s;
    write_file(s / "old", "previous");
    write_file(s / "target", "keep");
    REQUIRE(::mkdir((s / "sub").c_str(), 0700) == 0);
    REQUIRE(::symlink("target", (s / "link").c_str()) == 0);
    REQUIRE(::mkfifo((s / "fifo").c_str(), 0600) == 0);
    CHECK_NOTHROW(check_output_path(s / "new", "output"));
    CHECK_NOTHROW(check_output_path(s / "old", "output"));
    CHECK(has(error_of([&] { check_output_path("", "stats file"); }), "stats file: empty output path"));
    std::string m = error_of([&] { check_output_path(s / "sub", "results file"); });
    CHECK(has(m, "results file " + (s / "sub") + " is a directory"));
    m = error_of([&] { check_output_path(s / "link", "results file"); });
    CHECK(has(m, "results file " + (s / "link") + " is a symbolic link"));  // a rename would replace the link
    m = error_of([&] { check_output_path(s / "fifo", "results file"); });
    CHECK(has(m, "is a FIFO (named pipe)"));
    CHECK(has(m, "temporary file + rename"));
    // A file appended in place (lattice batch --output) is refused for what it is, not for a rename.
    m = error_of([&] { check_output_path(s / "fifo", "--output", true); });
    CHECK(has(m, "appended to a regular file"));
    CHECK(m.find("rename") == std::string::npos);
    m = error_of([&] { check_output_path(s / "nodir/out", "results file"); });
    CHECK(has(m, "results file " + (s / "nodir/out") + ": folder " + (s / "nodir") + " does not exist"));
    m = error_of([&] { check_output_path(s / "old/out", "results file"); });  // a file where the folder should be
    CHECK(has(m, "results file " + (s / "old/out")));
    // Nothing was touched.
    CHECK(slurp(s / "old") == "previous");
    CHECK(slurp(s / "target") == "keep");
    CHECK(fs::is_directory(s / "sub"));
    CHECK(fs::is_fifo(s / "fifo"));
}

TEST_CASE("prepare_output: removes a previous result, refuses (and keeps) what it must not replace") {
    Scratch s;
    write_file(s / "old", "previous run");
    write_file(s / "target", "keep");
    REQUIRE(::symlink("target", (s / "link").c_str()) == 0);
    REQUIRE(::mkdir((s / "sub").c_str(), 0700) == 0);
    prepare_output(s / "old", "output");
    CHECK_FALSE(fs::exists(s / "old"));
    CHECK_NOTHROW(prepare_output(s / "never-there", "output"));
    CHECK(has(error_of([&] { prepare_output(s / "link", "output"); }), "is a symbolic link"));
    CHECK(fs::is_symlink(s / "link"));
    CHECK(slurp(s / "target") == "keep");
    CHECK(has(error_of([&] { prepare_output(s / "sub", "output"); }), "is a directory"));
    CHECK(fs::is_directory(s / "sub"));
}

TEST_CASE("AtomicWriter: the target changes only at commit; a dropped writer leaves the old file and no temporary") {
    Scratch s;
    const std::string out = s / "out.json";
    write_file(out, "old");
    {
        AtomicWriter w(out, "output");
        w.write("new ");
        w.write(std::string_view("content"));
        CHECK(slurp(out) == "old");  // written beside it, not into it
        CHECK(count_entries(s.dir) == 2);
        w.commit();
    }
    CHECK(slurp(out) == "new content");
    CHECK(count_entries(s.dir) == 1);
    {
        AtomicWriter w(out, "output");
        w.write("half");
    }  // dropped without commit: an error unwound past it
    CHECK(slurp(out) == "new content");
    CHECK(count_entries(s.dir) == 1);
    {  // a new file
        AtomicWriter w(s / "fresh", "output");
        w.commit();
    }
    CHECK(fs::is_regular_file(s / "fresh"));
    CHECK(fs::file_size(s / "fresh") == 0);
}

TEST_CASE("AtomicWriter: refuses a folder or FIFO target, a missing folder, and a stale temporary (kept)") {
    Scratch s;
    REQUIRE(::mkdir((s / "sub").c_str(), 0700) == 0);
    REQUIRE(::mkfifo((s / "fifo").c_str(), 0600) == 0);
    CHECK(has(error_of([&] { AtomicWriter w(s / "sub", "output"); }), "is a directory"));
    CHECK(has(error_of([&] { AtomicWriter w(s / "fifo", "output"); }), "is a FIFO"));
    CHECK(has(error_of([&] { AtomicWriter w(s / "nodir/out", "output"); }), "does not exist"));
    CHECK(count_entries(s.dir) == 2);
    // Another writer's temporary of the same name (same pid: a previous writer in this process that
    // never cleaned up, or a pid reused): refused, and not deleted.
    const std::string out = s / "out";
    const std::string stale = out + ".tmp." + std::to_string(::getpid());
    write_file(stale, "someone else's");
    const std::string m = error_of([&] { AtomicWriter w(out, "output"); });
    CHECK(has(m, "output " + out + ": cannot create the temporary file " + stale));
    CHECK(slurp(stale) == "someone else's");
    CHECK_FALSE(fs::exists(out));
}

TEST_CASE("AtomicWriter: a target turned into a folder before commit is refused; the temporary goes") {
    Scratch s;
    const std::string out = s / "out";
    {
        AtomicWriter w(out, "output");
        w.write("data");
        REQUIRE(::mkdir(out.c_str(), 0700) == 0);  // appears while the run writes
        CHECK(has(error_of([&] { w.commit(); }), "is a directory"));
    }
    CHECK(fs::is_directory(out));
    CHECK(fs::is_empty(out));
    CHECK(count_entries(s.dir) == 1);  // the folder only, no temporary
}

TEST_CASE("AtomicWriter: a failing write (RLIMIT_FSIZE) throws naming the path and leaves the old file whole") {
    Scratch s;
    const std::string out = s / "out";
    write_file(out, "old content");
    std::string m;
    {
        // The file-size limit makes write() fail with EFBIG (SIGXFSZ ignored) once the temporary
        // reaches 4 KiB; both are restored when the block ends, however it ends.
        struct FileSizeLimit {
            rlimit old_lim{};
            struct sigaction old_sa {};
            FileSizeLimit() {
                REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
                struct sigaction ign {};
                ign.sa_handler = SIG_IGN;
                REQUIRE(::sigaction(SIGXFSZ, &ign, &old_sa) == 0);
                rlimit lim = old_lim;
                lim.rlim_cur = 4096;
                REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
            }
            ~FileSizeLimit() {
                ::setrlimit(RLIMIT_FSIZE, &old_lim);
                ::sigaction(SIGXFSZ, &old_sa, nullptr);
            }
        } limit;
        AtomicWriter w(out, "results file");
        m = error_of([&] {
            w.write(std::string(10000, 'x'));
            w.commit();
        });
    }
    CHECK(has(m, "results file " + out + ": write failed"));
    CHECK(slurp(out) == "old content");
    CHECK(count_entries(s.dir) == 1);
}

TEST_CASE("AppendFile: lines survive a reopen; a partial last line is cut and reported; a folder is refused") {
    Scratch tmp;
    const std::string path = tmp / "out.jsonl";
    std::vector<std::string> seen;
    std::vector<int64_t> numbers;
    const auto visit = [&](std::string_view l, int64_t no) {
        seen.emplace_back(l);
        numbers.push_back(no);
    };
    {
        AppendFile f(path, "--output", visit);
        CHECK(seen.empty());
        CHECK(f.cut_bytes() == 0);
        f.append("{\"a\": 1}");
        f.append(std::string(100000, 'x'));  // longer than the reader's 64 KiB chunk
        f.append("");
        f.append("second");
        f.close();
    }
    {
        std::ofstream torn(path, std::ios::app);
        torn << "{\"torn";  // a job killed in the middle of a line
    }
    {
        AppendFile f(path, "--output", visit);
        CHECK(seen == std::vector<std::string>{"{\"a\": 1}", std::string(100000, 'x'), "", "second"});
        CHECK(numbers == std::vector<int64_t>{1, 2, 3, 4});
        CHECK(f.cut_bytes() == 6);
        f.append("third");
        f.close();
    }
    std::ifstream in(path);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The torn bytes are gone, not glued to "third".
    CHECK(all == "{\"a\": 1}\n" + std::string(100000, 'x') + "\n\nsecond\nthird\n");
    {
        std::ofstream torn(path, std::ios::app);
        torn << std::string(70000, 'y');  // a torn line longer than a chunk: found from the end all the same
    }
    seen.clear();
    {
        AppendFile f(path, "--output", visit);
        CHECK(f.cut_bytes() == 70000);
        CHECK(seen.size() == 5);
        CHECK(seen.back() == "third");
    }
    REQUIRE(::mkdir((tmp / "dir").c_str(), 0755) == 0);
    CHECK_THROWS_WITH_AS(AppendFile(tmp / "dir", "--output"), doctest::Contains("not a regular file"), Error);
}

TEST_CASE("AppendFile: lines reach the disk every N lines, and once one has waited S seconds") {
    Scratch tmp;
    AppendFile f(tmp / "out.jsonl", "--output");
    f.set_sync(3, 3600);
    for (int i = 0; i < 7; ++i) f.append("line");
    CHECK(f.syncs() == 2);  // after lines 3 and 6
    f.sync_if_due();
    CHECK(f.syncs() == 2);  // line 7 has waited less than an hour
    f.set_sync(3, 0);
    f.sync_if_due();
    CHECK(f.syncs() == 3);  // now it is due
    f.sync_if_due();
    CHECK(f.syncs() == 3);  // nothing waits
    f.close();
}

TEST_CASE("AppendFile::truncate starts over; AtomicWriter::commit(true) leaves the whole file") {
    Scratch tmp;
    const std::string path = tmp / "out.jsonl";
    {
        AppendFile f(path, "--output");
        f.append("one");
        f.append("two");
        f.truncate();
        CHECK(slurp(path).empty());
        f.append("three");
        f.close();
    }
    CHECK(slurp(path) == "three\n");
    AtomicWriter w(tmp / "side", "fingerprint");
    w.write("{}\n");
    w.commit(true);
    CHECK(slurp(tmp / "side") == "{}\n");
}

TEST_CASE("AppendFile: a second process on the same file is refused, naming the holder's pid") {
    Scratch tmp;
    const std::string path = tmp / "out.jsonl";
    AppendFile held(path, "--output");
    int from_child[2];
    REQUIRE(::pipe(from_child) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the second job: report what opening the file said
        std::string msg;
        try {
            AppendFile again(path, "--output");
            msg = "opened";
        } catch (const Error& e) {
            msg = e.message();
        }
        [[maybe_unused]] const ssize_t w = ::write(from_child[1], msg.data(), msg.size());
        ::_exit(0);
    }
    ::close(from_child[1]);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = ::read(from_child[0], buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(from_child[0]);
    CHECK(has(got, "in use by another job"));
    CHECK(has(got, "pid " + std::to_string(::getpid())));
    held.close();
}

TEST_CASE("[perm] an unreadable file and an unwritable folder are refused, naming the path") {
    if (::geteuid() == 0) LATTICE_SKIP("running as root: file permissions do not stop root, nothing to check");
    Scratch s;
    write_file(s / "secret", "x");
    REQUIRE(::chmod((s / "secret").c_str(), 0) == 0);
    std::string m = error_of([&] { read_regular_file(s / "secret", 10, "config file"); });
    CHECK(has(m, "config file " + (s / "secret") + ": cannot open"));
    REQUIRE(::mkdir((s / "ro").c_str(), 0500) == 0);
    m = error_of([&] { check_output_path(s / "ro/out", "output"); });
    CHECK(has(m, "output " + (s / "ro/out") + ": folder " + (s / "ro") + " is not writable"));
    CHECK(has(error_of([&] { AtomicWriter w(s / "ro/out", "output"); }), "is not writable"));
}
