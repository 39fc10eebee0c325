// Resident expert pools: the experts a residency plan names are kept in one pool per GPU, shared by
// the layers on that GPU, and computed there in every forward pass. Passes of fewer than Np tokens
// take the split path (hot routes from the pool, cold routes on the CPU from host memory); passes of
// Np tokens or more take the upload path (each distinct cold expert copied once into a staging
// buffer and computed on the GPU). Plan format and flags: engine/README.md.
#pragma once

#include "llama.h"
#include "llama-graph.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

struct llama_model;

#include "llama-residency-policy.h"
#include "llama-residency-borrow.h"
#include "llama-residency-host.h"
#include "llama-ostinato.h"

#include <deque>
#include <mutex>

#include "ggml-ostinato.h" // GGML_MUL_MAT_ID_SKIP: the op_params index that marks a MUL_MAT_ID whose negative ids are skipped

// the expert matrices of one MoE layer, in the order up, gate, down, gate_up (absent ones are nullptr)
enum llama_residency_kind {
    LLAMA_RESIDENCY_UP      = 0,
    LLAMA_RESIDENCY_GATE    = 1,
    LLAMA_RESIDENCY_DOWN    = 2,
    LLAMA_RESIDENCY_GATE_UP = 3,
    LLAMA_RESIDENCY_N_KIND  = 4,
};

// one pool: the resident experts of the layers of one plan GPU whose expert matrices have the same
// types and shapes (a "size class"), plus a staging area for the upload path
// Zero slots: a token's k routes must select distinct matrices (CUDA's MUL_MAT_ID groups a token's rows by
// id and assumes no repeats), so route position j of a token that is not computed here uses zero slot j.
struct llama_residency_pool {
    int gpu = -1;                 // plan GPU
    ggml_backend_dev_t dev = nullptr;
    int64_t n_slot   = 0;         // resident slots; slots n_slot .. n_slot + n_used - 1 are zero slots
    int64_t n_expert = 0;         // staging slots (slot e holds expert e); then n_used zero slots
    int64_t n_used   = 0;         // k

    // one tensor per kind holds the pool's slots and then its staging area's, so that a decode step's GPU branch
    // computes resident and borrowed experts in one expert computation; exps and stage are its views
    ggml_tensor * all  [LLAMA_RESIDENCY_N_KIND] = {}; // [ne0, ne1, n_slot + n_used + n_expert + n_used]
    ggml_tensor * exps [LLAMA_RESIDENCY_N_KIND] = {}; // [ne0, ne1, n_slot + n_used]
    ggml_tensor * stage[LLAMA_RESIDENCY_N_KIND] = {}; // [ne0, ne1, n_expert + n_used], one layer at a time
    ggml_tensor * route_offset = nullptr;              // F32 [n_used, 1]: j*n_expert, added to the selected ids
};

struct llama_residency_layer {
    int pool = -1;                // -1: the layer computes as stock
    int n_resident = 0;
    ggml_tensor * host[LLAMA_RESIDENCY_N_KIND] = {}; // the model's expert tensors (host memory)

    // tables indexed by j*n_expert + e for route position j and expert e (I32 [1, n_used*n_expert])
    ggml_tensor * tab_slot  = nullptr; // pool slot of a resident expert, else pool zero slot j
    ggml_tensor * tab_cold  = nullptr; // the expert if cold, -1 if resident
    ggml_tensor * tab_stage = nullptr; // the expert if cold, else staging zero slot j
    // borrowed memory (decode passes), indexing `all`: the pool slot of a resident expert, n_slot + n_used + the
    // borrowed slot of a borrowed one, else pool zero slot j; and the expert if neither the plan nor a borrowed slot
    // holds it, else -1
    ggml_tensor * tab_hot_b  = nullptr;
    ggml_tensor * tab_cold_b = nullptr;
};

// the in-engine timers (--residency-timers): CPU nodes around a split-path layer's branches stamp the times in the
// layer's slot (the graph's nodes point to it), the last one appends the layer's timing
struct llama_residency_timers;

struct llama_residency_timer_slot {
    llama_residency_timers * owner = nullptr;
    int      layer    = -1;
    int64_t  t0_us    = 0; // the cold inputs are on the CPU and the GPU is idle: the GPU branch starts
    int64_t  t1_us    = 0; // the GPU branch has finished (hot_wait synchronized its stream): the CPU branch starts
    int32_t  n_cold   = 0;
    int32_t  n_tokens = 0;
    uint64_t pass     = 0;
};

struct llama_residency_timers {
    static constexpr size_t n_keep = 262144; // timings kept (the oldest dropped)

    std::vector<llama_residency_timer_slot> slots; // per model layer
    int layer_first = -1;                          // a pass starts at this layer's first node

    std::mutex mutex;                              // records and n_pass: read by other threads (the server's /residency)
    std::deque<llama_residency_timing> records;
    uint64_t n_pass = 0;
};

struct llama_residency {
    ~llama_residency();

    std::string path;
    uint32_t    n_upload_min = 512;   // Np
    bool        prefill_native = false; // ablation: passes of more than one token compute as stock (pools unused)
    bool        overlap = false;        // split path: cold inputs to the CPU before the GPU branch, cold routes after it
    std::unique_ptr<llama_residency_timers> timers; // --residency-timers; null: off
    int         il_first = -1;          // first layer with a pool (where the native path logs its passes)

    std::vector<llama_residency_layer> layers; // per model layer
    std::vector<llama_residency_pool>  pools;

    std::vector<std::vector<int32_t>> slot_of; // the plan's slots: [layer][expert] -> pool slot, -1 if not resident

    // the expert policy (--residency-policy); null: static (the plan's experts for the whole run)
    std::unique_ptr<llama_residency_policy> policy;

    // borrowed memory (--residency-borrow); null: off. Its thread copies into the pools' buffers: stopped first
    std::unique_ptr<llama_residency_borrow> borrow;

    // one graph per decode step (--residency-graph step): a resident CPU worker per pool device; empty: off
    std::vector<std::unique_ptr<llama_residency_host>> hosts;
    bool graph_step_warned = false; // (logged once: a decode graph that takes per-segment graphs instead)

    std::vector<ggml_context *>         ctxs;
    std::vector<ggml_backend_buffer_t>  bufs;

    // upload statistics over the model's lifetime (llama_model_residency_stats)
    mutable uint64_t n_upload_pass    = 0;
    mutable uint64_t n_upload_experts = 0;
    mutable uint64_t n_upload_bytes   = 0;
    mutable int64_t  t_upload_us      = 0;
};

// parse and check the plan, allocate the pools, copy the resident experts; nullptr (and an error logged) on failure
llama_residency * llama_residency_load(llama_model & model, const char * path, uint32_t n_upload_min);

// the expert computation of build_moe_ffn for given ids and expert matrices (up, gate, down, gate_up)
// returns the un-weighted expert outputs [n_embd, n_expert_used, n_tokens]
using llama_residency_experts_fn = std::function<ggml_tensor * (ggml_tensor * ids, ggml_tensor * const * exps)>;

// graph hook of build_moe_ffn: the experts' outputs computed from the pool and the CPU (split path)
// or the pool and the staging buffer (upload path); nullptr when the layer computes as stock.
// n_pass: the tokens of the forward pass (the last layer may compute fewer rows, the outputs only); the native
// prefill ablation and the dynamic policies decide by it
ggml_tensor * llama_residency_build_moe(
        const llama_residency * rsd,
               ggml_context * ctx0,
           llm_graph_result * res,
                ggml_cgraph * gf,
                ggml_tensor * selected,
                        int   il,
                    int64_t   n_pass,
          ggml_tensor * const * exps,
                       bool   has_extras,
        const llama_residency_experts_fn & build_experts);

// after a graph was built: route the scheduler's eval callback through the upload path's hook when
// the graph has upload layers (user callbacks are still called), else restore the user's callback
void llama_residency_after_build(
        const llama_residency * rsd,
           llm_graph_result & res,
       ggml_backend_sched_t   sched,
  ggml_backend_sched_eval_callback cb_user,
                       void * cb_user_data);

// after a graph was computed: with one graph per decode step, wait for it and check that every CPU worker answered in
// time; false (an error logged, naming the layer and the pass) if one did not
bool llama_residency_after_compute(const llama_residency * rsd, llm_graph_result & res, ggml_backend_sched_t sched);

// the userdata of one layer's split-path CPU nodes (cold_in, hot_wait, cold_done) in one graph
struct llama_residency_branch_node {
    ggml_backend_dev_t           dev     = nullptr; // the device of the layer's pool
    ggml_backend_t               backend = nullptr; // the graph's backend for dev (llama_residency_after_build)
    bool                         wait    = true;    // in turn (or timed): the CPU branch starts after the GPU branch
    llama_residency_timer_slot * slot    = nullptr; // the layer's timer slot (--residency-timers), else null
    llama_residency_borrow     * borrow  = nullptr; // borrowed memory: cold_in counts the layer's routes
    int                          layer   = -1;
    bool                         decode  = false;   // a single-token pass (its GPU branch has the borrowed slots)
};

// graph input that lists the upload nodes of one graph (the staging ids of each upload layer)
class llm_graph_input_residency : public llm_graph_input_i {
public:
    llm_graph_input_residency(const llama_residency * rsd) : rsd(rsd) {}

    // a pass of a dynamic policy: counted, and logged when it computes as llama.cpp does (no cache node)
    void set_input(const llama_ubatch * ubatch) override;
    // (not after a CPU worker failed: the next graph takes per-segment graphs)
    bool can_reuse(const llm_graph_params & params) override;

    const llama_residency * rsd;

    std::unordered_map<const ggml_tensor *, int> upload_nodes; // staging ids node -> layer
    int upload_last = -1;                                      // layer of the last upload node

    // dynamic policies: the flat route ids of each layer the pass serves from the pool -> layer
    std::unordered_map<const ggml_tensor *, int> cache_nodes;
    bool     native   = false; // the pass computes as llama.cpp does (the policy does not serve it)
    bool     started  = false; // the pass's first cache node was handled (decay: the token boundary)
    std::set<int> swapped;     // decay: the layers whose pool the pass's token boundary changed
    bool     borrow_decode = false; // borrowed memory: the graph's GPU branch has the borrowed slots
    int64_t  pos0     = -1;    // first position and tokens of the pass in flight
    int64_t  n_tokens = 0;
    uint64_t pass     = 0;

    // the split path's CPU nodes' userdata (a deque: the nodes keep pointers to its elements)
    std::deque<llama_residency_branch_node> branch_nodes;

    // one graph per decode step: each worker's branches in this graph, by layer, and how many the graph sends
    struct host_graph {
        llama_residency_host * host = nullptr;
        std::vector<llama_residency_host_branch *> by_layer;
        int n_send = 0;
    };
    std::vector<host_graph> host_graphs;
    std::deque<llama_residency_host_branch> host_branches;
    ggml_context * host_ctx = nullptr; // the branches' graphs
    ~llm_graph_input_residency() override;

    // set by llama_residency_after_build
    ggml_backend_sched_t sched = nullptr;
    ggml_backend_sched_eval_callback cb_user = nullptr;
    void * cb_user_data = nullptr;

    // statistics of the pass in flight
    uint64_t pass_experts = 0;
    uint64_t pass_bytes   = 0;
    int64_t  pass_us      = 0;
};
