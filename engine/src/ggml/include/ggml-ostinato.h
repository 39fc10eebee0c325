// Ostinato additions to ggml's public definitions (engine/README.md).
#pragma once

#include "ggml.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// op_params index of a MUL_MAT_ID node: non-zero marks a node whose negative ids are skipped (each gives a zero
// row) on the CPU; the CUDA backend refuses marked nodes. The resident pools' split path sets it
// (src/llama-residency.cpp); ggml-cpu.c, ggml-cuda.cu and the op tests read it.
#define GGML_MUL_MAT_ID_SKIP 15

// GGML_OP_HOST_BRANCH: a device's graph hands part of its work to a host worker and goes on without leaving the
// graph (so that a CUDA graph can hold a whole decode step). A SEND node copies its sources into the channel's host
// buffer, one after the other (each padded to GGML_HOST_BRANCH_ALIGN bytes), and signals the worker with a new sequence
// number; the graph goes on with what does not need the worker's result. A RECV node (its source: the SEND) waits
// until the worker has answered that number, at most timeout_ns, then copies the result from the buffer (at
// out_offset) into its own tensor. A receive that times out records its branch in `error` and returns, and the graph's
// later receives return at once; the caller checks `error` after the graph (src/llama-residency.cpp).
//
// The channel's flags and buffer are host memory that the device reads and writes (CUDA: pinned host memory, which
// kernels address directly through unified addressing), allocated once and reused by every graph; `counter` is memory
// of the device that runs the nodes (the CPU's, on a CPU-only build).
#define GGML_HOST_BRANCH_SEND  0
#define GGML_HOST_BRANCH_RECV  1
#define GGML_HOST_BRANCH_ALIGN 64

struct ggml_host_channel {
    volatile int64_t * ready;   // [0] sequence number of the last send, [1] its branch
    volatile int64_t * done;    // [0] the last sequence number the worker answered
    volatile int64_t * error;   // [0] branch + 1 of a receive that timed out (0: none), [1] its sequence number
    volatile int64_t * waited;  // [0] nanoseconds the receives waited for the worker, by the device's clock, summed
                                // (NULL: not counted)
    volatile int64_t * busy;    // [0] nanoseconds of the device's own work between each SEND's signal and its RECV
                                // (the device's branch), by the device's clock, summed (NULL: not counted)
    int64_t          * counter; // [0] the device's copy of the last sequence number sent, [1] the device's clock at
                                // that signal (with `busy`)
    char             * buf;     // the sends' sources, then the result at out_offset
    size_t             buf_size;
    size_t             out_offset;
    int64_t            timeout_ns;
};

// the byte offset of a SEND node's source i in the channel's buffer
static inline size_t ggml_host_branch_offset(const struct ggml_tensor * send, int i) {
    size_t off = 0;
    for (int j = 0; j < i; ++j) {
        off += (ggml_nbytes(send->src[j]) + GGML_HOST_BRANCH_ALIGN - 1) / GGML_HOST_BRANCH_ALIGN * GGML_HOST_BRANCH_ALIGN;
    }
    return off;
}

static inline struct ggml_host_channel * ggml_host_branch_channel(const struct ggml_tensor * node) {
    struct ggml_host_channel * ch;
    memcpy(&ch, &node->op_params[2], sizeof(ch));
    return ch;
}

// sources: contiguous tensors whose bytes, padded, fit before the channel's out_offset; the result: a tiny I32 tensor
// that only orders the graph (the RECV's source)
GGML_API struct ggml_tensor * ggml_host_branch_send(
        struct ggml_context      * ctx,
        struct ggml_tensor      ** srcs,
        int                        n_src,
        struct ggml_host_channel * ch,
        int32_t                    branch);

// the worker's result, a contiguous tensor of the given type and shape, read from the channel's buffer at out_offset
GGML_API struct ggml_tensor * ggml_host_branch_recv(
        struct ggml_context      * ctx,
        struct ggml_tensor       * send,
        enum ggml_type             type,
        int64_t                    ne0,
        int64_t                    ne1,
        int64_t                    ne2,
        int64_t                    ne3);

// The CPU backend (ggml-cpu.c): a thread pool whose threads are its own, created and placed on their cores once, in
// every build. In an OpenMP build (llama.cpp's default) ggml_threadpool_new's graphs run on an OpenMP team of the calling
// thread instead, which a second such team in the process (the residency worker's, src/llama-residency-host.cpp)
// slows: libgomp then counts more threads than cores and makes every waiting thread of both teams sleep at once, at
// each barrier between two nodes, instead of spinning. A pool of its own threads polls and sleeps as ggml's pools do in a
// build without OpenMP (its `poll`; ggml_threadpool_pause puts its threads to sleep). Got through
// ggml_backend_reg_get_proc_address(cpu_reg, GGML_THREADPOOL_NEW_OWN_THREADS).
#define GGML_THREADPOOL_NEW_OWN_THREADS "ggml_threadpool_new_own_threads"
struct ggml_threadpool * ggml_threadpool_new_own_threads(struct ggml_threadpool_params * params);

#ifdef __cplusplus
}
#endif
