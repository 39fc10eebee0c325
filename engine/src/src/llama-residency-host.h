// The resident CPU worker of --residency-graph step: a thread and a ggml CPU thread pool, created and pinned once at
// start-up, that compute a decode step's cold routes while the GPU computes the rest of the step in one graph.
// The GPU hands each layer's cold inputs over through a channel of pinned host memory (GGML_OP_HOST_BRANCH,
// ggml-ostinato.h) and waits on the GPU for the answer. engine/README.md, "One graph per decode step".
#pragma once

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-ostinato.h"
#include "llama-ostinato.h"

#include <atomic>
#include <memory>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct llama_residency_borrow;

// one layer's CPU branch in one graph: its cold routes' nodes on host memory, reading the channel's buffer
struct llama_residency_host_branch {
    int           layer    = -1;
    ggml_cgraph * gf       = nullptr;
    ggml_tensor * ids_cold = nullptr; // I32 [n_used, n_tokens] in the channel: the expert if the CPU computes it, else -1
    ggml_tensor * ids_flat = nullptr; // borrowed memory: the layer's flat route ids, counted by the borrow scores
    ggml_tensor * out      = nullptr; // the branch's output, at the channel's out_offset
    bool          decode   = false;
    ggml_gallocr_t galloc  = nullptr; // owns the branch's intermediate tensors (host memory)
};

struct llama_residency_host {
    // dev: the device whose graphs send (its pools' device); in_bytes/out_bytes: the channel's room for one layer's
    // inputs and output; n_threads: the pool's threads (pinned to the first n_threads cores
    // this process may use, where it may use as many)
    llama_residency_host(ggml_backend_dev_t dev, size_t in_bytes, size_t out_bytes, int n_threads, double timeout_ms,
                         const std::unique_ptr<llama_residency_borrow> * borrow);
    ~llama_residency_host();

    bool ok() const { return ready_ok; }

    // a graph is about to run: its branches by layer (nullptr where a layer has none) and how many it sends
    void arm(const std::vector<llama_residency_host_branch *> * branches, int n_send);
    // the graph has finished (the caller synchronized): false and a message if a receive timed out
    bool finish(std::string & err);

    ggml_backend_dev_t dev = nullptr;
    ggml_host_channel  ch  = {};
    int                n_threads  = 1;
    bool               pinned     = false; // its threads are pinned to the first n_threads cores the process may use
    double             timeout_ms = 0.0;

    // counters (llama_model_residency_stats)
    std::atomic<uint64_t> n_branches{0};   // branches answered
    std::atomic<uint64_t> n_skipped{0};    // of which all routes were resident (no CPU work)
    std::atomic<int64_t>  t_cpu_us{0};     // the worker's time on the branches (answering included)
    std::atomic<uint64_t> n_routes{0};     // cold routes computed (the buckets below cap r)
    // answered branches by their number of cold routes (the last: that many or more) and their compute time (of
    // t_cpu_us; their sum is the time computing the branches' graphs)
    std::atomic<uint64_t> n_by_routes[LLAMA_RESIDENCY_GRAPH_ROUTES_MAX + 1];
    std::atomic<int64_t>  t_by_routes_us[LLAMA_RESIDENCY_GRAPH_ROUTES_MAX + 1];

    void run();
    void serve(int64_t seq, int64_t branch);

    const std::unique_ptr<llama_residency_borrow> * borrow = nullptr; // the model's borrowed memory (null: off)
    ggml_backend_buffer_t buf_host = nullptr; // flags and buffer
    ggml_backend_buffer_t buf_dev  = nullptr; // the counter
    bool                  failed   = false;   // a receive timed out: later graphs take per-segment graphs
    ggml_backend_t        cpu      = nullptr;
    struct ggml_threadpool * tp    = nullptr; // threads of its own (GGML_THREADPOOL_NEW_OWN_THREADS), asleep between steps
    void (*tp_pause)(struct ggml_threadpool *)  = nullptr;
    void (*tp_resume)(struct ggml_threadpool *) = nullptr;

    std::thread             thread;
    std::mutex              mutex;
    std::condition_variable cv;
    std::atomic<bool>       stop{false};
    bool                    started  = false;
    bool                    ready_ok = false;
    std::string             start_error;

    const std::vector<llama_residency_host_branch *> * active = nullptr; // guarded by mutex; read by the worker
    std::atomic<int>      n_expected{0};
    std::atomic<uint64_t> n_armed{0};   // graphs armed (decode steps)
    std::atomic<bool>     serving{false};
    int64_t               last_seq = 0;
    int64_t               stall_us = 0; // a test's fault: the worker sleeps this long before each answer
};
