// The builder (see build.h).
#include "runtime/builder/build.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>

#include "base/log.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/converted_source.h"
#include "runtime/weights/random_source.h"

namespace lattice {

std::unique_ptr<TensorSource> open_spec(const ModelSpec& spec, const WorldConfig& world) {
    if (!spec.random) {
        LATTICE_CHECK(!spec.path.empty(), "no model given (a checkpoint path, or random weights of a preset shape)");
        if (is_converted_folder(spec.path))
            return open_converted_model(spec.path, ConvertedRank{world.tp, world.pp, world.rank}, spec.verify);
        return open_model(spec.path);
    }
    ModelConfig cfg;
    if (!spec.preset.empty())
        cfg = preset_config(spec.preset);
    else if (!spec.path.empty())
        cfg = open_model(spec.path)->config();
    else
        LATTICE_FAIL("random weights need a preset shape (--config) or a model whose shape to use (--model)");
    return make_random_source(cfg, spec.seed);
}

PipelineLinks rank_pipeline_links(const ParallelContext& ctx) {
    PipelineLinks links;
    if (ctx.world.world > 1) {
        links.pipe = ctx.pp_world.get();
        links.prev = ctx.prev_stage();
        links.next = ctx.next_stage();
        links.world = ctx.world_comm.get();
        links.plans = ctx.plans.get();
        links.tp = ctx.tp.get();
        links.sampler = ctx.world.sampler_rank();
    }
    return links;
}

int64_t kv_blocks_for(const Model& model, const Backend& backend, double kv_cache_gb, int64_t max_seqs) {
    const double per_block = double(model.kv_bytes_per_block());
    LATTICE_CHECK(kv_cache_gb >= 0 && std::isfinite(kv_cache_gb), "--kv-cache-gb must be >= 0, got {}", kv_cache_gb);
    double budget = kv_cache_gb * double(int64_t(1) << 30);
    if (budget == 0) {
        const double avail = double(backend.memory_available());
        if (backend.device() == Device::kCpu)
            budget = std::min(double(int64_t(2) << 30), avail > 0 ? 0.1 * avail : double(int64_t(2) << 30));
        else
            budget = 0.9 * avail;
    }
    if (per_block <= 0) return 1;  // a stage without layers holds no KV
    const AttentionShape& attn = model.attention_shape();
    // Every sequence at full context, plus the block that step graphs reserve for their padding rows
    // (Engine: the pool then still holds max_seqs full sequences).
    const double useful = double(std::max<int64_t>(max_seqs, 1)) * double(attn.table_width) + 1;
    const double blocks = std::min(std::floor(budget / per_block), useful);
    LATTICE_CHECK(blocks >= 1, "KV cache: {:.3f} GiB holds no block of {:.1f} KiB ({} tokens); raise --kv-cache-gb",
                  budget / double(int64_t(1) << 30), per_block / 1024, model.attention_shape().block_size);
    return int64_t(std::min(blocks, double(INT32_MAX)));
}

LocalModel make_local_model(const TensorSource& src, const BackendOptions& backend, const ModelOptions& opt) {
    LocalModel m;
    m.backend = make_backend(backend);
    m.model = std::make_unique<Model>(src, *m.backend, opt, nullptr);
    return m;
}

std::unique_ptr<Engine> make_local_engine(Model& model, const EngineOptions& opt, double kv_cache_gb) {
    if (model.kv_blocks() == 0) model.allocate_kv(kv_blocks_for(model, model.backend(), kv_cache_gb, opt.max_seqs));
    EngineOptions engine_opt = opt;
    engine_opt.kv_blocks = model.kv_blocks();
    return std::make_unique<Engine>(model, PipelineLinks{}, engine_opt);
}

// A layer-0 down projection (the first expert's in a MoE model): what the checkpoint's linears are stored as.
static std::string down_probe(const ModelConfig& c) {
    return c.is_moe() ? tensor_name(c, TensorRole::kExpDown, 0, 0) : tensor_name(c, TensorRole::kWDown, 0);
}

bool checkpoint_is_quantized(const TensorSource& src) {
    const std::string probe = down_probe(src.config());
    return src.has(probe) && (dtype_is_block(src.info(probe).dtype) || src.info(probe).int4_group > 0);
}

bool checkpoint_is_4bit(const TensorSource& src) {
    const ModelConfig& c = src.config();
    const std::initializer_list<TensorRole> dense = {TensorRole::kWq,   TensorRole::kWk,    TensorRole::kWv,
                                                     TensorRole::kWo,   TensorRole::kWGate, TensorRole::kWUp,
                                                     TensorRole::kWDown};
    const std::initializer_list<TensorRole> moe = {TensorRole::kWq,     TensorRole::kWk,      TensorRole::kWv,
                                                   TensorRole::kWo,     TensorRole::kExpGate, TensorRole::kExpUp,
                                                   TensorRole::kExpDown};
    double four = 0, all = 0;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (TensorRole r : c.is_moe() ? moe : dense) {
            const bool expert = r == TensorRole::kExpGate || r == TensorRole::kExpUp || r == TensorRole::kExpDown;
            for (int64_t e = 0; e < (expert ? c.n_experts : 1); ++e) {
                const std::string name = tensor_name(c, r, l, expert ? e : -1);
                if (!src.has(name)) continue;
                const TensorInfo& ti = src.info(name);
                const double n = double(ti.rows()) * double(ti.cols());
                all += n;
                if (ti.int4_group > 0) four += n;
            }
        }
    return all > 0 && 2 * four > all;
}

QuantChoice auto_quant(const TensorSource& src, bool quant_head, QuantMode int4_mode) {
    LATTICE_CHECK(int4_mode == QuantMode::kNone || is_int4(int4_mode), "auto_quant: {} is not a 4-bit mode",
                  quant_mode_name(int4_mode));
    if (int4_mode != QuantMode::kNone && checkpoint_is_4bit(src)) return {int4_mode, true};
    if (checkpoint_is_quantized(src)) return {QuantMode::kW8A8, true};
    return {QuantMode::kNone, quant_head};
}

QuantMode int4_mode_for(BackendKind kind) {
    switch (resolve_backend_kind(kind)) {
        case BackendKind::kCpu: return QuantMode::kW4A8;
        case BackendKind::kCuda: return QuantMode::kW4A16;
        default: return QuantMode::kNone;
    }
}

namespace {

using Clock = std::chrono::steady_clock;

// A lower bound of this rank's host memory for weights (1 byte per parameter, int8 being the
// narrowest kept form) plus an explicit KV budget, against the machine's physical memory: a config
// that cannot fit (vocab_size 2^31 - 1 with random weights) is refused with numbers before anything
// is allocated. (The default KV budget is sized from free memory after the weights.)
void check_host_memory(const ModelConfig& cfg, const BuildOptions& opt) {
    const double ranks = double(opt.tp) * double(opt.pp);
    const double kv = opt.kv_cache_gb > 0 ? opt.kv_cache_gb * double(int64_t(1) << 30) : 0.0;
    const double need = cfg.parameter_count_estimate() / ranks + kv;
    const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    LATTICE_CHECK(phys <= 0 || need <= phys,
                  "{}: this rank needs at least {:.1f} GiB for its weights and KV cache, more than the {:.1f} GiB of "
                  "memory of this machine (vocab_size {}, hidden_size {}, num_hidden_layers {})",
                  cfg.source, need / double(1 << 30), phys / double(1 << 30), cfg.vocab, cfg.hidden, cfg.n_layers);
}

// How this rank's communicators wait on their peers (the per-call and the start-up deadlines).
WaitPolicy wait_policy(const BuildOptions& opt) {
    WaitPolicy policy;
    policy.timeout_s = opt.comm_timeout;
    policy.setup_timeout_s = opt.start_timeout;
    policy.shared_memory = opt.comm_shared_memory;
    return policy;
}

ParallelContext make_context(const BuildOptions& opt) {
    check_layout_sizes(opt.tp, opt.pp);
    ParallelContext ctx = (opt.tp * opt.pp > 1 || opt.mpi) ? make_parallel_context(opt.tp, opt.pp, wait_policy(opt))
                                                            : make_local_context();
    if (opt.on_context) opt.on_context(ctx.world);
    return ctx;
}

// On a device backend the TP and PP groups move device memory: the backend's communicator over
// the same ranks replaces the host group, which stays alive underneath (NCCL bootstraps over it).
std::unique_ptr<Communicator> device_group(std::unique_ptr<Communicator> host, Backend& backend, const char* name,
                                           double timeout, RankRuntime& rt) {
    std::unique_ptr<Communicator> dev = backend.make_group_comm(*host, name, timeout);
    if (!dev) return host;
    rt.host_groups.push_back(std::move(host));
    return dev;
}

// A converted checkpoint runs as it was converted: quantization and stage split come from it, and
// settings that contradict it are refused with both named.
void follow_prepared(BuildOptions& opt, const PreparedLayout& prepared) {
    const QuantMode quant = parse_quant_mode(prepared.quant);
    if (opt.quant_auto) {
        opt.model.quant = quant;
        opt.model.quant_head = prepared.quant_head;
    }
    LATTICE_CHECK(opt.model.quant == quant && opt.model.quant_head == prepared.quant_head,
                  "{}: converted with --quant {}{}, but this run asks for --quant {}{}: use --quant auto (or {})",
                  prepared.folder, prepared.quant, prepared.quant_head ? " --quant-head" : "",
                  quant_mode_name(opt.model.quant), opt.model.quant_head ? " --quant-head" : "", prepared.quant);
    LATTICE_CHECK(opt.model.smooth_path.empty(),
                  "{}: SmoothQuant factors are folded in at conversion ({}); drop --smooth", prepared.folder,
                  prepared.smooth.empty() ? "none were given then" : prepared.smooth);
    if (opt.model.kv_dtype == KvDtype::kAuto) opt.model.kv_dtype = parse_kv_dtype(prepared.kv_cache_dtype);
    if (opt.pp_layers.empty()) opt.pp_layers = prepared.stage_layers;
    LATTICE_CHECK(opt.pp_layers == prepared.stage_layers,
                  "{}: converted with {} layers per stage; --pp-layers asks for {}", prepared.folder,
                  fmt::join(prepared.stage_layers, ","), fmt::join(opt.pp_layers, ","));
}

// The draft model of speculative decoding on the leader: its own CPU backend and single-rank engine
// (prefix caching on: each proposal recomputes only what earlier ones did not cache).
void load_draft(const BuildOptions& opt, RankRuntime& rt, EngineOptions& engine_opt) {
    LATTICE_CHECK(engine_opt.speculative_tokens > 0, "a draft model needs speculative tokens (--num-speculative-tokens)");
    if (rt.world.rank != 0) return;
    const std::unique_ptr<TensorSource> src = open_spec(opt.draft);
    BackendOptions b = opt.backend;
    b.kind = BackendKind::kCpu;
    rt.draft_backend = make_backend(b);
    ModelOptions mo;
    const QuantChoice q = auto_quant(*src, false, QuantMode::kW4A8);  // the draft runs on the CPU
    mo.quant = q.quant;
    mo.quant_head = q.quant_head;
    mo.max_seq = std::min(rt.model->max_seq(), src->config().max_position);
    rt.draft_model = std::make_unique<Model>(*src, *rt.draft_backend, mo, nullptr);
    EngineOptions eo;
    eo.max_seqs = 1;
    eo.step_graphs = false;
    rt.draft_engine = make_local_engine(*rt.draft_model, eo);
    rt.draft = std::make_unique<DraftModel>(*rt.draft_engine, rt.model->config().vocab);
    DraftModel* d = rt.draft.get();
    engine_opt.draft_proposer = [d](std::span<const int32_t> tokens, int64_t k) { return d->propose(tokens, k); };
    LOG_INFO("speculative decoding: draft model {} ({} layers, {:.1f} MiB, quant {}) on the leader's CPU, {} drafts "
             "per step",
             src->describe(), src->config().n_layers, double(rt.draft_model->weight_bytes()) / (1 << 20),
             quant_mode_name(mo.quant), engine_opt.speculative_tokens);
}

RankRuntime build_in(const BuildOptions& requested, ParallelContext ctx, const TensorSource& src,
                     Clock::time_point t0) {
    BuildOptions opt = requested;
    if (const PreparedLayout* prepared = src.prepared()) {
        follow_prepared(opt, *prepared);
    } else if (opt.quant_auto) {
        const QuantChoice q = auto_quant(src, opt.model.quant_head, int4_mode_for(opt.backend.kind));
        opt.model.quant = q.quant;
        opt.model.quant_head = q.quant_head;
    }
    RankRuntime rt;
    rt.world = ctx.world;
    BackendOptions backend_opt = opt.backend;
    if (resolve_backend_kind(backend_opt.kind) == BackendKind::kCuda) {
        backend_opt.cuda_device = ctx.world.device(opt.devices);
        process_identity().device = backend_opt.cuda_device;
    }
    rt.backend = make_backend(backend_opt);
    ctx.tp = device_group(std::move(ctx.tp), *rt.backend, "tp", opt.comm_timeout, rt);
    ctx.pp_world = device_group(std::move(ctx.pp_world), *rt.backend, "pp", opt.comm_timeout, rt);
    ModelOptions model_opt = rank_model_options(opt.model, ctx.world, src.config().n_layers, opt.pp_layers);
    // A step holds the prompt budget (--micro-batch, else --max-batch-tokens) and one decode token per
    // running sequence of its micro-batch: the model's rows make room for both, so a small budget
    // bounds prompt chunks, never how many sequences run.
    const int64_t step_budget = opt.micro_batch > 0 ? opt.micro_batch : opt.model.max_batch_tokens;
    const int64_t decode_rows = (opt.engine.max_seqs + ctx.world.pp - 1) / ctx.world.pp;
    // Each decode row may carry speculative drafts (EngineOptions::speculative_tokens) beside it.
    model_opt.max_batch_tokens =
        std::max(model_opt.max_batch_tokens, step_budget + decode_rows * (1 + opt.engine.speculative_tokens));
    const bool sim = backend_opt.kind == BackendKind::kSim;
    model_opt.shape_only = sim;
    if (rt.backend->device() == Device::kCpu && !sim) check_host_memory(src.config(), opt);
    try {
        rt.model = std::make_unique<Model>(src, *rt.backend, model_opt, ctx.tp.get());
    } catch (const std::bad_alloc&) {
        LATTICE_FAIL("out of memory loading {} on this rank ({:.2f} G parameters in the model)", src.describe(),
                     src.config().parameter_count_estimate() * 1e-9);
    }
    int64_t blocks =
        opt.kv_blocks > 0 ? opt.kv_blocks
        : sim ? std::max<int64_t>(opt.engine.max_seqs, 1) * rt.model->attention_shape().table_width + 1
              : kv_blocks_for(*rt.model, *rt.backend, opt.kv_cache_gb, opt.engine.max_seqs);
    rt.checkpoint_bytes_read = {rt.model->checkpoint_bytes_read()};
    if (ctx.world.world > 1) {  // the leader's block ids must exist on every rank
        const int W = ctx.world.world;
        int64_t mine[2] = {blocks, rt.model->checkpoint_bytes_read()};
        std::vector<int64_t> all(size_t(2 * W));
        // The ranks' first meeting after their loads, which end at different times: under the start-up deadline.
        ctx.world_comm->set_timeout(setup_deadline(wait_policy(opt)));
        ctx.world_comm->all_gather(View::contiguous(all.data(), DType::kI64, {2 * W}),
                                   View::contiguous(mine, DType::kI64, {2}));
        ctx.world_comm->set_timeout(opt.comm_timeout);
        rt.checkpoint_bytes_read.assign(size_t(W), 0);
        for (int r = 0; r < W; ++r) {
            blocks = std::min(blocks, all[size_t(2 * r)]);
            rt.checkpoint_bytes_read[size_t(r)] = all[size_t(2 * r + 1)];
        }
    }
    rt.model->allocate_kv(blocks);
    EngineOptions engine_opt = opt.engine;
    engine_opt.kv_blocks = blocks;
    engine_opt.step_tokens = step_budget;
    engine_opt.max_itl_s =
        (opt.max_itl_ms >= 0 ? opt.max_itl_ms
                             : rt.backend->device() == Device::kCpu ? kDefaultMaxItlMsCpu : kDefaultMaxItlMsGpu) /
        1e3;
    engine_opt.heartbeat_s = std::min(engine_opt.heartbeat_s, opt.comm_timeout / 4);
    if (sim) {
        const PlanQuant q = model_opt.quant == QuantMode::kW8A8    ? PlanQuant::kW8A8
                            : model_opt.quant == QuantMode::kW8A16 ? PlanQuant::kW8A16
                            : model_opt.quant == QuantMode::kW4A8  ? PlanQuant::kW4A8
                            : model_opt.quant == QuantMode::kW4A16 ? PlanQuant::kW4A16
                                                                   : PlanQuant::kFp16;
        engine_opt.sim = std::make_shared<SimDevice>(opt.sim, src.config().dims(), ctx.world.tp, ctx.world.pp,
                                                     ctx.world.pp_rank(), q, model_opt.max_batch_tokens);
    }
    if (!opt.draft.path.empty() || opt.draft.random) load_draft(opt, rt, engine_opt);
    rt.engine = std::make_unique<Engine>(*rt.model, rank_pipeline_links(ctx), engine_opt);
    rt.tp_comm = std::move(ctx.tp);
    rt.pp_comm = std::move(ctx.pp_world);
    rt.world_comm = std::move(ctx.world_comm);
    rt.plans_comm = std::move(ctx.plans);
    rt.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    LOG_INFO(
        "{}: loaded {} on {} in {:.2f} s ({:.1f} MiB of weights on this rank, {:.1f} MiB read from the checkpoint, "
        "quant {}; KV cache {} blocks of {} = {:.1f} MiB, {})",
        rt.world.describe(), src.describe(), sim ? engine_opt.sim->describe() : rt.backend->name(), rt.load_seconds,
        double(rt.model->weight_bytes()) / (1 << 20), double(rt.model->checkpoint_bytes_read()) / (1 << 20),
        quant_mode_name(model_opt.quant), blocks, rt.model->attention_shape().block_size,
        double(blocks * rt.model->kv_bytes_per_block()) / (1 << 20), dtype_name(rt.model->kv_dtype()));
    return rt;
}

}  // namespace

RankRuntime build(const BuildOptions& opt, const TensorSource& src) {
    const auto t0 = Clock::now();
    return build_in(opt, make_context(opt), src, t0);
}

RankRuntime build(const BuildOptions& opt, const ModelSpec& spec) {
    const auto t0 = Clock::now();
    ParallelContext ctx = make_context(opt);
    std::unique_ptr<TensorSource> src = open_spec(spec, ctx.world);
    return build_in(opt, std::move(ctx), *src, t0);  // src (and its file mappings) dies here
}

}  // namespace lattice
