#include "llama-routing.h"

#include "llama-ostinato.h"
#include "llama-batch.h"
#include "llama-context.h"
#include "llama-impl.h"
#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

//
// llama_routing
//

llama_routing::llama_routing(uint32_t n_layer, uint32_t n_expert, uint32_t n_expert_used) :
    n_layer(n_layer), n_expert(n_expert), n_expert_used(n_expert_used),
    id_bytes(n_expert < 255 ? 1 : 2),
    id_none(n_expert < 255 ? 0xFFu : 0xFFFFu) {}

llama_routing::~llama_routing() {
    if (f_record) {
        record_flush();
        fclose(f_record);
    }
}

uint32_t llama_routing::id_read(const uint8_t * row, size_t i) const {
    if (id_bytes == 1) {
        return row[i];
    }
    uint16_t v;
    memcpy(&v, row + 2*i, 2);
    return v;
}

void llama_routing::id_write(uint8_t * row, size_t i, uint32_t v) const {
    if (id_bytes == 1) {
        row[i] = (uint8_t) v;
    } else {
        const uint16_t v16 = (uint16_t) v;
        memcpy(row + 2*i, &v16, 2);
    }
}

// open a trace for reading: a regular file only (a FIFO or device would block or never end), without blocking
static FILE * routing_open_regular(const std::string & path, uint64_t & size, std::string & err) {
    const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        err = strerror(errno);
        return nullptr;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err = "not a regular file";
        close(fd);
        return nullptr;
    }
    size = (uint64_t) st.st_size;
    FILE * f = fdopen(fd, "rb");
    if (!f) {
        err = strerror(errno);
        close(fd);
    }
    return f;
}

bool llama_routing::force_open(const std::string & path) {
    uint64_t size = 0;
    std::string err;
    FILE * f = routing_open_regular(path, size, err);
    if (!f) {
        LLAMA_LOG_ERROR("%s: cannot open routing trace '%s' to force routing: %s\n", __func__, path.c_str(), err.c_str());
        return false;
    }
    std::unique_ptr<FILE, decltype(&fclose)> fp(f, &fclose);

    llama_routing_header hdr;
    if (fread(&hdr, sizeof(hdr), 1, f) != 1 || memcmp(hdr.magic, LLAMA_ROUTING_MAGIC, 8) != 0) {
        LLAMA_LOG_ERROR("%s: '%s' is not a routing trace (expected magic %s)\n", __func__, path.c_str(), LLAMA_ROUTING_MAGIC);
        return false;
    }
    if (hdr.version != LLAMA_ROUTING_VERSION) {
        LLAMA_LOG_ERROR("%s: '%s': version %u, expected %u\n", __func__, path.c_str(), hdr.version, LLAMA_ROUTING_VERSION);
        return false;
    }
    if (hdr.n_layer != n_layer || hdr.n_expert != n_expert || hdr.n_expert_used != n_expert_used || hdr.id_bytes != id_bytes) {
        LLAMA_LOG_ERROR("%s: '%s' has n_layer=%u n_expert=%u n_expert_used=%u id_bytes=%u, the model needs %u %u %u %u\n",
                __func__, path.c_str(), hdr.n_layer, hdr.n_expert, hdr.n_expert_used, hdr.id_bytes,
                n_layer, n_expert, n_expert_used, id_bytes);
        return false;
    }
    // the header's size must be the file's before anything is allocated (engine/README.md, "Routing trace format")
    const uint64_t rb  = row_bytes();
    const uint64_t per = rb + ((hdr.flags & LLAMA_ROUTING_FLAG_WEIGHTS) ? (uint64_t) n_layer * n_expert_used * 2 : 0);
    if (size < sizeof(hdr) || hdr.n_pos != (size - sizeof(hdr)) / per || (size - sizeof(hdr)) % per != 0) {
        LLAMA_LOG_ERROR("%s: '%s': the header says %" PRIu64 " positions of %" PRIu64 " bytes, the file holds %" PRIu64
                " bytes after the header\n", __func__, path.c_str(), hdr.n_pos, per, size - std::min<uint64_t>(size, sizeof(hdr)));
        return false;
    }

    std::vector<uint8_t> data(hdr.n_pos * rb);
    if (!data.empty() && fread(data.data(), 1, data.size(), f) != data.size()) {
        LLAMA_LOG_ERROR("%s: '%s': could not read %" PRIu64 " positions\n", __func__, path.c_str(), hdr.n_pos);
        return false;
    }
    // every row: all k ids "no expert", or k distinct experts in range
    std::vector<uint32_t> row(n_expert_used);
    for (uint64_t p = 0; p < hdr.n_pos; ++p) {
        for (uint32_t il = 0; il < n_layer; ++il) {
            int n_none = 0;
            for (uint32_t k = 0; k < n_expert_used; ++k) {
                row[k] = id_read(data.data() + p * rb, (size_t) il * n_expert_used + k);
                n_none += row[k] == id_none;
                if (row[k] != id_none && row[k] >= n_expert) {
                    LLAMA_LOG_ERROR("%s: '%s': position %" PRIu64 ", layer %u: expert id %u is out of range (n_expert = %u)\n",
                            __func__, path.c_str(), p, il, row[k], n_expert);
                    return false;
                }
                for (uint32_t j = 0; j < k && row[k] != id_none; ++j) {
                    if (row[j] == row[k]) {
                        LLAMA_LOG_ERROR("%s: '%s': position %" PRIu64 ", layer %u: expert %u appears twice\n",
                                __func__, path.c_str(), p, il, row[k]);
                        return false;
                    }
                }
            }
            if (n_none != 0 && n_none != (int) n_expert_used) {
                LLAMA_LOG_ERROR("%s: '%s': position %" PRIu64 ", layer %u: %d of %u ids are \"no expert\" (expected all or none)\n",
                        __func__, path.c_str(), p, il, n_none, n_expert_used);
                return false;
            }
        }
    }

    force_ids   = std::move(data);
    force_n_pos = hdr.n_pos;
    path_force  = path;

    LLAMA_LOG_INFO("%s: forcing routing from '%s' (%" PRIu64 " positions)\n", __func__, path.c_str(), force_n_pos);
    return true;
}

// the traces this process created: record may truncate them again (a replay resumes a session), and no other file
static std::mutex routing_created_mutex;
static std::set<std::string> routing_created;

bool llama_routing::record_open(const std::string & path) {
    bool ours = false;
    {
        std::lock_guard<std::mutex> lock(routing_created_mutex);
        ours = routing_created.count(path) > 0;
    }
    // create it, never follow a link or open an existing file this process did not create
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && ours) {
        fd = open(path.c_str(), O_RDWR | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
            close(fd);
            fd = -1;
            errno = EINVAL;
        }
    }
    if (fd < 0) {
        LLAMA_LOG_ERROR("%s: cannot create routing trace '%s': %s\n", __func__, path.c_str(),
                errno == EEXIST ? "it exists and this server did not create it (remove it first)" : strerror(errno));
        return false;
    }
    f_record = fdopen(fd, "w+b");
    if (!f_record) {
        close(fd);
        LLAMA_LOG_ERROR("%s: cannot create routing trace '%s'\n", __func__, path.c_str());
        return false;
    }
    {
        std::lock_guard<std::mutex> lock(routing_created_mutex);
        routing_created.insert(path);
    }
    path_record = path;
    record_ids.clear();
    record_dirty_begin = UINT64_MAX;
    record_dirty_end   = 0;
    if (!record_flush()) {
        return false;
    }
    LLAMA_LOG_INFO("%s: recording routing to '%s'\n", __func__, path.c_str());
    return true;
}

bool llama_routing::force_check(int il, const std::vector<llama_pos> & pos) const {
    const size_t rb = row_bytes();
    for (const llama_pos p : pos) {
        if (p < 0 || (uint64_t) p >= force_n_pos) {
            LLAMA_LOG_ERROR("%s: position %d is not in the routing trace '%s' (%" PRIu64 " positions)\n",
                    __func__, p, path_force.c_str(), force_n_pos);
            return false;
        }
        const uint8_t * row = force_ids.data() + (size_t) p * rb;
        if (id_read(row, (size_t) il * n_expert_used) == id_none) {
            LLAMA_LOG_ERROR("%s: routing trace '%s' has no experts for position %d, layer %d\n",
                    __func__, path_force.c_str(), p, il);
            return false;
        }
    }
    return true;
}

void llama_routing::force_get(int il, const llama_pos * pos, int n, int n_used, int32_t * dst) const {
    const size_t rb = row_bytes();
    for (int i = 0; i < n; ++i) {
        const uint8_t * row = force_ids.data() + (size_t) pos[i] * rb;
        for (int k = 0; k < n_used; ++k) {
            dst[(size_t) i*n_used + k] = (int32_t) id_read(row, (size_t) il * n_expert_used + k);
        }
    }
}

void llama_routing::record_set(int il, const llama_pos * pos, int n, int n_used, const int32_t * ids) {
    const size_t rb = row_bytes();
    for (int i = 0; i < n; ++i) {
        const uint64_t p = (uint64_t) pos[i];
        if ((p + 1) * rb > record_ids.size()) {
            // rows between the last one and this one stay "no expert", and must reach the file too
            record_dirty_begin = std::min(record_dirty_begin, (uint64_t) (record_ids.size() / rb));
            record_ids.resize((p + 1) * rb, 0xFF);
        }
        uint8_t * row = record_ids.data() + p * rb;
        for (int k = 0; k < (int) n_expert_used; ++k) {
            id_write(row, (size_t) il * n_expert_used + k, k < n_used ? (uint32_t) ids[(size_t) i*n_used + k] : id_none);
        }
        record_dirty_begin = std::min(record_dirty_begin, p);
        record_dirty_end   = std::max(record_dirty_end,   p + 1);
    }
}

bool llama_routing::record_flush() {
    if (!f_record) {
        return false;
    }
    const size_t rb = row_bytes();

    llama_routing_header hdr = {};
    memcpy(hdr.magic, LLAMA_ROUTING_MAGIC, 8);
    hdr.version       = LLAMA_ROUTING_VERSION;
    hdr.n_layer       = n_layer;
    hdr.n_expert      = n_expert;
    hdr.n_expert_used = n_expert_used;
    hdr.id_bytes      = id_bytes;
    hdr.flags         = 0;
    hdr.n_pos         = record_ids.size() / rb;

    bool ok = fseek(f_record, 0, SEEK_SET) == 0 && fwrite(&hdr, sizeof(hdr), 1, f_record) == 1;
    if (ok && record_dirty_end > record_dirty_begin) {
        // the rows before the dirty range may never have been written: write from the first unwritten one
        ok = fseek(f_record, (long) (sizeof(hdr) + record_dirty_begin * rb), SEEK_SET) == 0 &&
             fwrite(record_ids.data() + record_dirty_begin * rb, rb, record_dirty_end - record_dirty_begin, f_record) ==
                 record_dirty_end - record_dirty_begin;
    }
    ok = ok && fflush(f_record) == 0;
    if (!ok) {
        LLAMA_LOG_ERROR("%s: failed to write routing trace '%s'\n", __func__, path_record.c_str());
    }
    record_dirty_begin = UINT64_MAX;
    record_dirty_end   = 0;
    return ok;
}

//
// llm_graph_input_routing
//

// the positions whose experts a layer computes: all tokens of the ubatch, or, in the last layer,
// only the tokens that produce outputs (the graph drops the others before that layer's FFN)
static void routing_positions(const llama_ubatch & ubatch, int64_t n_rows, std::vector<llama_pos> & out) {
    out.clear();
    if (n_rows == (int64_t) ubatch.n_tokens) {
        out.assign(ubatch.pos, ubatch.pos + ubatch.n_tokens);
        return;
    }
    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        if (ubatch.output && ubatch.output[i]) {
            out.push_back(ubatch.pos[i]);
        }
    }
    GGML_ASSERT((int64_t) out.size() == n_rows);
}

void llm_graph_input_routing::set_input(const llama_ubatch * ubatch) {
    pos.resize(layers.size());
    std::vector<int32_t> buf;
    for (size_t i = 0; i < layers.size(); ++i) {
        ggml_tensor * t = ids[i];
        routing_positions(*ubatch, t->ne[1], pos[i]);
        if (routing->forcing() && ggml_nelements(t) > 0) {
            buf.resize(ggml_nelements(t));
            routing->force_get(layers[i], pos[i].data(), (int) pos[i].size(), (int) t->ne[0], buf.data());
            ggml_backend_tensor_set(t, buf.data(), 0, ggml_nbytes(t));
        }
    }
}

bool llm_graph_input_routing::can_reuse(const llm_graph_params & params) {
    // allow_reuse already compared the ubatch shape and the routing generation
    return params.routing == routing;
}

//
// graph and context hooks
//

static llm_graph_input_routing * routing_input_get(llm_graph_result * res) {
    for (auto & inp : res->inputs) {
        if (auto * r = dynamic_cast<llm_graph_input_routing *>(inp.get())) {
            return r;
        }
    }
    return nullptr;
}

ggml_tensor * llama_routing_build_moe(
        const llama_routing * routing,
               ggml_context * ctx0,
           llm_graph_result * res,
                ggml_cgraph * gf,
                ggml_tensor * selected,
                        int   il) {
    if (routing == nullptr) {
        return selected;
    }

    auto * inp = routing_input_get(res);
    if (inp == nullptr) {
        inp = static_cast<llm_graph_input_routing *>(res->add_input(std::make_unique<llm_graph_input_routing>(routing)));
    }

    ggml_tensor * ids = selected;
    ggml_tensor * rec = nullptr;
    if (routing->forcing()) {
        ids = ggml_new_tensor_2d(ctx0, GGML_TYPE_I32, selected->ne[0], selected->ne[1]);
        ggml_set_input(ids);
        ggml_format_name(ids, "routing_forced-%d", il);
        if (routing->recording()) {
            // keep the input's memory until it is read back after the graph
            ggml_set_output(ids);
        }
        rec = ids;
    } else {
        // the selection is a view of the argsort result, whose memory the allocator reuses:
        // record a contiguous copy that is kept as a graph output
        rec = ggml_cont(ctx0, selected);
        ggml_format_name(rec, "routing_record-%d", il);
        ggml_set_output(rec);
        ggml_build_forward_expand(gf, rec);
    }

    inp->layers.push_back(il);
    inp->ids.push_back(rec);

    return ids;
}

bool llama_routing_check(const llama_routing & routing, llm_graph_result & res, const llama_ubatch & ubatch) {
    if (!routing.forcing()) {
        return true;
    }
    const auto * inp = routing_input_get(&res);
    if (inp == nullptr) {
        return true;
    }
    std::vector<llama_pos> pos;
    for (size_t i = 0; i < inp->layers.size(); ++i) {
        routing_positions(ubatch, inp->ids[i]->ne[1], pos);
        if (!routing.force_check(inp->layers[i], pos)) {
            return false;
        }
    }
    return true;
}

void llama_routing_after_compute(llama_routing & routing, llm_graph_result & res, ggml_backend_sched_t sched) {
    if (!routing.recording()) {
        return;
    }
    const auto * inp = routing_input_get(&res);
    if (inp == nullptr) {
        return;
    }
    ggml_backend_sched_synchronize(sched);

    std::vector<int32_t> buf;
    for (size_t i = 0; i < inp->layers.size(); ++i) {
        ggml_tensor * t = inp->ids[i];
        if (ggml_nelements(t) == 0) {
            continue;
        }
        buf.resize(ggml_nelements(t));
        ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
        routing.record_set(inp->layers[i], inp->pos[i].data(), (int) inp->pos[i].size(), (int) t->ne[0], buf.data());
    }
    routing.record_flush();
}

//
// public API
//

int32_t llama_context::set_routing_files(const char * path_record, const char * path_force) {
    const std::string rec   = path_record ? path_record : "";
    const std::string force = path_force  ? path_force  : "";

    routing.reset();
    routing_gen++;

    if (rec.empty() && force.empty()) {
        return 0;
    }

    const auto & hparams = model.hparams;
    if (hparams.n_expert == 0) {
        LLAMA_LOG_ERROR("%s: the model has no MoE layers to record or force\n", __func__);
        return -1;
    }

    auto r = std::make_unique<llama_routing>(hparams.n_layer(), hparams.n_expert, hparams.n_expert_used_max());
    if (!force.empty() && !r->force_open(force)) {
        return -1;
    }
    if (!rec.empty() && !r->record_open(rec)) {
        return -1;
    }
    routing = std::move(r);
    return 0;
}

int32_t llama_set_routing_files(llama_context * ctx, const char * path_record, const char * path_force) {
    return ctx->set_routing_files(path_record, path_force);
}
