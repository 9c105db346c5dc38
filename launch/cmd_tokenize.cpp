// `lattice tokenize [--tokenizer PATH] --text TEXT [--bos] [--special]`: prints the token ids,
// space-separated. `--decode 1,2,3` prints the text of ids instead; `--pieces` also lists each
// token's piece. PATH: tokenizer.model, tokenizer.json, a .gguf file or a model directory (default:
// the built-in model's).
// Exactly one of --text and --decode is required (--text "" encodes the empty text).
#include <fmt/format.h>

#include <charconv>
#include <memory>
#include <string>
#include <vector>

#include "launch/cli.h"
#include "launch/cli_common.h"
#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

namespace {

struct TokenizeOptions {
    std::string tokenizer;
    std::string text;
    std::string decode;
    bool bos = false;
    bool special = false;
    bool pieces = false;
    bool info = false;
};

std::vector<int32_t> parse_ids(const std::string& list) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos < list.size()) {
        size_t end = list.find_first_of(", ", pos);
        if (end == std::string::npos) end = list.size();
        if (end > pos) {
            int32_t v = 0;
            const auto [p, ec] = std::from_chars(list.data() + pos, list.data() + end, v);
            LATTICE_CHECK(ec == std::errc() && p == list.data() + end, "tokenize: '{}' is not a token id",
                          list.substr(pos, end - pos));
            ids.push_back(v);
        }
        pos = end + 1;
    }
    return ids;
}

}  // namespace

void add_tokenize_command(CLI::App& app, CommandRun& run) {
    auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
    auto o = std::make_shared<TokenizeOptions>();
    cmd->add_option("--tokenizer,-m,--model", o->tokenizer,
                    "tokenizer.model, tokenizer.json, .gguf file or model directory (default: the built-in model's)")
        ->default_str("built-in");
    auto* text = cmd->add_option("--text", o->text, "text to encode");
    auto* dec = cmd->add_option("--decode", o->decode, "comma-separated token ids to decode");
    text->excludes(dec);
    cmd->add_flag("--bos", o->bos, "prepend the BOS token");
    cmd->add_flag("--special", o->special, "parse special tokens written in the text (<|im_start|> ...)");
    cmd->add_flag("--pieces", o->pieces, "also print id:piece pairs, one per line");
    cmd->add_flag("--info", o->info, "print the tokenizer's description first");
    cmd->footer(R"(Examples:
  lattice tokenize --text "Hello world" --pieces
  lattice tokenize --decode 19556,905
  lattice tokenize --tokenizer /models/llama-2-7b --text "Hello" --bos)");
    cmd->callback([&run, o, text, dec] {
        if (text->count() + dec->count() != 1)
            throw CLI::ValidationError("tokenize", "give --text TEXT to encode or --decode IDS to decode");
        const bool decode = dec->count() != 0;
        run = [o, decode] {
            std::unique_ptr<Tokenizer> tok = load_tokenizer(o->tokenizer.empty() ? default_model_path() : o->tokenizer);
            if (o->info) print_stdout("{}\n", tok->describe());
            if (decode) {
                const std::vector<int32_t> ids = parse_ids(o->decode);
                for (int32_t id : ids)
                    LATTICE_CHECK(id >= 0 && id < tok->vocab_size(), "tokenize: id {} outside vocab of {}", id,
                                  tok->vocab_size());
                print_stdout("{}\n", tok->decode(ids, o->special));
                return 0;
            }
            const std::vector<int32_t> ids = tok->encode(o->text, o->bos, o->special);
            std::string line;
            for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
            print_stdout("{}\n", line);
            if (o->pieces)
                for (int32_t id : ids) print_stdout("{}\t{}\n", id, tok->token_text(id));
            return 0;
        };
    });
}

}  // namespace lattice
