// Ostinato additions to the llama.cpp public API (see engine/README.md).
#pragma once

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

    // Routing traces: for every token position and layer, the experts the MoE router selected.
    //
    // path_record: write the selection of every computed token position to this trace file
    //              (created or truncated; rows are indexed by token position).
    // path_force:  make every MoE layer use the experts of this trace file instead of its own
    //              top-k (teacher-forced routing); the routing weights are still the router's
    //              probabilities at the forced experts.
    // Either may be NULL or "" to turn it off. Both may be set: then the recorded trace repeats
    // the forced one. Positions are those of the single sequence the context serves.
    // Returns 0 on success, -1 if a file cannot be opened or does not match the model.
    LLAMA_API int32_t llama_set_routing_files(
            struct llama_context * ctx,
                      const char * path_record,
                      const char * path_force);

    // Resident expert pools (engine/README.md, "Resident expert pools" and "Residency plan format").
    //
    // Load a residency plan: allocate one pool per plan GPU (on the device llama.cpp put that GPU's layers
    // on; a host buffer on a CPU-only build), copy the plan's experts into it and build the tables that map
    // every (layer, expert) to a pool slot or to host memory. Call it after loading the model and before
    // creating contexts, so the pools are allocated before the KV cache and compute buffers. Every routed
    // expert tensor must be in host memory (--cpu-moe). Forward passes of fewer than n_upload_min tokens
    // (Np) take the split path, longer ones the upload path. path_plan NULL or "" removes the plan.
    // Returns 0 on success, -1 if the plan cannot be read, does not fit the model, or the pools cannot be allocated.
    LLAMA_API int32_t llama_model_load_residency(
            struct llama_model * model,
                    const char * path_plan,
                      uint32_t   n_upload_min);

    // Ablation of the prefill paths: with native set, forward passes of more than one token compute as the stock
    // engine does (every route from host memory: on the CPU, or uploaded by the backend's op offload), and only
    // single-token passes use the pools (split path). Returns 0, or -1 if the model has no plan.
    LLAMA_API int32_t llama_model_residency_set_prefill_native(
            struct llama_model * model,
                          bool   native);

    // Order of the split path's branches (engine/README.md, "Overlapped branches"): with overlap set, every pass that
    // takes the split path first hands the cold routes' inputs to the CPU, then computes the resident routes on the
    // pool's device, then the cold routes on the CPU, so that the backend scheduler runs the CPU branch while the GPU
    // branch is still in flight; without it (the default) the CPU starts after the GPU branch. The arithmetic is the
    // same either way. Returns 0, or -1 if the model has no plan.
    LLAMA_API int32_t llama_model_residency_set_overlap(
            struct llama_model * model,
                          bool   overlap);

    // In-engine timers of the split path's branches (engine/README.md, "In-engine timers"). With timers on, every pass
    // that takes the split path measures, for each MoE layer with a pool, the time of its GPU branch (from when the
    // cold routes' inputs are on the CPU and the GPU is idle until a value of the GPU branch's output is on the CPU)
    // and of its CPU branch (from then until the CPU's cold routes are computed), and counts the layer's cold routes;
    // the two branches then run one after the other. Set it before creating contexts (their graphs hold the timers).
    // Returns 0, or -1 if the model has no plan.
    LLAMA_API int32_t llama_model_residency_set_timers(
            struct llama_model * model,
                          bool   on);

    struct llama_residency_timing {
        uint64_t pass;     // the timed pass, counted from 1 since the timers were turned on
        int32_t  layer;
        int32_t  n_tokens; // tokens of the pass
        int32_t  n_cold;   // cold routes of the layer in the pass (computed by the CPU branch)
        double   gpu_ms;   // the GPU branch
        double   cpu_ms;   // the CPU branch
    };

    // the newest timings (at most the last 262,144) of passes after `after_pass`, oldest first, at most n_max of them;
    // returns how many were written, or -1 without a plan or timers
    LLAMA_API int32_t llama_model_residency_timings(
            const struct llama_model * model,
                            uint64_t   after_pass,
            struct llama_residency_timing * out,
                             int32_t   n_max);

    // Expert policies on the pools (engine/README.md, "Expert policies"): STATIC keeps the plan's experts for the
    // whole run (Ostinato); LRU and DECAY are the baselines' caches, built on the same pools and tables. With LRU,
    // passes of at most max_pass tokens use the pool (each missing expert uploaded on demand, the least recently
    // used one of the pool evicted); with DECAY, single-token passes use it (missing experts on the CPU, swaps at
    // the next token boundary by decaying access counts: decay, hysteresis, admit). Passes a cache does not serve
    // compute as llama.cpp does. The plan gives each pool its size and first contents.
    enum llama_residency_policy_kind {
        LLAMA_RESIDENCY_POLICY_STATIC = 0,
        LLAMA_RESIDENCY_POLICY_LRU    = 1,
        LLAMA_RESIDENCY_POLICY_DECAY  = 2,
    };

    struct llama_residency_policy_params {
        int32_t      policy;     // enum llama_residency_policy_kind
        uint32_t     max_pass;   // LRU: the largest pass the cache serves (llama.cpp: 32)
        double       decay;      // DECAY: scores are multiplied by this every decode step, in (0, 1]
        double       hysteresis; // DECAY: a missed expert replaces a cached one scoring more than (1 + h) times less
        uint32_t     admit;      // DECAY: swaps per token boundary (the layers with the largest gain)
        const char * log_path;   // LRU, DECAY: a tab-separated line per pass and layer (NULL or "": none)
    };

    LLAMA_API struct llama_residency_policy_params llama_residency_policy_default_params(void);

    // set the expert policy of a model with a plan; -1 (an error logged) without a plan, with bad parameters, or
    // when the log cannot be created
    LLAMA_API int32_t llama_model_residency_set_policy(
            struct llama_model * model,
            const struct llama_residency_policy_params * params);

    // Borrowed memory (engine/README.md, "Borrowed memory"): in decode the upload path's staging areas are idle, so
    // up to n_slot experts per pool are lent them. Every CPU use of a cold expert adds 1 to its score, all scores are
    // multiplied by decay at every decode step, a background thread copies the highest-scored cold experts (n_admit per
    // pool and step) into free slots while the step computes (a newcomer replaces the lowest-scored borrowed expert
    // when it scores more than (1 + margin) times as much), and they join the GPU branch of single-token passes at the
    // next token boundary, which waits for copies not yet done (the tables then depend on the routing alone). An upload
    // pass takes all slots back first. Static policy and the split and upload paths only (no --residency-prefill
    // native, no lru or decay policy). n_slot 0 turns it off.
    struct llama_residency_borrow_params {
        uint32_t n_slot; // borrowed slots per pool, at most the experts of its staging area (a layer's routed experts)
        double   decay;  // in (0, 1]
        double   margin; // >= 0
        uint32_t n_admit; // copies queued per pool and token boundary (they join at the next one), at least 1
    };

    LLAMA_API struct llama_residency_borrow_params llama_residency_borrow_default_params(void);

    // set the borrowed memory of a model with a plan, before any context; -1 (an error logged) without a plan, with
    // bad parameters or with another policy or the native prefill
    LLAMA_API int32_t llama_model_residency_set_borrow(
            struct llama_model * model,
            const struct llama_residency_borrow_params * params);

    // One graph per decode step (engine/README.md, "One graph per decode step"): with step set, every single-token
    // pass hands each MoE layer's cold routes to a resident CPU worker of its pool's device (a thread and a ggml thread
    // pool of n_threads threads, created and pinned here, once) through pinned host memory that the device reads and
    // writes, so that the device computes the rest of the step, all its layers, as one graph (on CUDA one CUDA graph
    // per GPU) and waits on the GPU for each layer's answer, at most timeout_ms; a layer whose routes are all resident
    // costs the worker nothing. A step whose worker did not answer in time fails (llama_decode returns an error, the
    // log names the layer), and later decode steps compute on per-segment graphs. Set it after the borrowed memory and
    // before any context; not with the timers or the lru and decay policies. step false removes the workers.
    // Returns 0, or -1 (an error logged).
    LLAMA_API int32_t llama_model_residency_set_graph(
            struct llama_model * model,
                          bool   step,
                       int32_t   n_threads,
                        double   timeout_ms);

    // the largest number of cold routes per layer that llama_residency_stats counts on its own (more count with it)
#define LLAMA_RESIDENCY_GRAPH_ROUTES_MAX 16

    struct llama_residency_stats {
        int64_t  n_resident;       // experts in the pools
        uint64_t n_upload_pass;    // forward passes that took the upload path
        uint64_t n_upload_experts; // cold experts copied to the staging areas, summed over layers and passes
        uint64_t n_upload_bytes;   // bytes copied
        int64_t  t_upload_us;      // time spent copying (including the wait for the copies)
        uint64_t n_cache_hits;       // LRU, DECAY: distinct experts of served passes found in the pool, summed over layers
        uint64_t n_cache_misses;     // and those not found
        uint64_t n_cache_admissions; // experts copied into the pool by the policy
        uint64_t n_cache_bytes;      // their bytes
        int64_t  t_cache_us;         // time spent copying them
        int64_t  n_borrow_slots;       // borrowed memory: slots over all pools (0: off)
        int64_t  n_borrow_active;      // experts in borrowed slots that the tables use now
        uint64_t n_borrow_admissions;  // experts that joined the tables
        uint64_t n_borrow_evictions;   // borrowed experts replaced by higher-scored ones
        uint64_t n_borrow_reclaimed;   // borrowed experts (in the tables or being copied) taken back by upload passes
        uint64_t n_borrow_reclaim_passes; // upload passes that took some back
        uint64_t n_borrow_steps;       // decode steps (single-token passes)
        uint64_t n_borrow_steps_hit;   // decode steps that computed at least one route on a borrowed expert
        uint64_t n_borrow_hits;        // routes of decode steps computed on borrowed experts
        uint64_t n_borrow_cpu_routes;  // routes of cold experts computed on the CPU, in all split-path passes
        uint64_t n_borrow_bytes;       // bytes copied into borrowed slots
        int64_t  t_borrow_us;          // the background thread's copy time
        int64_t  t_borrow_wait_us;     // time token boundaries waited for copies not yet done
        int32_t  graph_step;           // one graph per decode step is on (llama_model_residency_set_graph)
        int32_t  n_graph_threads;      // each CPU worker's threads (0: off)
        uint64_t n_graph_branches;     // layers of decode steps whose cold routes a CPU worker answered
        uint64_t n_graph_skipped;      // of which every route was resident (the worker computed nothing)
        int64_t  t_graph_cpu_us;       // the workers' time on them
        int64_t  t_graph_wait_us;      // the devices' waits for the workers' answers (their clocks)
        int64_t  t_graph_gpu_us;       // the devices' own work between each hand-over and its receive: the GPU
                                       // branch of every layer answered (their clocks)
        uint64_t n_graph_routes;       // cold routes the workers computed (a route: one token's use of one expert)
        int64_t  t_graph_compute_us;   // of t_graph_cpu_us, the time in computing them (the graphs of the CPU branches)
        // the answered layers by their number of cold routes r (index r; the last also counts more), and the compute
        // time of those layers: a fit of time = alpha + beta*r over them is the worker's own C(r)
        uint64_t n_graph_by_routes[LLAMA_RESIDENCY_GRAPH_ROUTES_MAX + 1];
        int64_t  t_graph_by_routes_us[LLAMA_RESIDENCY_GRAPH_ROUTES_MAX + 1];
    };

    // statistics of the model's pools since the plan was loaded; -1 if no plan is loaded
    LLAMA_API int32_t llama_model_residency_stats(
            const struct llama_model * model,
            struct llama_residency_stats * out);

#ifdef __cplusplus
}
#endif
