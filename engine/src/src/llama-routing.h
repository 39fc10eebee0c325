// Routing traces: record the experts selected by every MoE layer, or force them from a file.
// File format: engine/README.md, "Routing trace format".
#pragma once

#include "llama.h"
#include "llama-graph.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct llama_ubatch;

#define LLAMA_ROUTING_MAGIC   "OSTROUTE"
#define LLAMA_ROUTING_VERSION 1u

// flags of the header
#define LLAMA_ROUTING_FLAG_WEIGHTS 1u // a float16 weight follows every id (after the id block)

#pragma pack(push, 1)
struct llama_routing_header {
    char     magic[8];      // "OSTROUTE"
    uint32_t version;       // LLAMA_ROUTING_VERSION
    uint32_t n_layer;       // layers of the model (MoE or not)
    uint32_t n_expert;      // routed experts per MoE layer
    uint32_t n_expert_used; // k: experts selected per token and layer
    uint32_t id_bytes;      // 1 (n_expert < 255) or 2
    uint32_t flags;         // LLAMA_ROUTING_FLAG_*
    uint64_t n_pos;         // token positions stored
    uint8_t  reserved[24];  // zero
};
#pragma pack(pop)

static_assert(sizeof(llama_routing_header) == 64, "routing header must be 64 bytes");

// record and/or force state of one llama_context
struct llama_routing {
    llama_routing(uint32_t n_layer, uint32_t n_expert, uint32_t n_expert_used);
    ~llama_routing();

    llama_routing(const llama_routing &) = delete;
    llama_routing & operator=(const llama_routing &) = delete;

    // open the trace to follow; false (and an error logged) if it is unreadable or its shape differs
    bool force_open(const std::string & path);
    // create or truncate the trace to write
    bool record_open(const std::string & path);

    bool forcing()   const { return !path_force.empty(); }
    bool recording() const { return f_record != nullptr; }

    // the forced trace has experts of layer il for every given position
    bool force_check(int il, const std::vector<llama_pos> & pos) const;
    // copy the forced experts of layer il for n positions into dst ([n][n_used] int32)
    void force_get(int il, const llama_pos * pos, int n, int n_used, int32_t * dst) const;
    // store the selected experts ([n][n_used] int32) of layer il for n positions
    void record_set(int il, const llama_pos * pos, int n, int n_used, const int32_t * ids);
    // write the rows touched since the last flush and the header
    bool record_flush();

    uint32_t n_layer;
    uint32_t n_expert;
    uint32_t n_expert_used;
    uint32_t id_bytes;
    uint32_t id_none; // id value of "no expert" (all ones)

    std::string path_force;
    std::string path_record;

private:
    size_t row_bytes() const { return (size_t) n_layer * n_expert_used * id_bytes; }
    uint32_t id_read(const uint8_t * row, size_t i) const;
    void     id_write(uint8_t * row, size_t i, uint32_t v) const;

    uint64_t             force_n_pos = 0;
    std::vector<uint8_t> force_ids;    // [n_pos][n_layer][n_expert_used]

    FILE *               f_record = nullptr;
    std::vector<uint8_t> record_ids;   // [n_pos][n_layer][n_expert_used], all rows so far
    uint64_t             record_dirty_begin = UINT64_MAX;
    uint64_t             record_dirty_end   = 0;
};

// graph input holding the expert ids of every MoE layer of one graph
class llm_graph_input_routing : public llm_graph_input_i {
public:
    llm_graph_input_routing(const llama_routing * routing) : routing(routing) {}
    virtual ~llm_graph_input_routing() = default;

    void set_input(const llama_ubatch * ubatch) override;
    bool can_reuse(const llm_graph_params & params) override;

    const llama_routing * routing;

    std::vector<int>           layers; // MoE layers of the graph, in build order
    std::vector<ggml_tensor *> ids;    // per layer: I32 [n_used, n_tokens], the forced input or a recorded copy
    std::vector<std::vector<llama_pos>> pos; // per layer: the positions of the rows of ids (last ubatch set)
};

// graph hook, called by build_moe_ffn with the experts the router selected: returns the ids the
// layer must use (a forced input tensor, or `selected` itself; a copy of it is kept to record it)
ggml_tensor * llama_routing_build_moe(
        const llama_routing * routing,
               ggml_context * ctx0,
           llm_graph_result * res,
                ggml_cgraph * gf,
                ggml_tensor * selected,
                        int   il);

// before set_inputs: false if a forced position is missing from the trace (the ubatch fails)
bool llama_routing_check(const llama_routing & routing, llm_graph_result & res, const llama_ubatch & ubatch);

// after the graph computed: copy the selected experts of every MoE layer to the record trace
void llama_routing_after_compute(llama_routing & routing, llm_graph_result & res, ggml_backend_sched_t sched);
