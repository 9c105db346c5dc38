// StepPlan: what every rank does in one engine step, decided by the leader (world rank 0) and sent
// to every other rank as one message. Token i of the batch belongs to seqs[s] (s found by the
// running sums of `count`), sits at position seqs[s].start + (i - first token of s), and its K/V go
// to block tables[s * width + position / block_size]. After the forward, the sampler rank samples
// the last token of every sequence with `sample` set (kStep; with n_draft drafts, the last n_draft + 1
// rows: speculative decoding), or returns the logits of every token
// (kScore). The token history a repetition penalty reads travels in the plan (recent_ids) because
// only the leader knows it (prefix-cached prompt blocks are never fed to the other ranks).
// Wire format: a flat little-endian byte string (encode/decode), version-tagged and bounds-checked
// on decode; no rank but the leader ever sees a request body.
//
// Block tables travel as changes (version 3): the leader and every follower each keep a PlanTables,
// the tables the followers know by sequence id. encode_plan writes each sequence's table as a
// change against the leader's copy (kept, blocks appended, or replaced: a new or re-admitted
// sequence) and updates it; decode_plan applies the change to the follower's copy and rebuilds
// StepPlan::tables [seqs x width] from it. `released` ids leave both copies (before the changes
// are applied). A decode step sends no block unless one was appended, so a plan's size grows
// with the sequences and tokens in it, not with their context (as vLLM's cached-request deltas).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine/sampler.h"

namespace lattice {

struct PlanSeq {
    int64_t id = 0;         // the leader's sequence id (keys the sampler's per-sequence state)
    int32_t start = 0;      // position of the first fed token
    int32_t count = 0;      // tokens fed this step
    bool sample = false;    // sample after this step
    bool ban_stop = false;  // min_tokens not reached: eos and stop ids may not be sampled
    int32_t n_ban = 0;      // ... namely the next n_ban entries of StepPlan::ban_ids (in plan order)
    int32_t n_recent = 0;   // sampled with a repetition penalty: the sequence's last n_recent tokens are
                            // the next n_recent entries of StepPlan::recent_ids (in plan order)
    bool masked = false;    // structured output: only the tokens of the next mask of StepPlan::masks may be sampled
    int32_t n_draft = 0;    // speculative decoding: the last n_draft fed tokens are drafts. The sampler checks
                            // them in order against the rows before them (Sampler::verify) and returns the
                            // accepted ones and one more token: 1 .. n_draft + 1 tokens (sampled, not masked,
                            // no recent ids, no top logprobs)
    SamplingParams sampling;
    int32_t lora = 0;       // LoRA slot of the sequence's adapter on every rank (Model::set_lora); 0: the base
};

inline constexpr int32_t kMaxLoraSlots = 4096;

// A LoRA adapter every rank puts into (path empty: removes from) a slot of its model before the plan's
// forward (Model::set_lora): the leader's LoraRegistry (lora_registry.h) decides, the ranks each read
// their shard of the file.
struct LoraLoad {
    int32_t slot = 0;
    std::string name, path;
};

struct StepPlan {
    enum class Kind : int32_t { kStep = 1, kScore = 2, kHeartbeat = 3, kShutdown = 4 };
    Kind kind = Kind::kStep;
    int64_t number = 0;           // step number (every rank checks it arrives in order)
    std::vector<int32_t> tokens;  // fed ids, sequence after sequence
    std::vector<PlanSeq> seqs;
    int32_t width = 0;              // block table width (blocks per sequence at most)
    std::vector<int32_t> tables;    // [seqs.size(), width], unused entries -1
    std::vector<int32_t> ban_ids;   // per ban_stop sequence, in plan order, its n_ban banned ids
    std::vector<int32_t> recent_ids;  // per sequence with n_recent > 0, in plan order, its last tokens
    std::vector<int64_t> released;  // sequences that ended: the sampler rank drops their state
    int32_t mask_width = 0;         // words per mask: (vocab + 31) / 32 (0 when no sequence is masked)
    std::vector<uint32_t> masks;    // per masked sequence, in plan order: bit id % 32 of word id / 32 set =
                                    // token id allowed (runtime/engine/grammar.h)
    std::vector<LoraLoad> loras;    // adapters into their slots before this plan runs

    int64_t sampled() const;  // sequences with `sample` set
    // Token slots of the sampler's answer: 1 + n_draft per sampled sequence, in plan order (a sequence's
    // tokens first, the slots it leaves unused -1).
    int64_t sample_slots() const;
    bool empty() const { return seqs.empty(); }
};

// The block tables one side of the plan exchange knows, by sequence id (each row: the sequence's
// blocks, no trailing -1). The leader's copy and every follower's stay equal, plan after plan.
struct PlanTables {
    std::unordered_map<int64_t, std::vector<int32_t>> rows;
    const std::vector<int32_t>* find(int64_t id) const;
    bool operator==(const PlanTables& o) const { return rows == o.rows; }
};

// Encodes p's tables as changes against `known` and updates it to p's.
std::vector<uint8_t> encode_plan(const StepPlan& p, PlanTables& known);
// Throws Error on a malformed message (it names the field), `known` then unchanged; otherwise
// applies the plan's changes to `known` and fills the plan's full tables from it.
StepPlan decode_plan(const uint8_t* data, int64_t size, PlanTables& known);
// Self-contained forms (every table in full, against an empty PlanTables).
std::vector<uint8_t> encode_plan(const StepPlan& p);
StepPlan decode_plan(const uint8_t* data, int64_t size);

// What the sampler rank returns for each sampled sequence, in plan order.
struct SampledToken {
    int32_t token = 0;
    float logprob = 0;  // log-probability of `token` under the model's distribution (temperature 1)
};

}  // namespace lattice
