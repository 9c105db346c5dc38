// Tokenizer encoding speed (MB of UTF-8 input per second) per tokenizer in ../shared/tokenizers.
// Input: a deterministic ~5 MB text (default) made of generated English-like sentences with
// numbers and punctuation, interleaved with the multilingual .inp test strings (emoji, Cyrillic,
// Khmer, CJK); or any file given with --text FILE. Each tokenizer encodes the whole text as one
// string (so long inputs must be near-linear), best of --reps runs; decode speed is reported too.
// There is no hardware ceiling to compare with; the reference point is the bytes/token ratio and
// the relative cost of the two algorithms. Usage:
//   bench_tokenizer [--mb 5] [--reps 2] [--text FILE] [--json FILE] [--shared DIR]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace lattice;

namespace {

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", path.c_str());
        std::exit(1);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string make_text(const std::string& shared, size_t bytes) {
    static const char* kWords[] = {
        "the",       "of",          "and",          "to",          "in",         "is",        "that",
        "for",       "it",          "as",           "was",         "with",       "be",        "by",
        "on",        "not",         "he",           "this",        "are",        "or",        "his",
        "from",      "at",          "which",        "but",         "have",       "an",        "had",
        "they",      "you",         "were",         "their",       "one",        "all",       "we",
        "can",       "her",         "has",          "there",       "been",       "if",        "more",
        "when",      "will",        "would",        "who",         "so",         "no",        "model",
        "tensor",    "parallel",    "inference",    "token",       "engine",     "latency",   "throughput",
        "memory",    "bandwidth",   "quantization", "distributed", "pipeline",   "attention", "language",
        "network",   "Transformer", "GPU",          "Llama",       "server",     "request",   "batch",
        "cache",     "kernel",      "performance",  "weights",     "activation", "scheduler", "benchmark",
        "tokenizer", "vocabulary",  "unicode",      "character",   "sequence",   "don't",     "it's",
        "we'll",     "they're",     "I've",         "Mr.",         "e.g.",       "i.e.",      "state-of-the-art",
        "fine-tuned"};
    const std::string raw = slurp(shared + "/ggml-vocab-llama-spm.gguf.inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::string inp;
    for (size_t start = 0, at; start < raw.size(); start = at + sep.size()) {
        at = raw.find(sep, start);
        if (at == std::string::npos) at = raw.size();
        inp.append(raw, start, at - start);
        inp += '\n';
    }
    std::mt19937 rng(1234);
    std::string out;
    out.reserve(bytes + 4096);
    const size_t n_words = sizeof(kWords) / sizeof(kWords[0]);
    while (out.size() < bytes) {
        for (int sentence = 0; sentence < 40; ++sentence) {
            const int len = 5 + int(rng() % 20);
            for (int w = 0; w < len; ++w) {
                std::string word = kWords[rng() % n_words];
                if (w == 0) word[0] = char(std::toupper(word[0]));
                if (rng() % 17 == 0) word = std::to_string(rng() % 100000);
                out += word;
                out += (w + 1 == len) ? (rng() % 5 == 0 ? "?" : ".") : (rng() % 9 == 0 ? ", " : " ");
            }
            out += (rng() % 6 == 0) ? "\n\n" : " ";
        }
        out += inp;
    }
    out.resize(bytes);
    // Do not end inside a UTF-8 character.
    while (!out.empty() && (uint8_t(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && uint8_t(out.back()) >= 0xC0) out.pop_back();
    return out;
}

// ../shared next to the checkout this file was compiled from (override with --shared).
std::string default_shared() {
    return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "shared").string();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    double mb = 5.0;
    int reps = 2;
    std::string text_file, json_file, shared = default_shared() + "/tokenizers";
    for (int i = 1; i < argc; ++i) {
        auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
        if (arg("--mb"))
            mb = std::atof(argv[++i]);
        else if (arg("--reps"))
            reps = std::max(1, std::atoi(argv[++i]));
        else if (arg("--text"))
            text_file = argv[++i];
        else if (arg("--json"))
            json_file = argv[++i];
        else if (arg("--shared"))
            shared = std::string(argv[++i]) + "/tokenizers";
        else {
            std::fprintf(stderr, "usage: %s [--mb 5] [--reps 2] [--text FILE] [--json FILE] [--shared DIR]\n", argv[0]);
            return 2;
        }
    }
    const std::string text = text_file.empty() ? make_text(shared, size_t(mb * 1e6)) : slurp(text_file);
    const double text_mb = double(text.size()) * 1e-6;
    fmt::print("text: {:.2f} MB ({})\n\n", text_mb, text_file.empty() ? "generated" : text_file);
    fmt::print("{:<28} {:>8} {:>10} {:>11} {:>10} {:>11} {:>10}\n", "tokenizer", "load s", "tokens", "bytes/tok",
               "encode s", "enc MB/s", "dec MB/s");
    std::vector<std::string> rows;
    const char* files[] = {"llama2-tokenizer.model",    "ggml-vocab-llama-spm.gguf", "llama3-tokenizer.json",
                           "ggml-vocab-llama-bpe.gguf", "ggml-vocab-gpt-2.gguf",     "ggml-vocab-qwen2.gguf"};
    try {
        for (const char* f : files) {
            auto t0 = std::chrono::steady_clock::now();
            std::unique_ptr<Tokenizer> tok = load_tokenizer(shared + "/" + f);
            const double load_s = seconds_since(t0);
            std::vector<int32_t> ids;
            double enc_s = 1e30, dec_s = 1e30;
            for (int r = 0; r < reps; ++r) {
                t0 = std::chrono::steady_clock::now();
                ids = tok->encode(text);
                enc_s = std::min(enc_s, seconds_since(t0));
            }
            t0 = std::chrono::steady_clock::now();
            const std::string back = tok->decode(ids);
            dec_s = seconds_since(t0);
            if (back != text) {
                std::fprintf(stderr, "bench_tokenizer: %s: decode(encode(text)) != text\n", f);
                return 1;
            }
            const double bpt = double(text.size()) / double(std::max<size_t>(ids.size(), 1));
            fmt::print("{:<28} {:>8.2f} {:>10} {:>11.2f} {:>10.3f} {:>11.2f} {:>10.1f}\n", f, load_s, ids.size(), bpt,
                       enc_s, text_mb / enc_s, text_mb / dec_s);
            rows.push_back(
                fmt::format("{{\"tokenizer\": \"{}\", \"load_s\": {:.4f}, \"tokens\": {}, \"bytes_per_token\": "
                            "{:.4f}, \"encode_s\": {:.4f}, \"encode_mb_s\": {:.3f}, \"decode_mb_s\": {:.3f}}}",
                            f, load_s, ids.size(), bpt, enc_s, text_mb / enc_s, text_mb / dec_s));
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
        return 1;
    }
    if (!json_file.empty()) {
        std::ofstream out(json_file);
        out << "{\"bench\": \"tokenizer\", \"text_bytes\": " << text.size() << ", \"reps\": " << reps
            << ", \"results\": [\n";
        for (size_t i = 0; i < rows.size(); ++i) out << "  " << rows[i] << (i + 1 < rows.size() ? ",\n" : "\n");
        out << "]}\n";
        fmt::print("\nwrote {}\n", json_file);
    }
    return 0;
}
