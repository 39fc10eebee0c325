#include "llama-residency-host.h"

#include "llama-impl.h"
#include "llama-residency-borrow.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
static inline void residency_cpu_relax() { _mm_pause(); }
#elif defined(__aarch64__)
static inline void residency_cpu_relax() { __asm__ __volatile__("yield"); }
#else
static inline void residency_cpu_relax() {}
#endif

// the channel's flags, each on its own cache line, then its buffer
static constexpr size_t k_flags_bytes = 320;

static size_t residency_pad(size_t n) {
    return (n + GGML_HOST_BRANCH_ALIGN - 1) / GGML_HOST_BRANCH_ALIGN * GGML_HOST_BRANCH_ALIGN;
}

llama_residency_host::llama_residency_host(ggml_backend_dev_t dev, size_t in_bytes, size_t out_bytes, int n_threads,
                                           double timeout_ms, const std::unique_ptr<llama_residency_borrow> * borrow)
        : dev(dev), n_threads(std::max(1, n_threads)), timeout_ms(timeout_ms), borrow(borrow) {
    for (int r = 0; r <= LLAMA_RESIDENCY_GRAPH_ROUTES_MAX; ++r) {
        n_by_routes[r]    = 0;
        t_by_routes_us[r] = 0;
    }
    // host memory the device addresses: its pinned host buffer type (a CPU-only build: plain host memory)
    ggml_backend_buffer_type_t buft_host = ggml_backend_dev_host_buffer_type(dev);
    if (buft_host == nullptr) {
        buft_host = ggml_backend_dev_buffer_type(dev);
    }
    const size_t out_offset = residency_pad(in_bytes);
    const size_t buf_size   = out_offset + residency_pad(out_bytes);
    buf_host = ggml_backend_buft_alloc_buffer(buft_host, k_flags_bytes + buf_size);
    buf_dev  = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), 256);
    if (buf_host == nullptr || buf_dev == nullptr || !ggml_backend_buffer_is_host(buf_host) ||
            ggml_backend_buffer_get_type(buf_host) != buft_host) {
        // (a device's host buffer type falls back to plain host memory when pinned memory cannot be had, e.g. with
        // GGML_CUDA_NO_PINNED: the device could not address it)
        start_error = "cannot allocate the channel (pinned host memory and a device counter)";
        return;
    }
    ggml_backend_buffer_clear(buf_host, 0);
    ggml_backend_buffer_clear(buf_dev, 0);
    char * base = (char *) ggml_backend_buffer_get_base(buf_host);
    ch.ready      = (volatile int64_t *) (base + 0);
    ch.done       = (volatile int64_t *) (base + 64);
    ch.error      = (volatile int64_t *) (base + 128);
    ch.waited     = (volatile int64_t *) (base + 192);
    ch.busy       = (volatile int64_t *) (base + 256);
    ch.counter    = (int64_t *) ggml_backend_buffer_get_base(buf_dev);
    ch.buf        = base + k_flags_bytes;
    ch.buf_size   = buf_size;
    ch.out_offset = out_offset;
    ch.timeout_ns = (int64_t) (timeout_ms*1e6);

    // fault injection for the engine's tests (engine/README.md): a worker that answers late
    if (const char * e = getenv("OSTINATO_TEST_WORKER_STALL_MS")) {
        stall_us = (int64_t) (atof(e)*1e3);
    }

    thread = std::thread([this] { run(); });
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return started; });
}

llama_residency_host::~llama_residency_host() {
    if (thread.joinable()) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stop = true;
        }
        cv.notify_all();
        thread.join();
    }
    if (cpu != nullptr) {
        ggml_backend_free(cpu);
    }
    if (tp != nullptr) {
        auto * reg = ggml_backend_dev_backend_reg(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
        auto * tp_free = (void (*)(struct ggml_threadpool *)) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
        if (tp_free != nullptr) {
            tp_free(tp);
        }
    }
    if (buf_host != nullptr) {
        ggml_backend_buffer_free(buf_host);
    }
    if (buf_dev != nullptr) {
        ggml_backend_buffer_free(buf_dev);
    }
}

void llama_residency_host::arm(const std::vector<llama_residency_host_branch *> * branches, int n_send) {
    // the pool's threads wake now, while the device computes up to the step's first hand-over
    if (tp != nullptr) {
        tp_resume(tp);
    }
    {
        std::lock_guard<std::mutex> lock(mutex);
        active = branches;
        n_expected.store(n_send, std::memory_order_release);
        n_armed++;
    }
    cv.notify_all();
}

bool llama_residency_host::finish(std::string & err) {
    n_expected.store(0, std::memory_order_release);
    if (ch.error[0] == 0) {
        // every hand-over was answered, so the pool is past its last graph: between steps its threads sleep, leaving
        // the cores to llama.cpp's threads (prefill's above all)
        if (tp != nullptr) {
            tp_pause(tp);
        }
        return true;
    }
    char msg[256];
    snprintf(msg, sizeof(msg), "the CPU worker did not answer layer %" PRId64 " of decode step %" PRIu64 " within %.3f ms",
             (int64_t) ch.error[0] - 1, n_armed.load(), timeout_ms);
    err = msg;
    ch.error[0] = 0;
    failed = true;
    // the graph's branches go with the graph: let the worker leave the one it is on (bounded: a worker that hangs is
    // not waited for)
    const auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds((int64_t) std::max(1000.0, timeout_ms));
    while (serving.load() && std::chrono::steady_clock::now() < t_end) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (tp != nullptr && !serving.load()) {
        // (a worker still on a branch keeps its pool awake: pausing it between a graph's start and its threads
        // taking it up would leave the worker waiting at the graph's first barrier; the pool's threads sleep by
        // themselves once they have polled long enough)
        tp_pause(tp);
    }
    std::lock_guard<std::mutex> lock(mutex);
    active = nullptr;
    return false;
}

void llama_residency_host::run() {
    // the pool is created on this thread, so ggml pins this thread (the pool's thread 0) with the others
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu_dev ? ggml_backend_dev_backend_reg(cpu_dev) : nullptr;
    // a pool of its own threads (ggml-ostinato.h): an OpenMP team here would make every OpenMP wait of the process
    // sleep instead of spin, llama.cpp's own decode and prefill threads' included
    auto * tp_new  = reg ? (struct ggml_threadpool * (*)(struct ggml_threadpool_params *))
                           ggml_backend_reg_get_proc_address(reg, GGML_THREADPOOL_NEW_OWN_THREADS) : nullptr;
    auto * tp_set  = reg ? (void (*)(ggml_backend_t, struct ggml_threadpool *))
                           ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_threadpool") : nullptr;
    auto * set_nth = reg ? (void (*)(ggml_backend_t, int))
                           ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") : nullptr;
    tp_pause  = reg ? (void (*)(struct ggml_threadpool *)) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_pause")  : nullptr;
    tp_resume = reg ? (void (*)(struct ggml_threadpool *)) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_resume") : nullptr;
    if (tp_new && tp_set && set_nth && tp_pause && tp_resume) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
        tpp.poll = 100;
#if defined(__linux__)
        // pinned to the first n_threads cores this process may use, one thread per core
        cpu_set_t allowed;
        if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) >= n_threads) {
            int n = 0;
            for (int c = 0; c < CPU_SETSIZE && c < GGML_MAX_N_THREADS && n < n_threads; ++c) {
                if (CPU_ISSET(c, &allowed)) {
                    tpp.cpumask[c] = true;
                    ++n;
                }
            }
            tpp.strict_cpu = true;
            pinned = true;
        }
#endif
        tp  = tp_new(&tpp); // (created running: that places this thread, the pool's thread 0, on its core)
        cpu = ggml_backend_dev_init(cpu_dev, nullptr);
        if (tp != nullptr && cpu != nullptr) {
            set_nth(cpu, n_threads);
            tp_set(cpu, tp);
            tp_pause(tp); // asleep until the first step (arm)
        }
    }
    {
        std::lock_guard<std::mutex> lock(mutex);
        ready_ok = tp != nullptr && cpu != nullptr;
        if (!ready_ok) {
            start_error = "cannot create the CPU worker's thread pool";
        }
        started = true;
    }
    cv.notify_all();
    if (!ready_ok) {
        return;
    }

    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [this] { return stop.load() || n_expected.load() > 0; });
            if (stop) {
                return;
            }
        }
        // a graph is in flight: wait for its hand-overs by spinning (they come every few hundred microseconds),
        // napping after a while (a graph that stopped early is disarmed by finish())
        auto t_idle = std::chrono::steady_clock::now();
        int64_t spins = 0;
        while (n_expected.load(std::memory_order_acquire) > 0 && !stop.load(std::memory_order_relaxed)) {
            const int64_t seq = ch.ready[0];
            if (seq != last_seq) {
                std::atomic_thread_fence(std::memory_order_seq_cst);
                serving.store(true);
                serve(seq, ch.ready[1]);
                serving.store(false);
                last_seq = seq;
                n_expected.fetch_sub(1, std::memory_order_acq_rel);
                spins = 0;
                continue;
            }
            if ((++spins & 4095) != 0) {
                residency_cpu_relax();
                continue;
            }
            const auto now = std::chrono::steady_clock::now();
            if (spins == 4096) {
                t_idle = now;
            } else if (now - t_idle > std::chrono::milliseconds(20)) {
                std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
        }
    }
}

void llama_residency_host::serve(int64_t seq, int64_t branch) {
    const int64_t t0 = ggml_time_us();
    llama_residency_host_branch * b = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (active != nullptr && branch >= 0 && branch < (int64_t) active->size()) {
            b = (*active)[branch];
        }
    }
    if (b != nullptr) {
        if (borrow != nullptr && *borrow && b->ids_flat != nullptr) {
            (*borrow)->record(b->layer, (const int32_t *) b->ids_flat->data, ggml_nelements(b->ids_flat), b->decode);
        }
        const int32_t * ids = (const int32_t *) b->ids_cold->data;
        int64_t n_cold = 0;
        for (int64_t i = 0; i < ggml_nelements(b->ids_cold); ++i) {
            n_cold += ids[i] >= 0;
        }
        const int r = (int) std::min<int64_t>(n_cold, LLAMA_RESIDENCY_GRAPH_ROUTES_MAX);
        if (n_cold > 0) {
            const int64_t t1 = ggml_time_us();
            ggml_backend_graph_compute(cpu, b->gf);
            const int64_t dt = ggml_time_us() - t1;
            n_routes          += (uint64_t) n_cold;
            t_by_routes_us[r] += dt;
        } else {
            // every route of the layer is on the GPU: the branch's output is the zero rows of skipped routes
            memset(b->out->data, 0, ggml_nbytes(b->out));
            n_skipped++;
        }
        n_by_routes[r]++;
    } else {
        LLAMA_LOG_ERROR("%s: hand-over %" PRId64 " names layer %" PRId64 ", which the graph in flight does not send\n",
                        __func__, seq, branch);
    }
    if (stall_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(stall_us));
    }
    n_branches++;
    t_cpu_us += ggml_time_us() - t0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ch.done[0] = seq;
}
