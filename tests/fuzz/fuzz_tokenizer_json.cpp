// libFuzzer target for the tokenizer file parsers (tokenizer.json and SentencePiece tokenizer.model)
// and for encode/decode on whatever vocabulary they accept. First input byte picks the parser
// (even: JSON, odd: protobuf); the rest is the file. Accepted files are then used to encode a fixed
// text and the input itself (special parsing on and off) and to decode and stream-decode the ids.
// Invariants checked: lattice::Error is the only exception, ids are in range, decoding never fails.
// encode may refuse text holding a character the vocab cannot encode; the next text is tried then.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "runtime/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    try {
        lattice::TokenizerSpec spec = (data[0] & 1) ? lattice::parse_sentencepiece_model(body, "fuzz.model")
                                                    : lattice::parse_tokenizer_json(body, "fuzz.json");
        lattice::Tokenizer tok(std::move(spec));
        for (std::string_view text : {std::string_view("Hello world!  <s> 123 \xF0\x9F\xA6\x99 \xFF"), body}) {
            for (bool special : {false, true}) {
                std::vector<int32_t> ids;
                try {
                    ids = tok.encode(text.substr(0, 4096), true, special);
                } catch (const lattice::Error&) {
                    continue;  // a character the vocab cannot encode at all (no piece, byte or unk)
                }
                for (int32_t id : ids)
                    if (id < 0 || id >= tok.vocab_size()) std::abort();
                const std::string all = tok.decode(ids, special);
                lattice::StreamDecoder sd(tok, special);
                std::string streamed;
                for (int32_t id : ids) streamed += sd.push(id);
                streamed += sd.finish();
                if (streamed != all) std::abort();
            }
        }
    } catch (const lattice::Error&) {
    }
    return 0;
}
