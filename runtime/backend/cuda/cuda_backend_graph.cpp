// CudaBackend's token-metadata staging (pinned host -> device, graph-replayable) and its step graphs (CudaGraph:
// one captured per batch-size bucket, replayed with the batch's metadata copied in first). Layout of the
// staging area for a batch of m tokens (int32):
//   [ids m | positions m | seqs m | PrefillTile tiles (4 ints each, <= m) | block tables m x width]
// Offsets depend only on m (and the model's table width), so a graph captured for m tokens finds
// the data at replay; the whole area is copied each time.
#include <algorithm>
#include <cstring>

#include "base/cuda_check.h"
#include "base/log.h"
#include "runtime/backend/cuda/cuda_backend.h"

namespace lattice {

// ---- metadata staging ----
int64_t CudaBackend::fill_staging(int32_t* host, const TokenBatch& b) {
    const int64_t m = b.count;
    int32_t* pos = host + m;
    int32_t* seqs = host + 2 * m;
    if (b.ids)
        std::memcpy(host, b.ids, size_t(m) * 4);
    else
        std::memset(host, 0, size_t(m) * 4);
    std::memcpy(pos, b.positions, size_t(m) * 4);
    std::memcpy(seqs, b.seqs, size_t(m) * 4);
    if (b.num_seqs > 0) std::memcpy(host + 7 * m, b.block_tables, size_t(b.num_seqs * b.table_width) * 4);
    return cuda::build_prefill_tiles(reinterpret_cast<cuda::PrefillTile*>(host + 3 * m), pos, seqs, m);
}

void CudaBackend::write_staging(const TokenBatch& b) {
    meta_tiles_ = fill_staging(meta_host_, b);
    meta_count_ = b.count;
    meta_seqs_ = b.num_seqs;
}

void CudaBackend::ensure_batch(const TokenBatch& b) {
    const int64_t m = b.count;
    LATTICE_CHECK(m >= 0 && m <= (int64_t(1) << 26) && (m == 0 || (b.positions && b.seqs)) && b.num_seqs >= 0 &&
                      b.num_seqs <= m && b.table_width >= 0 && (b.num_seqs == 0 || b.block_tables),
                  "CudaBackend: token batch of {} tokens without positions, sequences or block tables", m);
    if (m > meta_cap_ || b.table_width > meta_width_) {
        LATTICE_CHECK(!capturing_,
                      "CudaBackend: token metadata must grow during graph capture; run one eager step "
                      "of this batch size first");
        CUDA_CHECK(cudaEventSynchronize(meta_event_));
        if (graphs_ > 0) {  // captured graphs copy from / read these: keep them alive
            if (meta_host_) retired_host_.push_back(meta_host_);
            if (meta_dev_) retired_dev_.push_back(meta_dev_);
        } else {
            if (meta_host_) CUDA_CHECK(cudaFreeHost(meta_host_));
            if (meta_dev_) CUDA_CHECK(cudaFree(meta_dev_));
        }
        meta_host_ = nullptr;
        meta_dev_ = nullptr;
        const int64_t cap = std::max<int64_t>({m, 2 * meta_cap_, 64});
        const int64_t width = std::max(meta_width_, b.table_width);
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&meta_host_), size_t(cap * (7 + width)) * 4));
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&meta_dev_), size_t(cap * (7 + width)) * 4));
        meta_cap_ = cap;
        meta_width_ = width;
        meta_valid_ = false;
        meta_count_ = -1;
    }
    auto same = [&] {
        if (meta_count_ != m || meta_seqs_ != b.num_seqs) return false;
        const size_t bytes = size_t(m) * 4;
        if (std::memcmp(meta_host_ + m, b.positions, bytes) != 0 ||
            std::memcmp(meta_host_ + 2 * m, b.seqs, bytes) != 0 ||
            std::memcmp(meta_host_ + 7 * m, b.block_tables, size_t(b.num_seqs * b.table_width) * 4) != 0)
            return false;
        if (b.ids) return std::memcmp(meta_host_, b.ids, bytes) == 0;
        for (int64_t i = 0; i < m; ++i)
            if (meta_host_[i] != 0) return false;
        return true;
    };
    if (capturing_) {
        if (meta_in_graph_ && same()) return;
        write_staging(b);
        meta_in_graph_ = true;
    } else {
        if (meta_valid_ && same()) return;
        CUDA_CHECK(cudaEventSynchronize(meta_event_));  // the previous copy from the pinned area is done
        write_staging(b);
    }
    const size_t bytes = size_t(m * (7 + b.table_width)) * 4;
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(meta_dev_, meta_host_, bytes, cudaMemcpyHostToDevice, stream_));
    if (!capturing_) {
        CUDA_CHECK(cudaEventRecord(meta_event_, stream_));
        meta_valid_ = true;
    }
}

void CudaBackend::use_batch(const TokenBatch& b) {
    if (step_.count > 0 && b.count == step_.count && b.ids == step_.ids && b.positions == step_.positions &&
        b.seqs == step_.seqs && b.block_tables == step_.block_tables && b.num_seqs == step_.num_seqs &&
        b.table_width == step_.table_width)
        return;
    ensure_batch(b);
}

void CudaBackend::begin_step(const TokenBatch& b) {
    make_current();
    step_ = {};
    ensure_batch(b);
    step_ = b;
}

void CudaBackend::begin_capture() {
    LATTICE_CHECK(!capturing_, "CudaBackend::begin_capture: already capturing");
    make_current();
    CUDA_CHECK(cudaEventSynchronize(meta_event_));
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    meta_in_graph_ = false;
}

void CudaBackend::end_capture() {
    capturing_ = false;
    meta_in_graph_ = false;
    meta_valid_ = false;  // the pinned area holds the captured batch, the device copy never ran
}

int64_t CudaBackend::stage_batch_for_replay(const TokenBatch& b, const MetaArea& area) {
    LATTICE_CHECK(b.count <= area.cap && b.table_width <= area.width && (b.count == 0 || (b.positions && b.seqs)),
                  "CudaGraph::replay: batch of {} tokens (block tables of width {})", b.count, b.table_width);
    CUDA_CHECK(cudaEventSynchronize(meta_event_));  // all earlier copies from any staging area are done
    if (area.host == meta_host_) {
        write_staging(b);
        return meta_tiles_;
    }
    meta_valid_ = false;
    return fill_staging(area.host, b);
}

void CudaBackend::after_replay(const MetaArea& area) {
    CUDA_CHECK(cudaEventRecord(meta_event_, stream_));
    meta_valid_ = area.host == meta_host_;
}

// ---- CudaGraph ----
CudaGraph::~CudaGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
}

void CudaGraph::capture(CudaBackend& be, const TokenBatch& batch, const std::function<void()>& body) {
    LATTICE_CHECK(!exec_, "CudaGraph::capture: already captured (one graph per batch-size bucket)");
    be.begin_capture();
    try {
        body();
    } catch (...) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(be.stream(), &g);
        if (g) cudaGraphDestroy(g);
        be.end_capture();
        throw;
    }
    const cudaError_t e = cudaStreamEndCapture(be.stream(), &graph_);
    be.end_capture();
    CUDA_CHECK(e);
    CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    be.graph_captured();
    count_ = batch.count;
    area_ = be.meta_area();
    tiles_ = be.staged_tiles();
}

void CudaGraph::replay(CudaBackend& be, const TokenBatch& batch) {
    LATTICE_CHECK(exec_, "CudaGraph::replay before capture");
    LATTICE_CHECK(batch.count == count_, "CudaGraph::replay: batch of {} tokens, captured for {}", batch.count, count_);
    const int64_t tiles = be.stage_batch_for_replay(batch, area_);
    // The graph's memcpy node copies the tile count it was captured with; decode graphs do not read
    // tiles, a captured prefill (several tokens of one slot) needs the same tiling.
    LATTICE_CHECK(tiles == tiles_ || tiles_ == count_,
                  "CudaGraph::replay: the batch splits into {} prefill tiles, the graph was captured with {}", tiles,
                  tiles_);
    CUDA_CHECK(cudaGraphLaunch(exec_, be.stream()));
    be.after_replay(area_);
    replayed_ = true;
}

void CudaGraph::relaunch(CudaBackend& be) {
    LATTICE_CHECK(exec_ && replayed_, "CudaGraph::relaunch before a replay");
    CUDA_CHECK(cudaGraphLaunch(exec_, be.stream()));
}

namespace {
struct CudaStepGraph final : StepGraph {
    CudaGraph graph;
};
}  // namespace

std::unique_ptr<StepGraph> CudaBackend::capture_step(const TokenBatch& batch, const std::function<void()>& body) {
    auto g = std::make_unique<CudaStepGraph>();
    g->graph.capture(*this, batch, body);
    return g;
}

void CudaBackend::replay_step(StepGraph& graph, const TokenBatch& batch) {
    auto* g = dynamic_cast<CudaStepGraph*>(&graph);
    LATTICE_CHECK(g, "CudaBackend::replay_step: a graph of another backend");
    g->graph.replay(*this, batch);
}

}  // namespace lattice
