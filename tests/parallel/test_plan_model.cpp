// The planner's model (parallel/plan_model.h): memory per device against figures worked out by hand,
// what fits where, the roofline's regimes, and the ordering of the recommendation. (Its speed
// predictions are validated against measured runs in benchmarks/validate_plan.py, checked by
// tests/launch/test_plan.py.)
#include <doctest/doctest.h>

#include "base/error.h"
#include "parallel/plan_model.h"

#include <cmath>
#include <string>

using namespace lattice;

namespace {
constexpr double kGiB = double(int64_t(1) << 30);

ModelDims llama70() {
    ModelDims d{80, 64, 8, 28672, 32000, "llama-2-70b"};
    d.hidden = 8192;
    d.head_dim = 128;
    return d;
}
ModelDims tinyllama() {
    ModelDims d{22, 32, 4, 5632, 32000, "tinyllama-1.1b"};
    d.hidden = 2048;
    d.head_dim = 64;
    return d;
}

PlanRequest a100(int gpus, PlanQuant q) {
    PlanRequest r;
    r.model = llama70();
    r.device = find_device("a100-pcie-40gb");
    r.link = find_link(r.device.link);
    r.inter_node = find_link("ib-hdr");
    r.devices = gpus;
    r.quant = q;
    return r;
}
// TinyLlama on `devices` CPU ranks of one node (the table's cpu entry, shared memory between them).
PlanRequest tinyllama_on_cpu(int devices) {
    PlanRequest c;
    c.model = tinyllama();
    c.device = find_device("cpu");
    c.link = find_link("shm");
    c.inter_node = find_link("ib-hdr");
    c.devices = devices;
    return c;
}
}  // namespace

TEST_CASE("kv cache and activation bytes follow the shard") {
    const ModelDims m = llama70();
    // 80 layers x 2 (k, v) x 4096 positions x 8 kv heads x 128 x 2 bytes = 1.25 GiB for the whole model
    CHECK(kv_cache_bytes(m, 1, 80, 4096, 2.0) == doctest::Approx(1.25 * kGiB));
    // tp 4: 2 kv heads per rank; tp 16: kv heads replicated, one per rank (not 0.5)
    CHECK(kv_cache_bytes(m, 4, 80, 4096, 2.0) == doctest::Approx(1.25 * kGiB / 4));
    CHECK(kv_cache_bytes(m, 16, 80, 4096, 2.0) == doctest::Approx(1.25 * kGiB / 8));
    // activations scale with tokens; the last stage adds f32 logits of the whole vocabulary
    const double a1 = activation_bytes(m, 4, 1, 2.0, false), a256 = activation_bytes(m, 4, 256, 2.0, false);
    CHECK(a256 == doctest::Approx(256 * a1));
    CHECK(activation_bytes(m, 4, 256, 2.0, true) - a256 == doctest::Approx(256.0 * 4.0 * 32000));
}

TEST_CASE("70B weights per GPU: int8 on 4 and fp16 on 8 hold the same bytes; fp16 on 4 does not fit a long batch") {
    // 69.0e9 parameters: int8 / 4 = 17.2 GB, fp16 / 8 = 17.2 GB (= 16.1 GiB), plus scales and the
    // unsharded norms; the embedding rows live on the first stage, the head's on the last.
    const auto i8 = predict_layout(a100(4, PlanQuant::kW8A8), 4, 1);
    const auto f16 = predict_layout(a100(8, PlanQuant::kFp16), 8, 1);
    CHECK(i8.memory.weights / kGiB == doctest::Approx(16.2).epsilon(0.02));
    CHECK(f16.memory.weights / kGiB == doctest::Approx(16.06).epsilon(0.02));
    CHECK(i8.fits);
    CHECK(f16.fits);
    PlanRequest r = a100(4, PlanQuant::kFp16);
    r.batch = 32;
    r.context = 4096;
    const auto f16x4 = predict_layout(r, 4, 1);
    CHECK(f16x4.memory.weights / kGiB == doctest::Approx(32.1).epsilon(0.02));
    CHECK(f16x4.memory.kv / kGiB == doctest::Approx(32 * 1.25 / 4).epsilon(1e-6));
    CHECK_FALSE(f16x4.fits);
    r.quant = PlanQuant::kW8A8;
    CHECK(predict_layout(r, 4, 1).fits);
}

TEST_CASE("layouts the model or the node cannot take say why") {
    PlanRequest r = a100(6, PlanQuant::kW8A8);
    const auto plans = plan_layouts(r);
    REQUIRE(plans.size() == 4);  // 1x6, 2x3, 3x2, 6x1
    int infeasible = 0;
    for (const auto& p : plans) {
        if (p.tp == 3 || p.tp == 6) {
            CHECK_FALSE(p.feasible);
            CHECK(p.why_not.find("tp") != std::string::npos);
            ++infeasible;
        }
    }
    CHECK(infeasible == 2);
    // infeasible ones sort last
    CHECK(plans.front().feasible);
    CHECK_FALSE(plans.back().feasible);
    // a TP group that spans nodes is predicted but flagged (lattice-mpirun refuses it) and sorts after the
    // layouts that keep TP inside a node; one that does not cover whole nodes stays impossible
    PlanRequest two = a100(8, PlanQuant::kW8A8);
    two.nodes = 2;
    CHECK(predict_layout(two, 8, 1).feasible);
    CHECK(predict_layout(two, 8, 1).tp_crosses_nodes);
    CHECK_FALSE(predict_layout(two, 4, 2).tp_crosses_nodes);
    const auto sorted = plan_layouts(two);
    CHECK_FALSE(sorted.front().tp_crosses_nodes);
    PlanRequest six = a100(6, PlanQuant::kW8A8);
    six.nodes = 3;  // 2 ranks a node: tp 3 would cover a node and a half
    CHECK_FALSE(predict_layout(six, 3, 2).feasible);
}

TEST_CASE("links: names, GB/s,latency and the refusals") {
    CHECK(parse_link("ib-hdr100").bw_gbs == doctest::Approx(11.5));
    CHECK(parse_link("eth25").alpha_us == doctest::Approx(10.0));
    const LinkSpec l = parse_link("12.5,5");
    CHECK(l.bw_gbs == doctest::Approx(12.5));
    CHECK(l.alpha_us == doctest::Approx(5.0));
    CHECK(l.name == "12.5GB/s,5us");
    for (const char* bad : {"12.5", "x,5", "0,5", "5,-1", "5,5x", ",5", "infiniband"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_link(bad), Error);
    }
}

TEST_CASE("the inter-node link carries what crosses nodes: TP all-reduces of a group that spans them, PP hops") {
    // 70B fp16, batch 64, 2 nodes of 4 A100 PCIe.
    auto req = [](int nodes, const std::string& link, const std::string& inter) {
        PlanRequest r = a100(8, PlanQuant::kFp16);
        r.nodes = nodes;
        r.batch = 64;
        r.link = parse_link(link);
        r.inter_node = parse_link(inter);
        return r;
    };
    // With the inter-node link equal to the node's, two nodes predict what one does (the link is all
    // that differs) ...
    const auto one = predict_layout(req(1, "pcie4", "pcie4"), 8, 1);
    const auto same = predict_layout(req(2, "pcie4", "pcie4"), 8, 1);
    CHECK(same.decode_tokens_per_s == doctest::Approx(one.decode_tokens_per_s));
    CHECK(same.ttft_ms == doctest::Approx(one.ttft_ms));
    // ... a slower one slows tp 8 (160 all-reduces a step over it) far more than tp 4 x pp 2 (one hop).
    const auto tp8_ib = predict_layout(req(2, "pcie4", "ib-hdr100"), 8, 1);
    const auto tp8_eth = predict_layout(req(2, "pcie4", "eth25"), 8, 1);
    const auto pp_ib = predict_layout(req(2, "pcie4", "ib-hdr100"), 4, 2);
    const auto pp_eth = predict_layout(req(2, "pcie4", "eth25"), 4, 2);
    const auto pp_one = predict_layout(req(1, "pcie4", "pcie4"), 4, 2);
    CHECK(tp8_ib.decode_tokens_per_s < one.decode_tokens_per_s);
    CHECK(tp8_eth.decode_tokens_per_s < tp8_ib.decode_tokens_per_s);
    CHECK(tp8_eth.comm_share > one.comm_share);
    // (the decode of 2 micro-batches waits on the slower stage, not the hop; a lone prompt crosses it)
    CHECK(pp_eth.decode_tokens_per_s <= pp_ib.decode_tokens_per_s);
    CHECK(pp_eth.ttft_ms > pp_ib.ttft_ms);
    CHECK(pp_ib.decode_tokens_per_s <= pp_one.decode_tokens_per_s);
    const double tp8_loss = 1.0 - tp8_eth.decode_tokens_per_s / one.decode_tokens_per_s;
    const double pp_loss = 1.0 - pp_eth.decode_tokens_per_s / pp_one.decode_tokens_per_s;
    CHECK(tp8_loss > 3.0 * pp_loss);
    // the prefill of tp 8 moves batch x prompt tokens through every all-reduce: slower over ethernet
    CHECK(tp8_eth.prefill_tokens_per_s < one.prefill_tokens_per_s);
    // A hop across nodes carries one copy of the rows per TP rank, inside the sending stage's step: one
    // prompt of 256 tokens (one chunk) at tp 4 x pp 2 takes 4 x 256 x 8192 x 2 bytes / (1 GB/s) longer
    // over a 1 GB/s link than over a 1000 GB/s one.
    PlanRequest slow = req(2, "pcie4", "1,0"), fast = req(2, "pcie4", "1000,0");
    slow.batch = fast.batch = 1;
    slow.prompt = fast.prompt = 256;
    const double extra_ms = predict_layout(slow, 4, 2).ttft_ms - predict_layout(fast, 4, 2).ttft_ms;
    CHECK(extra_ms == doctest::Approx(4.0 * 256 * 8192 * 2 * (1e-9 - 1e-12) * 1e3).epsilon(0.01));
}

TEST_CASE("decode at batch 1 is memory bound: int8 beats fp16, and tensor parallelism pays on GPUs") {
    const auto i8x4 = predict_layout(a100(4, PlanQuant::kW8A8), 4, 1);
    const auto f16x4 = predict_layout(a100(4, PlanQuant::kFp16), 4, 1);
    CHECK(i8x4.bound == "memory");
    CHECK(f16x4.bound == "memory");
    // half the bytes, the same all-reduces: between 1.4x and 2x
    CHECK(i8x4.decode_tokens_per_s > 1.4 * f16x4.decode_tokens_per_s);
    CHECK(i8x4.decode_tokens_per_s < 2.0 * f16x4.decode_tokens_per_s);
    const auto i8 = predict_layout(a100(8, PlanQuant::kW8A8), 8, 1);
    // the roofline floor: weight bytes / achievable bandwidth bounds a token from below
    const DeviceSpec& d = find_device("a100-pcie-40gb");
    CHECK(i8.decode_token_latency_ms > 1e3 * i8.memory.weights / (d.bw_gbs * d.bw_eff * 1e9) * 0.9);
    // more tp: faster tokens, larger share in all-reduces; pp alone does not speed one sequence up
    const auto tp4 = predict_layout(a100(8, PlanQuant::kW8A8), 4, 2);
    const auto pp8 = predict_layout(a100(8, PlanQuant::kW8A8), 1, 8);
    CHECK(i8.decode_tokens_per_s > tp4.decode_tokens_per_s);
    CHECK(tp4.decode_tokens_per_s > pp8.decode_tokens_per_s);
    CHECK(i8.comm_share > tp4.comm_share);
    CHECK(pp8.comm_share < 0.05);
    const auto one = predict_layout(a100(1, PlanQuant::kW8A8), 1, 1);
    CHECK(pp8.decode_tokens_per_s < 1.3 * one.decode_tokens_per_s * 1.0);  // one sequence: stages take turns
}

TEST_CASE("a batch fills the pipeline and turns decode compute bound") {
    PlanRequest r = a100(8, PlanQuant::kW8A8);
    r.batch = 1;
    const double pp1 = predict_layout(r, 1, 8).decode_tokens_per_s;
    r.batch = 8;  // 8 micro-batches of one sequence keep the 8 stages busy
    const double pp8 = predict_layout(r, 1, 8).decode_tokens_per_s;
    CHECK(pp8 > 6.0 * pp1);
    // CPU at a large batch: int8 compute, not bandwidth, bounds it
    PlanRequest c = tinyllama_on_cpu(1);
    c.batch = 64;
    CHECK(predict_layout(c, 1, 1).bound == "compute");
    c.batch = 1;
    CHECK(predict_layout(c, 1, 1).bound == "memory");
}

TEST_CASE("MoE: memory holds every expert, a decode token reads and computes k of them, a batch touches more") {
    // TinyLlama's layers with 8 experts top 2 of intermediate F, against dense models of F x 8 (what it
    // holds) and F x 2 (what one token runs).
    ModelDims moe = tinyllama();
    moe.intermediate = 1408;
    moe.n_experts = 8;
    moe.n_experts_used = 2;
    ModelDims held = tinyllama(), active = tinyllama();
    held.intermediate = 8 * 1408;
    active.intermediate = 2 * 1408;
    CHECK(experts_touched(moe, 1) == 2.0);
    CHECK(experts_touched(moe, 2) == doctest::Approx(8.0 * (1.0 - 0.75 * 0.75)));
    CHECK(experts_touched(moe, 64) == doctest::Approx(8.0).epsilon(1e-6));
    CHECK(experts_touched(tinyllama(), 64) == 1.0);
    auto on = [](const ModelDims& m, int64_t batch, PlanQuant q) {
        PlanRequest r = a100(1, q);
        r.model = m;
        r.batch = batch;
        return r;
    };
    const double router = 22.0 * 8 * 2048 * 2;  // bytes: [8, 2048] per layer, 16-bit
    const auto w = [&](const ModelDims& m, PlanQuant q) { return estimate_memory(on(m, 1, q), 1, 1).weights; };
    CHECK(w(moe, PlanQuant::kFp16) == doctest::Approx(w(held, PlanQuant::kFp16) + router));
    CHECK(w(moe, PlanQuant::kW8A8) == doctest::Approx(w(held, PlanQuant::kW8A8) + router));
    ModelDims one = moe;  // the same FFN width, dense
    one.n_experts = one.n_experts_used = 0;
    CHECK(activation_bytes(moe, 1, 16, 2.0, false) ==
          doctest::Approx(activation_bytes(one, 1, 16, 2.0, false) + 16 * 2.0 * (8 + 2 * 2048)));
    // Decode at batch 1 reads two experts: as fast as the dense model of 2F (the router's few KB aside),
    // and well ahead of the one that reads all 8 (2.7x the bytes; attention, head and overheads alike).
    const double t_moe = predict_stage_seconds(on(moe, 1, PlanQuant::kW8A8), 1, 1, 0, 1, 512, 1);
    const double t_active = predict_stage_seconds(on(active, 1, PlanQuant::kW8A8), 1, 1, 0, 1, 512, 1);
    const double t_held = predict_stage_seconds(on(held, 1, PlanQuant::kW8A8), 1, 1, 0, 1, 512, 1);
    CHECK(t_moe == doctest::Approx(t_active).epsilon(0.01));
    CHECK(t_held > 1.6 * t_moe);
    // 64 tokens touch (nearly) every expert: the bytes of the held model, the ops of the active one.
    PlanRequest big = on(moe, 64, PlanQuant::kW8A8);
    big.device.int8_tops = 1e6;  // compute free: bytes alone
    PlanRequest big_held = big;
    big_held.model = held;
    CHECK(predict_stage_seconds(big, 1, 1, 0, 64, 512, 1) ==
          doctest::Approx(predict_stage_seconds(big_held, 1, 1, 0, 64, 512, 1)).epsilon(0.01));
    big.device = big_held.device = find_device("a100-pcie-40gb");
    big.device.bw_gbs = big_held.device.bw_gbs = 1e9;  // bandwidth free: ops alone
    PlanRequest big_active = big_held;
    big_active.model = active;
    CHECK(predict_stage_seconds(big, 1, 1, 0, 64, 512, 1) ==
          doctest::Approx(predict_stage_seconds(big_active, 1, 1, 0, 64, 512, 1)).epsilon(0.01));
}

TEST_CASE("CPU ranks of one node share its memory bandwidth and memory") {
    PlanRequest c = tinyllama_on_cpu(2);
    c.device.bw_gbs = 10;
    c.device.node_bw_gbs = 15;  // two ranks streaming get 7.5 each, not 10
    c.device.overlap = 1.0;     // (the bandwidth alone: compute hidden under the stream)
    c.device.attn_tflops = 10;  // (and attention's compute, which splits over tp, out of the way)
    const double one = [&] {
        PlanRequest s = c;
        s.devices = 1;
        return predict_layout(s, 1, 1).decode_tokens_per_s;
    }();
    const double tp2 = predict_layout(c, 2, 1).decode_tokens_per_s;
    CHECK(tp2 / one > 1.3);
    CHECK(tp2 / one < 1.5);  // 15 / 10, less the all-reduces
    c.device.node_bw_gbs = 0;
    CHECK(predict_layout(c, 2, 1).decode_tokens_per_s / one > 1.8);
    // memory: two ranks on a node of 1 GiB do not fit what one rank of 0.9 GiB would
    c.device.overlap = 0.0;
    c.device.node_int8_tops = c.device.int8_tops;  // two ranks on one core's worth of int8 units
    {
        PlanRequest b = c;
        b.batch = 64;  // compute bound: sharing the int8 units takes most of tp 2's gain away
        PlanRequest b1 = b;
        b1.devices = 1;
        const double shared = predict_layout(b, 2, 1).decode_tokens_per_s / predict_layout(b1, 1, 1).decode_tokens_per_s;
        b.device.node_int8_tops = b1.device.node_int8_tops = 0;
        const double own = predict_layout(b, 2, 1).decode_tokens_per_s / predict_layout(b1, 1, 1).decode_tokens_per_s;
        CHECK(shared < 1.5);
        CHECK(own > 1.6);
    }
    c.device.mem_gib = 1.0;
    c.device.node_bw_gbs = 15;
    c.context = 2048;
    const auto p = predict_layout(c, 2, 1);
    CHECK(p.memory.total() < 1.0 * kGiB);
    CHECK_FALSE(p.fits);
}

TEST_CASE("attention has its own achieved rate, apart from the float peak") {
    PlanRequest c = tinyllama_on_cpu(1);
    c.prompt = 512;  // two chunks of 256 tokens, each attending to 256 positions on average
    const double x = 0.02;
    auto prefill_s = [&](double attn_tflops) {
        PlanRequest q = c;
        q.device.attn_tflops = attn_tflops;
        return 512.0 / predict_layout(q, 1, 1).prefill_tokens_per_s;
    };
    // the attention FLOPs of the prompt: 2 chunks x layers x 4 x 256 tokens x 256 positions x heads x head_dim
    const double flops = 2.0 * 22 * 4 * 256.0 * 256.0 * 32 * 64;
    const double extra = prefill_s(x / 2) - prefill_s(x);
    CHECK(extra == doctest::Approx(flops / (x * 1e12)).epsilon(0.01));
    // 0 falls back to the float rate (the GPUs' entries)
    CHECK(prefill_s(0) == doctest::Approx(prefill_s(c.device.fp16_tflops * c.device.compute_eff)));
    CHECK(prefill_s(0) < prefill_s(x));
}

TEST_CASE("a pipelined prefill's fill and drain run one stage at a time, at its own rate") {
    PlanRequest c = tinyllama_on_cpu(2);
    c.batch = 2;  // two prompts: with pp 2 the scheduler makes them two micro-batches
    c.prompt = 128;
    c.device.node_bw_gbs = 0;
    auto prefill_s = [&](double node_int8_tops) {
        PlanRequest q = c;
        q.device.node_int8_tops = node_int8_tops;
        return double(q.batch * q.prompt) / predict_layout(q, 1, 2).prefill_tokens_per_s;
    };
    // Slots: stage 0 alone, both stages (sharing the node's int8 units), stage 1 alone. With two
    // ranks on one rank's worth of int8 units only the middle slot slows down (compute-bound
    // chunks): ~4/3 of the unshared time, not 2x.
    const double ratio = prefill_s(c.device.int8_tops) / prefill_s(0);
    CHECK(ratio > 1.2);
    CHECK(ratio < 1.4);
}

TEST_CASE("the recommendation is the fastest layout that fits") {
    PlanRequest r = a100(4, PlanQuant::kW8A8);
    const auto plans = plan_layouts(r);
    REQUIRE(!plans.empty());
    for (const auto& p : plans)
        if (p.feasible && p.fits) CHECK(plans.front().decode_tokens_per_s >= p.decode_tokens_per_s);
    CHECK(plans.front().tp == 4);
}

TEST_CASE("unknown names list the known ones") {
    CHECK_THROWS_WITH_AS(find_device("a200"), doctest::Contains("a100-pcie-40gb"), Error);
    CHECK_THROWS_WITH_AS(find_link("carrier-pigeon"), doctest::Contains("nvlink"), Error);
    CHECK_THROWS_WITH_AS(parse_plan_quant("int4"), doctest::Contains("w8a8"), Error);
}
