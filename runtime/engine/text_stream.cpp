// TextStream (see text_stream.h).
#include "runtime/engine/text_stream.h"

#include <algorithm>

#include "base/error.h"

namespace lattice {

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stop_strings)
    : dec_(tok), stops_(std::move(stop_strings)) {
    for (const std::string& s : stops_) {
        LATTICE_CHECK(!s.empty(), "stop strings must not be empty");
        max_stop_ = std::max(max_stop_, s.size());
    }
}

TextStream::Piece TextStream::push(int32_t token) {
    Piece p;
    if (stopped_) return p;
    pending_ += dec_.push(token);
    // The earliest complete stop string in what is not shown yet. A stop string cannot start inside
    // the shown text: we only show text that no stop string can still cover.
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
        p.text = pending_.substr(0, cut);
        p.stop = true;
        stopped_ = true;
        pending_.clear();
        shown_ += p.text;
        return p;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const std::string& s : stops_)
        for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
            if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
    p.text = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    shown_ += p.text;
    return p;
}

std::string TextStream::finish() {
    if (stopped_) return {};
    std::string rest = pending_ + dec_.finish();
    pending_.clear();
    // The final flush may complete a stop string only if the decoder held bytes back.
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) cut = std::min(cut, rest.find(s));
    if (cut != std::string::npos) {
        rest.resize(cut);
        stopped_ = true;
    }
    shown_ += rest;
    return rest;
}

}  // namespace lattice
