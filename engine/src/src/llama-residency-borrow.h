// Borrowed memory (--residency-borrow): in decode, the staging areas of the upload path sit idle, so they are lent to
// extra experts. Every CPU use of a cold expert raises its decaying score; at each token boundary the highest-scored
// cold experts (at most n_admit per pool) are queued for free borrowed slots of their layer's pool (a newcomer replaces
// the lowest-scored borrowed expert only when it scores more than (1 + margin) times as much). Their copies run while
// the step computes (on a GPU, on a stream of their own, in the background of the host as well); the copied experts
// join the GPU branch of decode passes at the next token boundary, where the layer's borrowed and cold tables switch
// together and the GPU's compute stream waits for the copies (an event: the host never waits), so that the tables
// follow the routing alone. An upload pass takes every slot back before it runs (it fills the staging area with its
// own cold experts). Decisions are plain bookkeeping here; src/llama-residency.cpp builds the graph, writes the tables
// they imply and makes the copies.
#pragma once

#include "llama-ostinato.h"

#include "ggml-backend.h"

#include <atomic>
#include <cstdint>
#include <set>
#include <vector>

// one copy: expert `expert` of layer `layer` into borrowed slot `slot` of pool `pool`
struct llama_residency_borrow_job {
    int     pool;
    int     slot;
    int     layer;
    int32_t expert;
};

struct llama_residency_borrow {
    enum slot_state : uint8_t { FREE = 0, LOADING = 1, ACTIVE = 2 };

    llama_residency_borrow_params params = {};
    int64_t n_expert = 0;

    std::vector<int>                  layer_pool; // [layer] -> pool, -1 without one
    std::vector<std::vector<int32_t>> plan_slot;  // [layer][expert] -> the plan's pool slot, -1 if cold
    std::vector<int64_t>              pool_slots; // [pool] -> borrowed slots (at most the staging area's experts)

    // main thread (token boundaries) and the graph's CPU nodes, which run between boundaries
    std::vector<double>               score;      // [layer*n_expert + expert]
    std::vector<std::vector<int32_t>> active;     // [layer][expert] -> borrowed slot in the tables, -1
    std::vector<std::vector<int32_t>> taken;      // [layer][expert] -> borrowed slot in any state, -1
    std::vector<std::vector<int64_t>> slot_key;   // [pool][slot] -> layer*n_expert + expert, -1 if free
    uint64_t step = 0;                            // decode steps (token boundaries) so far
    uint64_t step_hit = 0;                        // the last step that computed a borrowed expert

    std::vector<std::vector<uint8_t>> state;      // [pool][slot] slot_state
    std::vector<llama_residency_borrow_job> queue; // the copies queued at this boundary, made by the caller
    std::vector<uint8_t> joined;                  // [pool]: copies joined the tables at this boundary

    // per pool: a backend of the pool's device whose own stream makes the copies and an event recorded after the last
    // ones (both null where the device has no events, e.g. the CPU: there the copies are made at once), and whether
    // copies were made since the last upload pass
    std::vector<ggml_backend_t>       copy_backend;
    std::vector<ggml_backend_event_t> copy_event;
    std::vector<uint8_t>              in_flight;

    // statistics (llama_model_residency_stats)
    std::atomic<uint64_t> n_admissions{0}, n_evictions{0}, n_reclaims{0}, n_reclaim_passes{0};
    std::atomic<uint64_t> n_steps{0}, n_steps_hit{0}, n_hits{0}, n_cpu_routes{0}, n_bytes{0};
    std::atomic<int64_t>  t_copy_us{0}, t_wait_us{0};
    std::atomic<int64_t>  n_active{0};

    ~llama_residency_borrow(); // waits for the copies, then frees the copy backends and events

    // a decode step's token boundary: the experts queued at the last one join the tables (`joined` marks their
    // pools), scores decay, and new copies are queued (`queue`); dirty: the layers whose tables change
    void boundary(std::set<int> & dirty);
    // an upload pass (after the caller has waited for the copies in flight): free every slot; dirty as above
    void reclaim(std::set<int> & dirty);
    // one layer's routes of a pass (flat ids j*n_expert + e), counted by a CPU node of the graph: in decode, routes on
    // borrowed slots are hits; every route of a cold expert computed on the CPU raises its score
    void record(int il, const int32_t * ids_flat, int64_t n, bool decode);
};
