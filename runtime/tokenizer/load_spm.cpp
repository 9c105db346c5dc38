// Loading SentencePiece tokenizer.model files.
// tokenizer.model is a protobuf ModelProto. It is parsed by hand (about 100 lines) rather than
// through libsentencepiece because (a) we need only a handful of fields, (b) the library's parser
// would add sentencepiece + protobuf to every binary that links lattice_runtime, and (c) a small
// bounds-checked reader is easy to fuzz: every length is checked against the bytes left, the file
// size and piece count are capped. Fields read (field numbers from sentencepiece_model.proto):
//   ModelProto  1: repeated SentencePiece {1 piece, 2 score (float), 3 type}
//               2: TrainerSpec {3 model_type (2 = BPE), 35 byte_fallback, 40 unk_id, 41 bos_id,
//                               42 eos_id, 43 pad_id}
//               3: NormalizerSpec {1 name, 3 add_dummy_prefix, 4 remove_extra_whitespaces}
// Only BPE models (Llama 2 family) are accepted; unigram models are rejected with a message.
// Normalization other than "identity" / removing extra whitespace is not implemented: such models
// are rejected (Llama 2 uses identity with remove_extra_whitespaces = false).
#include <cstring>

#include "base/error.h"
#include "base/file.h"
#include "runtime/tokenizer/load_util.h"

namespace lattice {

namespace {

constexpr size_t kMaxModelBytes = size_t(64) << 20;

class ProtoReader {
public:
    ProtoReader(std::string_view data, const std::string& path) : d_(data), path_(path) {}
    bool done() const { return p_ >= d_.size(); }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            LATTICE_CHECK(p_ < d_.size(), "tokenizer {}: not a SentencePiece model (truncated varint at byte {})",
                          path_, p_);
            const auto b = uint8_t(d_[p_++]);
            v |= uint64_t(b & 0x7F) << shift;
            if (!(b & 0x80)) return v;
        }
        LATTICE_FAIL("tokenizer {}: not a SentencePiece model (varint longer than 10 bytes at byte {})", path_, p_);
    }
    std::string_view bytes(size_t n) {
        LATTICE_CHECK(n <= d_.size() - p_,
                      "tokenizer {}: not a SentencePiece model (field of {} bytes overruns the message at byte {})",
                      path_, n, p_);
        std::string_view s = d_.substr(p_, n);
        p_ += n;
        return s;
    }
    // Reads a field key; returns false at the end of the message.
    bool key(uint32_t& field, uint32_t& wire) {
        if (done()) return false;
        const uint64_t k = varint();
        field = uint32_t(k >> 3);
        wire = uint32_t(k & 7);
        return true;
    }
    uint64_t scalar(uint32_t wire) {
        switch (wire) {
            case 0:
                return varint();
            case 1: {
                std::string_view b = bytes(8);
                uint64_t v;
                std::memcpy(&v, b.data(), 8);
                return v;
            }
            case 5: {
                std::string_view b = bytes(4);
                uint32_t v;
                std::memcpy(&v, b.data(), 4);
                return v;
            }
            default:
                LATTICE_FAIL(
                    "tokenizer {}: not a SentencePiece model (protobuf wire type {} at byte {} is not a scalar)", path_,
                    wire, p_);
        }
    }
    std::string_view message(uint32_t wire) {
        LATTICE_CHECK(wire == 2,
                      "tokenizer {}: not a SentencePiece model (expected a length-delimited field, got wire type {})",
                      path_, wire);
        return bytes(size_t(std::min<uint64_t>(varint(), d_.size())));
    }
    void skip(uint32_t wire) {
        if (wire == 2)
            message(wire);
        else
            scalar(wire);
    }

private:
    std::string_view d_;
    const std::string& path_;
    size_t p_ = 0;
};

std::string read_file_limited(const std::string& path, size_t limit) {
    return read_regular_file(path, int64_t(limit), "tokenizer");
}

}  // namespace

std::string tokenizer_read_file(const std::string& path, size_t limit) {
    return read_file_limited(path, limit);
}

TokenizerSpec load_sentencepiece_model(const std::string& path) {
    return parse_sentencepiece_model(read_file_limited(path, kMaxModelBytes), path);
}

TokenizerSpec parse_sentencepiece_model(std::string_view data, const std::string& path) {
    LATTICE_CHECK(data.size() <= kMaxModelBytes, "tokenizer {}: {} bytes exceed the {} byte limit", path, data.size(),
                  kMaxModelBytes);
    TokenizerSpec spec;
    spec.kind = TokenizerKind::kSentencePiece;
    spec.source = path;
    spec.add_bos = true;
    int64_t model_type = 1;  // proto default: UNIGRAM
    int64_t unk = 0, bos = 1, eos = 2, pad = -1;
    std::string norm_name;
    bool remove_extra_ws = true;
    ProtoReader top(data, path);
    uint32_t field, wire;
    while (top.key(field, wire)) {
        if (field == 1) {
            ProtoReader piece(top.message(wire), path);
            std::string text;
            float score = 0.f;
            uint64_t type = 1;
            while (piece.key(field, wire)) {
                if (field == 1)
                    text = std::string(piece.message(wire));
                else if (field == 2 && wire == 5) {
                    const uint32_t b = uint32_t(piece.scalar(wire));
                    std::memcpy(&score, &b, 4);
                } else if (field == 3 && wire == 0)
                    type = piece.varint();
                else
                    piece.skip(wire);
            }
            LATTICE_CHECK(type >= 1 && type <= 6, "tokenizer {}: piece {} has unknown type {}", path,
                          spec.tokens.size(), type);
            spec.tokens.push_back(std::move(text));
            spec.scores.push_back(score);
            spec.types.push_back(TokenType(type));
        } else if (field == 2) {
            ProtoReader t(top.message(wire), path);
            while (t.key(field, wire)) {
                if (wire != 0) {
                    t.skip(wire);
                    continue;
                }
                const auto v = int64_t(int32_t(uint32_t(t.varint())));
                if (field == 3)
                    model_type = v;
                else if (field == 40)
                    unk = v;
                else if (field == 41)
                    bos = v;
                else if (field == 42)
                    eos = v;
                else if (field == 43)
                    pad = v;
            }
        } else if (field == 3) {
            ProtoReader n(top.message(wire), path);
            while (n.key(field, wire)) {
                if (field == 1 && wire == 2)
                    norm_name = std::string(n.message(wire));
                else if (field == 3 && wire == 0)
                    spec.add_space_prefix = n.varint() != 0;
                else if (field == 4 && wire == 0)
                    remove_extra_ws = n.varint() != 0;
                else
                    n.skip(wire);
            }
        } else {
            top.skip(wire);
        }
    }
    LATTICE_CHECK(!spec.tokens.empty(), "tokenizer {}: no pieces (not a SentencePiece model?)", path);
    LATTICE_CHECK(model_type == 2, "tokenizer {}: SentencePiece model type {} is not supported (only BPE = 2)", path,
                  model_type);
    LATTICE_CHECK(norm_name.empty() || norm_name == "identity",
                  "tokenizer {}: SentencePiece normalizer '{}' is not supported (only identity)", path, norm_name);
    LATTICE_CHECK(!remove_extra_ws, "tokenizer {}: remove_extra_whitespaces normalization is not supported", path);
    const auto n = int64_t(spec.tokens.size());
    auto id_or_none = [&](int64_t v) { return (v >= 0 && v < n) ? int32_t(v) : -1; };
    spec.unk_id = id_or_none(unk);
    spec.bos_id = id_or_none(bos);
    spec.eos_id = id_or_none(eos);
    spec.pad_id = id_or_none(pad);
    return spec;
}

}  // namespace lattice
