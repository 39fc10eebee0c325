// Borrowed memory (--residency-borrow): in decode, the staging areas of the upload path sit idle, so they are lent to
// extra experts. Every CPU use of a cold expert raises its decaying score; a background thread copies the highest-
// scored cold experts (at most n_admit per pool and token boundary) into free borrowed slots of their layer's pool (a
// newcomer replaces the lowest-scored borrowed expert only when it scores more than (1 + margin) times as much) while
// the step computes; the copied experts join the GPU branch of decode passes at the next token boundary (which waits
// for copies not yet done, so that the tables follow the routing alone), where the layer's borrowed and cold tables
// switch together. An upload pass takes
// every slot back before it runs (it fills the staging area with its own cold experts). Decisions are plain
// bookkeeping here; src/llama-residency.cpp builds the graph and writes the tables they imply.
#pragma once

#include "llama-ostinato.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

// one copy the background thread makes: expert `expert` of layer `layer` into borrowed slot `slot` of pool `pool`
struct llama_residency_borrow_job {
    int     pool;
    int     slot;
    int     layer;
    int32_t expert;
};

struct llama_residency_borrow {
    enum slot_state : uint8_t { FREE = 0, LOADING = 1, READY = 2, ACTIVE = 3 };

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

    // shared with the background thread
    std::mutex mutex;
    std::condition_variable cv_work, cv_idle;
    std::deque<llama_residency_borrow_job> queue;
    std::vector<std::vector<uint8_t>> state;      // [pool][slot] slot_state
    bool busy = false, stop = false;
    std::function<void(const llama_residency_borrow_job &)> copy; // the copy itself (src/llama-residency.cpp)
    std::thread worker;

    // statistics (llama_model_residency_stats)
    std::atomic<uint64_t> n_admissions{0}, n_evictions{0}, n_reclaims{0}, n_reclaim_passes{0};
    std::atomic<uint64_t> n_steps{0}, n_steps_hit{0}, n_hits{0}, n_cpu_routes{0}, n_bytes{0};
    std::atomic<int64_t>  t_copy_us{0}, t_wait_us{0};
    std::atomic<int64_t>  n_active{0};

    ~llama_residency_borrow();

    // start the background thread (after `copy` is set)
    void start();

    // a decode step's token boundary: the experts queued at the last one join the tables, scores decay, and new copies
    // are queued; dirty: the layers whose tables change
    void boundary(std::set<int> & dirty);
    // an upload pass: wait for the copy in flight, drop the queue, free every slot; dirty as above
    void reclaim(std::set<int> & dirty);
    // one layer's routes of a pass (flat ids j*n_expert + e), counted by a CPU node of the graph: in decode, routes on
    // borrowed slots are hits; every route of a cold expert computed on the CPU raises its score
    void record(int il, const int32_t * ids_flat, int64_t n, bool decode);

private:
    void run();
};
