// `lattice chat`: an interactive conversation with the model on one rank. Each line typed is a user
// turn; the whole conversation (optional --system first) is rendered through the model's chat
// template (launch/generate_common.h encode_chat, the one `generate --chat` uses) and the answer is
// streamed as it is generated (flushed per token), then kept in the conversation.
//   /reset          forget the conversation (the --system message stays)
//   /exit, /quit    leave (as Ctrl-D does)
//   Ctrl-C          while answering: stop the answer (what was shown stays in the conversation) and
//                   return to the prompt; at the prompt: leave. Exit status 0 either way.
// Context: a conversation that no longer fits (its rendering plus one new token beyond the context)
// loses its oldest exchanges, said on stderr; a message that cannot fit even alone is refused (not
// sent). An answer cut by the context ends with a note on stderr.
// Seed: --seed, else random (printed on stderr); turn k (from 0) samples with seed + k, so a
// conversation typed again with the same --seed gets the same answers.
// The "> " prompt is written only when stdin is a terminal; piped lines work too (one answer line
// each). --verbose-prompt prints each turn's prompt token count and ids on stderr.
// Ranks: one. A multi-rank chat would need every rank to follow each turn's engine run; `lattice
// serve` is the multi-rank conversational front, so --tp/--pp > 1 is refused here.
// Signals: SIGINT sets a flag and writes a byte to a self-pipe; the prompt waits with poll() on stdin
// and that pipe, so a Ctrl-C between printing the prompt and reading is never lost.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "launch/generate_common.h"
#include "runtime/engine/client.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

struct ChatArgs {
    ModelArgs model;
    std::string system;
    int64_t max_new_tokens = 0;
    SamplingArgs sampling;
    bool verbose_prompt = false;
};

volatile std::sig_atomic_t g_interrupted = 0;
int g_wake[2] = {-1, -1};  // self-pipe: the SIGINT handler writes, the prompt's poll() wakes

extern "C" void on_chat_sigint(int) {
    g_interrupted = 1;
    const int saved = errno;
    const char b = 1;
    [[maybe_unused]] const ssize_t n = ::write(g_wake[1], &b, 1);  // non-blocking: a full pipe is fine
    errno = saved;
}

void install_sigint() {
    LATTICE_CHECK(::pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) == 0, "chat: pipe: {}", std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_chat_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
}

// Forgets interrupts so far (the one that stopped an answer must not also end the prompt after it).
void clear_interrupt() {
    char buf[64];
    while (::read(g_wake[0], buf, sizeof buf) > 0) {
    }
    g_interrupted = 0;
}

// Lines from stdin, waiting with poll() on stdin and the self-pipe.
class LineReader {
public:
    enum class Status { kLine, kEof, kInterrupted };
    Status next(std::string* line) {
        for (;;) {
            if (const size_t nl = buf_.find('\n'); nl != std::string::npos) {
                line->assign(buf_, 0, nl);
                buf_.erase(0, nl + 1);
                return Status::kLine;
            }
            if (eof_) {
                if (buf_.empty()) return Status::kEof;
                *line = std::exchange(buf_, {});
                return Status::kLine;
            }
            pollfd fds[2] = {{0, POLLIN, 0}, {g_wake[0], POLLIN, 0}};
            const int r = ::poll(fds, 2, -1);
            if (r < 0 && errno == EINTR) continue;
            LATTICE_CHECK(r >= 0, "chat: poll: {}", std::strerror(errno));
            if (fds[1].revents & POLLIN) return Status::kInterrupted;
            if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                char b[4096];
                const ssize_t n = ::read(0, b, sizeof b);
                if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
                LATTICE_CHECK(n >= 0, "chat: stdin: read failed ({})", std::strerror(errno));
                LATTICE_CHECK(buf_.size() + size_t(n) <= size_t(kMaxPromptBytes), "chat: a line of more than {} bytes",
                              kMaxPromptBytes);
                if (n == 0)
                    eof_ = true;
                else
                    buf_.append(b, size_t(n));
            }
        }
    }

private:
    std::string buf_;
    bool eof_ = false;
};

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r");
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

class Chat {
public:
    Chat(ChatArgs& args, EngineClient& client, const Tokenizer& tok, SamplingParams sp, int64_t max_position)
        : args_(args),
          client_(client),
          tok_(tok),
          sp_(sp),
          grammar_(args.sampling.grammar()),
          ctx_(client.context()),
          max_position_(max_position) {
        reset();
    }

    void reset() {
        msgs_.clear();
        if (!args_.system.empty()) msgs_.push_back({"system", args_.system});
    }

    // One user turn: fit the conversation into the context, stream the answer, keep it.
    void turn(const std::string& message) {
        msgs_.push_back({"user", message});
        std::optional<std::vector<int32_t>> prompt = fit();
        if (!prompt) return;
        if (args_.verbose_prompt)
            print_stderr(fmt::format("chat: prompt of {} tokens: {}\n", prompt->size(), fmt::join(*prompt, " ")));
        ClientRequest req;
        req.prompt = std::move(*prompt);
        req.max_tokens = args_.max_new_tokens > 0 ? args_.max_new_tokens : ClientRequest::kRestOfContext;
        req.sampling = sp_;
        req.sampling.seed = sp_.seed + uint64_t(turns_++);
        req.stop = args_.sampling.stop;
        req.grammar = grammar_;
        req.lora = args_.model.run_lora("chat");
        const std::vector<ClientOutput> outs = client_.run({req}, [&](size_t, const ClientEvent& ev) {
            if (!ev.text.empty()) {
                write_stdout(ev.text);
                flush_stdout();
            }
            return !g_interrupted;
        });
        write_stdout("\n");
        flush_stdout();
        const ClientOutput& r = outs[0];
        if (r.finish == FinishReason::kCancelled)
            print_stderr("chat: answer stopped (Ctrl-C); Ctrl-C at the prompt or Ctrl-D leaves\n");
        else if (r.context_full)
            print_stderr(fmt::format(
                "chat: the context of {} positions is full: the answer is cut; the oldest messages go next turn "
                "(or /reset)\n",
                ctx_));
        else if (r.finish == FinishReason::kLength && args_.max_new_tokens > 0)
            print_stderr(fmt::format("chat: the answer reached --max-new-tokens {}\n", args_.max_new_tokens));
        msgs_.push_back({"assistant", r.text});
    }

private:
    // The conversation's tokens, after dropping the oldest exchanges that do not fit; nullopt (and
    // the new message dropped) when the newest message cannot fit even alone.
    std::optional<std::vector<int32_t>> fit() {
        const size_t first = !args_.system.empty() ? 1 : 0;  // the system message always stays
        size_t dropped = 0;
        for (;;) {
            std::vector<int32_t> ids = encode_chat(tok_, msgs_, "chat");
            if (int64_t(ids.size()) < ctx_) {
                if (dropped > 0)
                    print_stderr(fmt::format(
                        "chat: the conversation no longer fits the context of {} positions: dropped its {} oldest "
                        "message(s); {} tokens remain\n",
                        ctx_, dropped, ids.size()));
                return ids;
            }
            if (msgs_.size() - first <= 1) {
                print_stderr(fmt::format(
                    "chat: your message needs {} tokens with the chat template, more than the context of {} positions "
                    "leaves room for: not sent (shorten it, or raise --max-seq up to {})\n",
                    ids.size(), ctx_, max_position_));
                msgs_.pop_back();
                return std::nullopt;
            }
            // The oldest user message and the answer that followed it.
            msgs_.erase(msgs_.begin() + ptrdiff_t(first));
            ++dropped;
            if (msgs_.size() - first > 1 && msgs_[first].role == "assistant") {
                msgs_.erase(msgs_.begin() + ptrdiff_t(first));
                ++dropped;
            }
        }
    }

    ChatArgs& args_;
    EngineClient& client_;
    const Tokenizer& tok_;
    SamplingParams sp_;
    std::shared_ptr<const Grammar> grammar_;  // --json-schema ... (every turn's answer follows it)
    int64_t ctx_, max_position_;
    std::vector<ChatMessage> msgs_;
    int64_t turns_ = 0;
};

int run_chat(ChatArgs& args) {
    LATTICE_CHECK(args.model.tp * args.model.pp == 1,
                  "lattice chat runs on one rank (--tp {} --pp {} asked for {}); for a multi-rank model use lattice "
                  "serve and a chat client",
                  args.model.tp, args.model.pp, args.model.tp * args.model.pp);
    LATTICE_CHECK(!args.model.random_weights, "lattice chat needs a model with a tokenizer and a chat template");
    if (args.model.model.empty()) args.model.model = default_model_path();
    // The tokenizer and the sampling options are checked before the (long) load.
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(args.model.model);
    encode_chat(*tok, {{"user", "hi"}}, "chat");  // a model without a chat template fails here
    check_utf8(args.system, "--system");
    const SamplingParams sp = args.sampling.resolve();
    RankRuntime rt = load_model(args.model);
    LATTICE_CHECK(rt.world.world == 1,
                  "lattice chat runs on one rank, this job has {} (start it without mpirun, or use lattice serve)",
                  rt.world.world);
    const bool tty = ::isatty(0) == 1;
    if (sp.temperature > 0) print_stderr(fmt::format("seed: {}\n", sp.seed));  // (greedy draws nothing)
    if (tty)
        print_stderr(
            "chat: type a message and press Enter. /reset forgets the conversation; Ctrl-C stops an answer; Ctrl-D, "
            "/exit or Ctrl-C at the prompt leaves.\n");
    install_sigint();
    EngineClient client(*rt.engine, tok.get());
    Chat chat(args, client, *tok, sp, rt.model->config().max_position);
    LineReader in;
    for (;;) {
        clear_interrupt();  // the Ctrl-C that stopped an answer must not also leave at this prompt
        if (tty) {
            write_stdout("> ");
            flush_stdout();
        }
        std::string line;
        const LineReader::Status st = in.next(&line);
        if (st != LineReader::Status::kLine) {
            if (tty) write_stdout("\n");
            break;  // Ctrl-D (end of input) or Ctrl-C at the prompt
        }
        const std::string cmd = trim(line);
        if (cmd.empty()) continue;
        if (cmd == "/exit" || cmd == "/quit") break;
        if (cmd == "/reset") {
            chat.reset();
            print_stderr("chat: conversation cleared\n");
            continue;
        }
        if (line.ends_with("\r")) line.pop_back();
        try {
            check_utf8(line, "chat: your message");
        } catch (const Error& e) {
            print_stderr(fmt::format("{}; not sent\n", e.message()));
            continue;
        }
        chat.turn(line);
    }
    flush_stdout();
    return 0;
}

}  // namespace

void add_chat_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<ChatArgs>();
    args->sampling.params.temperature = 0.7f;
    args->sampling.params.top_p = 0.9f;
    auto* cmd = app.add_subcommand("chat", "Talk with the model: a conversation in the terminal (one rank)");
    args->model.add_to(cmd);
    cmd->add_option("--system", args->system, "System message opening the conversation (default: the template's)");
    cmd->add_option("-n,--max-new-tokens", args->max_new_tokens, "Tokens per answer at most (0: the rest of the context)")
        ->check(int_range(0, INT32_MAX))
        ->capture_default_str();
    args->sampling.add_to(cmd);
    cmd->add_flag("--verbose-prompt", args->verbose_prompt, "Print each turn's prompt (token count and ids) on stderr");
    cmd->footer(
        "In the chat: /reset forgets the conversation, Ctrl-C stops an answer, Ctrl-D or /exit leaves.\n"
        "Examples:\n"
        "  lattice chat\n"
        "  lattice chat --system \"You are a terse assistant.\" --temperature 0 --max-seq 2048\n"
        "  lattice chat --model model.gguf --seed 7 --repeat-penalty 1.1 --min-p 0.05");
    cmd->callback([&run, args] { run = [args] { return run_chat(*args); }; });
}

}  // namespace lattice
