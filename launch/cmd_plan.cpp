// `lattice plan`: which tp x pp layout for a model on N devices, what each needs in memory and what
// speed a roofline predicts (the model: parallel/plan_model.h; its constants and their sources:
// parallel/plan_model.cpp). --calibration replaces the cpu entry's figures (or any device's) with
// measured ones (benchmarks/validate_plan.py writes such a file). Exit 0 when some layout fits,
// 1 (with the reason) when none does.
#include "base/memory.h"
#include "launch/cli.h"
#include "launch/cli_common.h"

#include "base/error.h"
#include "base/file.h"
#include "parallel/plan_model.h"
#include "runtime/arch/config.h"
#include "runtime/builder/estimate.h"
#include "runtime/weights/tensor_source.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

namespace lattice {
namespace {

struct PlanArgs {
    std::string model = "llama-2-70b", gpu = "a100-pcie-40gb", link, inter_node = "ib-hdr", quant = "w8a8",
                calibration, kv_cache_dtype = "auto";
    int gpus = 0, nodes = 1;
    bool quant_head = false, json = false;
    int64_t batch = 1, context = kDefaultMaxSeq, prompt = 512, max_batch_tokens = 256;
    double price = -1;
};

ModelDims load_dims(const std::string& m) {
    namespace fs = std::filesystem;
    if (!fs::exists(m)) {
        const auto names = preset_names();
        if (std::find(names.begin(), names.end(), m) != names.end()) return preset_config(m).dims();
        LATTICE_FAIL("--model {}: no such file or folder, and not a preset ({})", m, fmt::join(names, ", "));
    }
    if (fs::is_regular_file(m) && fs::path(m).extension() == ".json") return load_hf_config(m).dims();
    return open_model(m)->config().dims();
}

// A checkpoint's 4-bit bytes per weight (PlanRequest::int4_bytes; a K-quant GGUF on the CPU's W4A8 keeps its
// super-blocks), 0 (the group form) for a preset, a config.json, or a checkpoint a 4-bit load would refuse
// (a folder converted for another quantization: the plan still shows what the shape would need).
double checkpoint_int4_bytes(const std::string& m, bool cpu_kquant) {
    namespace fs = std::filesystem;
    if (!fs::exists(m) || (fs::is_regular_file(m) && fs::path(m).extension() == ".json")) return 0;
    try {
        return int4_bytes_per_weight(*open_model(m), cpu_kquant);
    } catch (const Error&) {
        return 0;
    }
}

std::string experts_note(const ModelDims& d) {
    return d.n_experts > 0 ? fmt::format(", {} experts, {} per token: {:.1f}B active", d.n_experts, d.n_experts_used,
                                         active_parameters(d) / 1e9)
                           : "";
}

// Overrides from a calibration file: {"device": {field: value, ...}, "link": {...}}.
void apply_calibration(const std::string& path, DeviceSpec& d, LinkSpec& l) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_regular_file(path, int64_t(1) << 20, "--calibration"));
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("--calibration {}: not JSON ({})", path, e.what());
    }
    auto num = [&](const nlohmann::json& o, const char* key, double& dst) {
        if (!o.contains(key)) return;
        LATTICE_CHECK(o[key].is_number() && o[key].get<double>() > 0, "--calibration {}: \"{}\" must be a number > 0",
                      path, key);
        dst = o[key].get<double>();
    };
    if (j.contains("device")) {
        const auto& o = j["device"];
        num(o, "bw_gbs", d.bw_gbs);
        num(o, "node_bw_gbs", d.node_bw_gbs);
        num(o, "node_int8_tops", d.node_int8_tops);
        num(o, "int8_tops", d.int8_tops);
        num(o, "fp16_tflops", d.fp16_tflops);
        num(o, "attn_tflops", d.attn_tflops);
        num(o, "mem_gib", d.mem_gib);
        num(o, "layer_overhead_us", d.layer_overhead_us);
        double per_node = d.per_node;
        num(o, "per_node", per_node);
        d.per_node = int(per_node);
        if (o.contains("label") && o["label"].is_string()) d.label = o["label"].get<std::string>();
        d.source = "calibration " + path;
    }
    if (j.contains("link")) {
        num(j["link"], "alpha_us", l.alpha_us);
        num(j["link"], "bw_gbs", l.bw_gbs);
        l.source = "calibration " + path;
    }
}


// The planner's request from the flags.
PlanRequest plan_request(const PlanArgs& args) {
    PlanRequest r;
    r.model = load_dims(args.model);
    r.device = find_device(args.gpu);
    r.link = parse_link(args.link.empty() ? r.device.link : args.link);
    r.inter_node = parse_link(args.inter_node);
    if (!args.calibration.empty()) apply_calibration(args.calibration, r.device, r.link);
    if (args.price >= 0) r.device.price_per_hour = args.price;
    r.devices = args.gpus;
    r.nodes = args.nodes;
    LATTICE_CHECK(args.gpus % args.nodes == 0, "--gpus {} cannot be spread evenly over --nodes {}", args.gpus,
                  args.nodes);
    r.quant = device_plan_quant(args.quant, r.device.cpu);
    r.quant_head = args.quant_head;
    if (r.quant == PlanQuant::kW4A8 || r.quant == PlanQuant::kW4A16)
        r.int4_bytes = checkpoint_int4_bytes(args.model, r.device.cpu && r.quant == PlanQuant::kW4A8);
    r.batch = args.batch;
    r.context = args.context;
    r.prompt = std::min(args.prompt, args.context);
    r.max_batch_tokens = args.max_batch_tokens;
    r.kv_bytes = kv_element_bytes(args.kv_cache_dtype, r.model.head_dim, r.device.cpu);
    return r;
}

// USD per million generated tokens (0: no price given).
double usd_per_million(const PlanRequest& r, const LayoutPrediction& p) {
    return r.device.price_per_hour > 0 && p.decode_tokens_per_s > 0
               ? r.device.price_per_hour * r.devices / (p.decode_tokens_per_s * 3600.0) * 1e6
               : 0.0;
}

void print_plan_json(const PlanRequest& r, const std::vector<LayoutPrediction>& plans, bool any) {
    const double params = model_parameters(r.model);
    auto cost = [&](const LayoutPrediction& p) { return usd_per_million(r, p); };
    nlohmann::json j = {{"model", r.model.name},
                        {"parameters", params},
                        {"active_parameters", active_parameters(r.model)},
                        {"experts", r.model.n_experts},
                        {"experts_per_token", r.model.n_experts_used},
                        {"device", r.device.name},
                        {"device_label", r.device.label},
                        {"devices", r.devices},
                        {"nodes", r.nodes},
                        {"link", r.link.name},
                        {"quant", plan_quant_name(r.quant)},
                        {"batch", r.batch},
                        {"context", r.context},
                        {"prompt", r.prompt},
                        {"device_spec",
                         {{"mem_gib", r.device.mem_gib},
                          {"bw_gbs", r.device.bw_gbs},
                          {"bw_eff", r.device.bw_eff},
                          {"node_bw_gbs", r.device.node_bw_gbs},
                          {"node_int8_tops", r.device.node_int8_tops},
                          {"overlap", r.device.overlap},
                          {"int8_tops", r.device.int8_tops},
                          {"fp16_tflops", r.device.fp16_tflops},
                          {"attn_tflops", r.device.attn_tflops},
                          {"compute_eff", r.device.compute_eff},
                          {"source", r.device.source}}},
                        {"link_spec", {{"alpha_us", r.link.alpha_us}, {"bw_gbs", r.link.bw_gbs}}},
                        {"inter_node_link", r.inter_node.name},
                        {"inter_node_link_spec", {{"alpha_us", r.inter_node.alpha_us}, {"bw_gbs", r.inter_node.bw_gbs}}},
                        {"layouts", nlohmann::json::array()}};
    for (const auto& p : plans) {
        nlohmann::json l = {{"tp", p.tp}, {"pp", p.pp}, {"feasible", p.feasible}};
        if (!p.feasible) {
            l["why_not"] = p.why_not;
        } else {
            l["fits"] = p.fits;
            l["tp_crosses_nodes"] = p.tp_crosses_nodes;
            l["memory_gib"] = {{"weights", to_gib(p.memory.weights)},   {"kv_cache", to_gib(p.memory.kv)},
                               {"activations", to_gib(p.memory.activations)}, {"reserved", to_gib(p.memory.reserved)},
                               {"total", to_gib(p.memory.total())},       {"heaviest_stage", p.memory.heaviest_stage}};
            l["decode_tokens_per_s"] = p.decode_tokens_per_s;
            l["decode_token_latency_ms"] = p.decode_token_latency_ms;
            l["prefill_tokens_per_s"] = p.prefill_tokens_per_s;
            l["ttft_ms"] = p.ttft_ms;
            l["comm_share"] = p.comm_share;
            l["bound"] = p.bound;
            if (cost(p) > 0) l["usd_per_million_tokens"] = cost(p);
        }
        j["layouts"].push_back(l);
    }
    j["recommended"] = any ? nlohmann::json{{"tp", plans.front().tp}, {"pp", plans.front().pp}} : nlohmann::json();
    print_stdout("{}\n", j.dump(2));
}

// The table, the recommendation and its assumptions; 1 when no layout fits.
int print_plan_table(const PlanRequest& r, const std::vector<LayoutPrediction>& plans, bool any) {
    const double params = model_parameters(r.model);
    auto cost = [&](const LayoutPrediction& p) { return usd_per_million(r, p); };
    print_stdout("{} ({:.1f}B parameters, {} layers{}) on {} x {} ({} node{}, {}{}), {}, batch {}, context {}, "
                 "prompt {}\n",
                 r.model.name, params / 1e9, r.model.n_layers, experts_note(r.model), r.devices, r.device.label,
                 r.nodes, r.nodes > 1 ? "s" : "", r.link.name,
                 r.nodes > 1 ? " within, " + r.inter_node.name + " between" : "", plan_quant_name(r.quant), r.batch,
                 r.context, r.prompt);
    print_stdout("{:>3} {:>3} | {:>8} {:>8} {:>6} {:>8} {:>4} | {:>9} {:>9} {:>10} {:>9} {:>5} {:>7}{}\n", "tp", "pp",
                 "weights", "kv", "act", "total", "fits", "decode/s", "ms/token", "prefill/s", "TTFT ms", "comm",
                 "bound", r.device.price_per_hour > 0 ? "  $/Mtok" : "");
    bool crossing = false;
    for (const auto& p : plans) {
        if (!p.feasible) {
            print_stdout("{:>3} {:>3} | not possible: {}\n", p.tp, p.pp, p.why_not);
            continue;
        }
        print_stdout("{:>3} {:>3} | {:>7.2f}G {:>7.2f}G {:>5.2f}G {:>7.2f}G {:>4} | {:>9.1f} {:>9.2f} {:>10.0f} {:>9.0f} "
                     "{:>4.0f}% {:>7}{}{}\n",
                     p.tp, p.pp, to_gib(p.memory.weights), to_gib(p.memory.kv), to_gib(p.memory.activations),
                     to_gib(p.memory.total()), p.fits ? "yes" : "NO", p.decode_tokens_per_s, p.decode_token_latency_ms,
                     p.prefill_tokens_per_s, p.ttft_ms, 100.0 * p.comm_share, p.bound,
                     cost(p) > 0 ? fmt::format("  {:>6.2f}", cost(p)) : "", p.tp_crosses_nodes ? "  *" : "");
        crossing |= p.tp_crosses_nodes;
    }
    if (crossing)
        print_stdout("*: the TP group spans nodes, its all-reduces cross {} (lattice-mpirun refuses such a layout; "
                     "plain mpirun runs it)\n",
                     r.inter_node.name);
    print_stdout("memory per {} (GiB): weights + KV cache for batch x context + activations of {} tokens + {:.1f} "
                 "reserved; fits: <= {:.1f} GiB{}\n",
                 r.device.cpu ? "rank" : "GPU", r.max_batch_tokens, r.device.reserved_gib, r.device.mem_gib,
                 r.device.cpu ? " per node (its ranks share it)" : "");
    if (!any) {
        print_stdout("no layout fits: use more or larger devices, a smaller --batch/--context, or --quant w8a8\n");
        return 1;
    }
    const auto& b = plans.front();
    std::string why = fmt::format("the fastest decode of the layouts that fit ({:.1f} tokens/s, {:.0f}% of a step in "
                                  "communication, {}-bound)",
                                  b.decode_tokens_per_s, 100.0 * b.comm_share, b.bound);
    print_stdout("recommended: tp {} x pp {}: {}\n", b.tp, b.pp, why);
    const bool int8_rate = r.quant == PlanQuant::kW8A8 || r.quant == PlanQuant::kW4A8;
    print_stdout("assumptions: {} {:.3g} GB/s x {:.2f} achieved, {} {:.3g} T{}/s x {:.2f}; {} alpha {:.1f} us, {:.0f} GB/s "
                 "(sources: parallel/plan_model.cpp)\n",
                 r.device.name, r.device.bw_gbs, r.device.bw_eff, int8_rate ? "int8" : "fp",
                 int8_rate ? r.device.int8_tops : r.device.fp16_tflops, int8_rate ? "OP" : "FLOP", r.device.compute_eff,
                 r.link.name, r.link.alpha_us, r.link.bw_gbs);
    if (r.nodes > 1)
        print_stdout("between nodes: {} alpha {:.1f} us, {:.3g} GB/s (pipeline hops that cross nodes, TP groups that "
                     "span them)\n",
                     r.inter_node.name, r.inter_node.alpha_us, r.inter_node.bw_gbs);
    return 0;
}

int run_plan(const PlanArgs& args) {
    const PlanRequest r = plan_request(args);
    const auto plans = plan_layouts(r);
    const bool any = !plans.empty() && plans.front().feasible && plans.front().fits;
    if (!args.json) return print_plan_table(r, plans, any);
    print_plan_json(r, plans, any);
    return any ? 0 : 1;
}

}  // namespace

void add_plan_command(CLI::App& app, CommandRun& run) {
    auto args = std::make_shared<PlanArgs>();
    auto* cmd = app.add_subcommand(
        "plan", "Predict memory and speed of every tp x pp layout of a model on N devices, and recommend one");
    cmd->add_option("--model", args->model,
                    "HF folder, config.json, .gguf file or preset (llama-2-70b, llama-2-13b, ...)")
        ->capture_default_str();
    cmd->add_option("--gpus", args->gpus, "Devices (ranks) in all")->required()->check(int_range(1, 4096));
    cmd->add_option("--nodes", args->nodes, "Nodes they are spread over")
        ->check(int_range(1, 4096))
        ->capture_default_str();
    std::string devs;
    for (const auto& d : device_table()) devs += (devs.empty() ? "" : " | ") + d.name;
    cmd->add_option("--gpu", args->gpu, "Device: " + devs + " (cpu: one rank per core)")->capture_default_str();
    std::string links;
    for (const auto& l : link_table()) links += (links.empty() ? "" : " | ") + l.name;
    cmd->add_option("--interconnect", args->link,
                    "Link within a node: " + links + " or GB/s,latency-us (default: the device's)");
    cmd->add_option("--inter-node-link,--inter-node", args->inter_node,
                    "Link between nodes: a link name above (ib-hdr100: 100 Gb/s, 5 us; eth25: 25 Gb/s, 10 us) or "
                    "GB/s,latency-us (e.g. 12.5,5)")
        ->capture_default_str();
    cmd->add_option("--quant", args->quant, "w8a8 | w8a16 | w4a8 (gpus: as w4a16) | w4a16 | fp16 | bf16 | f32 | none")
        ->capture_default_str();
    cmd->add_flag("--quant-head", args->quant_head, "The LM head in int8 too");
    cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                    "KV cache elements: auto (f32 on CPUs, 16-bit on GPUs) | f32 | f16 | bf16 | int8")
        ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "int8"}))
        ->capture_default_str();
    cmd->add_option("--batch", args->batch, "Concurrent sequences")
        ->check(int_range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--context", args->context, "Positions per sequence the KV cache holds")
        ->check(int_range(1, 1 << 24))
        ->capture_default_str();
    cmd->add_option("--prompt", args->prompt, "Prompt tokens (prefill, time to first token; decode attends to them)")
        ->check(int_range(1, 1 << 24))
        ->capture_default_str();
    cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Tokens per forward (prefill chunk)")
        ->check(int_range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--price", args->price, "USD per device-hour: adds the cost per million generated tokens")
        ->check(real_range(0.0, 1e6));
    cmd->add_option("--calibration", args->calibration,
                    "JSON with measured figures: {\"device\": {bw_gbs, node_bw_gbs, int8_tops, ...}, \"link\": "
                    "{alpha_us, bw_gbs}} (benchmarks/validate_plan.py writes one)");
    cmd->add_flag("--json", args->json, "One JSON object on stdout");
    cmd->footer(R"(Examples:
  lattice plan --model llama-2-70b --gpus 4 --gpu a100-pcie-40gb            # 70B in INT8 on a PCIe node
  lattice plan --model llama-2-70b --gpus 8 --gpu a100-pcie-40gb --quant fp16 --batch 8
  lattice plan --model llama-2-13b --gpus 2 --gpu a10 --price 1.0           # 2 x A10 ...
  lattice plan --model llama-2-13b --gpus 1 --gpu a100-pcie-40gb --price 3.0  # ... or 1 x A100?
  lattice plan --model tinyllama-1.1b --gpus 2 --gpu cpu --json
  lattice plan --model llama-2-70b --gpus 8 --nodes 2 --inter-node-link ib-hdr100 --quant fp16 --batch 64)");
    cmd->callback([&run, args] { run = [args] { return run_plan(*args); }; });
}

}  // namespace lattice
