// ostinato: a host branch's SEND and RECV (ggml-ostinato.h) as stream operations that a CUDA graph can hold.
// SEND: the sources go to the channel's pinned host buffer (asynchronous copies), then one thread raises the
// sequence number in device memory and publishes it to the host. RECV: one thread waits, on the GPU, until the host
// worker has answered that number (volatile reads of pinned host memory, __nanosleep between them; at most
// timeout_ns by the GPU's global timer, after which it records the branch in the channel's error word; the time it
// waited is added to the channel's `waited`, and the GPU's own work since the SEND's signal to its `busy`), then the
// result is copied from the host buffer. Everything between the two nodes runs while the host computes.
#include "host-branch.cuh"

#include "ggml-ostinato.h"

static __device__ __forceinline__ uint64_t host_branch_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __global__ void host_branch_signal(int64_t * counter, volatile int64_t * ready, const bool timed,
                                          const int64_t branch) {
    const int64_t seq = *counter + 1;
    *counter = seq;
    ready[1] = branch;
    __threadfence_system();
    ready[0] = seq;
    __threadfence_system();
    if (timed) {
        counter[1] = (int64_t) host_branch_globaltimer(); // device memory: the RECV reads it without a host round trip
    }
}

static __global__ void host_branch_wait(const int64_t * counter, volatile int64_t * done, volatile int64_t * error,
                                        volatile int64_t * waited, volatile int64_t * busy, const int64_t branch,
                                        const int64_t timeout_ns) {
    const int64_t  seq = counter[0];
    const uint64_t t0  = host_branch_globaltimer();
    while (done[0] < seq && error[0] == 0) { // (after one receive timed out, the graph's others do not wait)
        if ((int64_t) (host_branch_globaltimer() - t0) > timeout_ns) {
            error[1] = seq;
            error[0] = branch + 1;
            __threadfence_system();
            return;
        }
#if __CUDA_ARCH__ >= GGML_CUDA_CC_VOLTA
        __nanosleep(200);
#endif
    }
    if (waited != nullptr) {
        waited[0] += (int64_t) (host_branch_globaltimer() - t0);
    }
    if (busy != nullptr) {
        busy[0] += (int64_t) t0 - counter[1];
    }
    __threadfence_system();
}

// the device's address of pinned host memory (the host's own under unified addressing on most systems)
template <typename T>
static T * host_branch_dev_ptr(T * p) {
    void * d = nullptr;
    if (cudaHostGetDevicePointer(&d, (void *) p, 0) != cudaSuccess) {
        (void) cudaGetLastError();
        return p;
    }
    return (T *) d;
}

void ggml_cuda_op_host_branch(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggml_host_channel * ch = ggml_host_branch_channel(dst);
    const int64_t branch = ggml_get_op_params_i32(dst, 1);
    cudaStream_t stream = ctx.stream();

    if (ggml_get_op_params_i32(dst, 0) == GGML_HOST_BRANCH_SEND) {
        for (int i = 0; i < GGML_MAX_SRC && dst->src[i] != nullptr; ++i) {
            CUDA_CHECK(cudaMemcpyAsync(ch->buf + ggml_host_branch_offset(dst, i), dst->src[i]->data,
                                       ggml_nbytes(dst->src[i]), cudaMemcpyDeviceToHost, stream));
        }
        host_branch_signal<<<1, 1, 0, stream>>>(ch->counter, host_branch_dev_ptr(ch->ready), ch->busy != nullptr, branch);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    host_branch_wait<<<1, 1, 0, stream>>>(ch->counter, host_branch_dev_ptr(ch->done), host_branch_dev_ptr(ch->error),
                                          ch->waited != nullptr ? host_branch_dev_ptr(ch->waited) : nullptr,
                                          ch->busy != nullptr ? host_branch_dev_ptr(ch->busy) : nullptr, branch,
                                          ch->timeout_ns);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(dst->data, ch->buf + ch->out_offset, ggml_nbytes(dst), cudaMemcpyHostToDevice, stream));
}
