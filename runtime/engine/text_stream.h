// TextStream: generated tokens to the text a client sees, with stop strings — the one place their
// semantics live (`lattice generate`, `lattice batch` and `lattice serve` all use it):
//  - text is decoded incrementally (never half a UTF-8 character, runtime/tokenizer's StreamDecoder);
//  - a stop string ends the output at its first occurrence anywhere in the generated text (also
//    across token boundaries); the stop string itself and everything after it are not returned
//    (OpenAI / vLLM semantics);
//  - text that could still become the start of a stop string is held back until it cannot.
// Token-level stops (eos, stop ids) are the engine's (Scheduler); their text is not shown either
// when `hide_token` is called for them.
#pragma once

#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

class TextStream {
public:
    TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings);

    struct Piece {
        std::string text;   // newly visible text (may be empty)
        bool stop = false;  // a stop string was completed: nothing more follows
    };
    // The next generated token. After a stop, further pushes return nothing.
    Piece push(int32_t token);
    // The end of the output (not by a stop string): whatever was held back.
    std::string finish();
    bool stopped() const { return stopped_; }
    const std::string& text() const { return shown_; }  // everything returned so far

private:
    StreamDecoder dec_;
    std::vector<std::string> stops_;
    std::string pending_;  // decoded, not yet shown (might begin a stop string)
    std::string shown_;
    bool stopped_ = false;
    size_t max_stop_ = 0;
};

}  // namespace lattice
