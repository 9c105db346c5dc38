// The builder (see build.h).
#include "runtime/builder/build.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>

#include <fmt/ranges.h>

#include "base/log.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/converted_source.h"
#include "runtime/weights/random_source.h"

namespace lattice {

std::unique_ptr<TensorSource> open_spec(const ModelSpec& s, const WorldConfig& w) {
    if (!s.random) {
        LATTICE_CHECK(!s.path.empty(), "no model given (a checkpoint path, or random weights of a preset shape)");
        if (is_converted_folder(s.path)) return open_converted_model(s.path, ConvertedRank{w.tp, w.pp, w.rank}, s.verify);
        return open_model(s.path);
    }
    ModelConfig cfg;
    if (!s.preset.empty())
        cfg = preset_config(s.preset);
    else if (!s.path.empty())
        cfg = open_model(s.path)->config();
    else
        LATTICE_FAIL("random weights need a preset shape (--config) or a model whose shape to use (--model)");
    return make_random_source(cfg, s.seed);
}

PipelineLinks rank_pipeline_links(const ParallelContext& ctx) {
    PipelineLinks links;
    if (ctx.world.world > 1) {
        links.pipe = ctx.pp_world.get();
        links.prev = ctx.prev_stage();
        links.next = ctx.next_stage();
        links.world = ctx.world_comm.get();
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
    const AttentionShape& a = model.attention_shape();
    // Every sequence at full context, plus the block that step graphs reserve for their padding rows
    // (Engine: the pool then still holds max_seqs full sequences).
    const double useful = double(std::max<int64_t>(max_seqs, 1)) * double(a.table_width) + 1;
    const double blocks = std::min(std::floor(budget / per_block), useful);
    LATTICE_CHECK(blocks >= 1, "KV cache: {:.3f} GiB holds no block of {:.1f} KiB ({} tokens); raise --kv-cache-gb",
                  budget / double(int64_t(1) << 30), per_block / 1024, model.attention_shape().block_size);
    return int64_t(std::min(blocks, double(INT32_MAX)));
}

std::unique_ptr<Engine> make_local_engine(Model& model, const EngineOptions& opt, double kv_cache_gb) {
    if (model.kv_blocks() == 0) model.allocate_kv(kv_blocks_for(model, model.backend(), kv_cache_gb, opt.max_seqs));
    EngineOptions eo = opt;
    eo.kv_blocks = model.kv_blocks();
    return std::make_unique<Engine>(model, PipelineLinks{}, eo);
}

bool checkpoint_is_quantized(const TensorSource& src) {
    const std::string probe = "model.layers.0.mlp.down_proj.weight";
    return src.has(probe) && dtype_is_block(src.info(probe).dtype);
}

namespace {

using Clock = std::chrono::steady_clock;

// A lower bound of this rank's host memory for weights (1 byte per parameter, int8 being the
// narrowest kept form) plus an explicit KV budget, against the machine's physical memory: a config
// that cannot fit (vocab_size 2^31 - 1 with random weights) is refused with numbers before anything
// is allocated. (The default KV budget is sized from free memory after the weights.)
void check_host_memory(const ModelConfig& c, const BuildOptions& o) {
    const double ranks = double(o.tp) * double(o.pp);
    const double kv = o.kv_cache_gb > 0 ? o.kv_cache_gb * double(int64_t(1) << 30) : 0.0;
    const double need = c.parameter_count_estimate() / ranks + kv;
    const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    LATTICE_CHECK(phys <= 0 || need <= phys,
                  "{}: this rank needs at least {:.1f} GiB for its weights and KV cache, more than the {:.1f} GiB of "
                  "memory of this machine (vocab_size {}, hidden_size {}, num_hidden_layers {})",
                  c.source, need / double(1 << 30), phys / double(1 << 30), c.vocab, c.hidden, c.n_layers);
}

ParallelContext make_context(const BuildOptions& o) {
    LATTICE_CHECK(o.tp >= 1 && o.pp >= 1 && o.tp <= 4096 && o.pp <= 4096, "tp {} x pp {}: each must be in [1, 4096]",
                  o.tp, o.pp);
    WaitPolicy policy;
    policy.timeout_s = o.comm_timeout;
    policy.shared_memory = o.comm_shared_memory;
    ParallelContext ctx = (o.tp * o.pp > 1 || o.mpi) ? make_parallel_context(o.tp, o.pp, policy)
                                                     : make_local_context();
    if (o.on_context) o.on_context(ctx.world);
    return ctx;
}

// On a device backend the TP and PP groups move device memory: the backend's communicator over
// the same ranks replaces the host group, which stays alive underneath (NCCL bootstraps over it).
std::unique_ptr<Communicator> device_group(std::unique_ptr<Communicator> host, Backend& be, const char* name,
                                           double timeout, Built& b) {
    std::unique_ptr<Communicator> dev = be.make_group_comm(*host, name, timeout);
    if (!dev) return host;
    b.host_groups.push_back(std::move(host));
    return dev;
}

// A converted checkpoint runs as it was converted: quantization and stage split come from it, and
// settings that contradict it are refused with both named.
void follow_prepared(BuildOptions& o, const PreparedLayout& p) {
    const QuantMode q = parse_quant_mode(p.quant);
    if (o.quant_auto) {
        o.model.quant = q;
        o.model.quant_head = p.quant_head;
    }
    LATTICE_CHECK(o.model.quant == q && o.model.quant_head == p.quant_head,
                  "{}: converted with --quant {}{}, but this run asks for --quant {}{}: use --quant auto (or {})",
                  p.folder, p.quant, p.quant_head ? " --quant-head" : "", quant_mode_name(o.model.quant),
                  o.model.quant_head ? " --quant-head" : "", p.quant);
    LATTICE_CHECK(o.model.smooth_path.empty(), "{}: SmoothQuant factors are folded in at conversion ({}); drop --smooth",
                  p.folder, p.smooth.empty() ? "none were given then" : p.smooth);
    if (o.pp_layers.empty()) o.pp_layers = p.stage_layers;
    LATTICE_CHECK(o.pp_layers == p.stage_layers, "{}: converted with {} layers per stage; --pp-layers asks for {}",
                  p.folder, fmt::join(p.stage_layers, ","), fmt::join(o.pp_layers, ","));
}

Built build_in(const BuildOptions& opts, ParallelContext ctx, const TensorSource& src, Clock::time_point t0) {
    BuildOptions o = opts;
    if (const PreparedLayout* p = src.prepared()) {
        follow_prepared(o, *p);
    } else if (o.quant_auto && checkpoint_is_quantized(src)) {
        o.model.quant = QuantMode::kW8A8;
        o.model.quant_head = true;
    }
    Built b;
    b.world = ctx.world;
    BackendOptions bo = o.backend;
    if (resolve_backend_kind(bo.kind) == BackendKind::kCuda) {
        bo.cuda_device = ctx.world.device(o.devices);
        process_identity().device = bo.cuda_device;
    }
    b.backend = make_backend(bo);
    ctx.tp = device_group(std::move(ctx.tp), *b.backend, "tp", o.comm_timeout, b);
    ctx.pp_world = device_group(std::move(ctx.pp_world), *b.backend, "pp", o.comm_timeout, b);
    const ModelOptions mo = rank_model_options(o.model, ctx.world, src.config().n_layers, o.pp_layers);
    if (b.backend->device() == Device::kCpu) check_host_memory(src.config(), o);
    try {
        b.model = std::make_unique<Model>(src, *b.backend, mo, ctx.tp.get());
    } catch (const std::bad_alloc&) {
        LATTICE_FAIL("out of memory loading {} on this rank ({:.2f} G parameters in the model)", src.describe(),
                     src.config().parameter_count_estimate() * 1e-9);
    }
    int64_t blocks =
        o.kv_blocks > 0 ? o.kv_blocks : kv_blocks_for(*b.model, *b.backend, o.kv_cache_gb, o.engine.max_seqs);
    b.checkpoint_bytes_read = {b.model->checkpoint_bytes_read()};
    if (ctx.world.world > 1) {  // the leader's block ids must exist on every rank
        const int W = ctx.world.world;
        int64_t mine[2] = {blocks, b.model->checkpoint_bytes_read()};
        std::vector<int64_t> all(size_t(2 * W));
        ctx.world_comm->all_gather(View::contiguous(all.data(), DType::kI64, {2 * W}),
                                   View::contiguous(mine, DType::kI64, {2}));
        b.checkpoint_bytes_read.assign(size_t(W), 0);
        for (int r = 0; r < W; ++r) {
            blocks = std::min(blocks, all[size_t(2 * r)]);
            b.checkpoint_bytes_read[size_t(r)] = all[size_t(2 * r + 1)];
        }
    }
    b.model->allocate_kv(blocks);
    EngineOptions eo = o.engine;
    eo.kv_blocks = blocks;
    if (o.micro_batch > 0) eo.step_tokens = o.micro_batch;
    eo.heartbeat_s = std::min(eo.heartbeat_s, o.comm_timeout / 4);
    b.engine = std::make_unique<Engine>(*b.model, rank_pipeline_links(ctx), eo);
    b.tp_comm = std::move(ctx.tp);
    b.pp_comm = std::move(ctx.pp_world);
    b.world_comm = std::move(ctx.world_comm);
    b.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    LOG_INFO(
        "{}: loaded {} on {} in {:.2f} s ({:.1f} MiB of weights on this rank, {:.1f} MiB read from the checkpoint, "
        "quant {}; KV cache {} blocks of {} = {:.1f} MiB)",
        b.world.describe(), src.describe(), b.backend->name(), b.load_seconds,
        double(b.model->weight_bytes()) / (1 << 20), double(b.model->checkpoint_bytes_read()) / (1 << 20),
        quant_mode_name(mo.quant), blocks,
        b.model->attention_shape().block_size, double(blocks * b.model->kv_bytes_per_block()) / (1 << 20));
    return b;
}

}  // namespace

Built build(const BuildOptions& o, const TensorSource& src) {
    const auto t0 = Clock::now();
    return build_in(o, make_context(o), src, t0);
}

Built build(const BuildOptions& o, const ModelSpec& spec) {
    const auto t0 = Clock::now();
    ParallelContext ctx = make_context(o);
    std::unique_ptr<TensorSource> src = open_spec(spec, ctx.world);
    return build_in(o, std::move(ctx), *src, t0);  // src (and its file mappings) dies here
}

}  // namespace lattice
