// test-residency-ops: the CPU side of the ggml op the ostinato patch series changes, which test-backend-ops
// cannot check (it takes the CPU as its reference); the other backends' side is in test-backend-ops
// (tests/test-backend-ops-residency.h: MUL_MAT_ID_SKIP, MUL_MAT_ID_POOL).
//
// MUL_MAT_ID marked GGML_MUL_MAT_ID_SKIP (op_params[15] != 0, set by the resident pools' split path):
//   cpu   - routes with a negative id give exact zero rows; every other row equals an unmarked MUL_MAT_ID of
//           the same routes (skipped routes, whole tokens skipped, everything skipped; 1 and 3 threads);
//   sched - with a GPU, the scheduler runs a marked node on the CPU (weights in host memory, activations
//           made on the device), and it computes what the CPU alone computes.
//
// GGML_OP_HOST_BRANCH (ggml-ostinato.h, one graph per decode step), on the CPU and on every other backend:
//   branch - a graph [SEND(x, ids)] [work of the backend] [RECV] [add] computed directly by the backend (on CUDA,
//            from the third run on, as a captured CUDA graph), four runs with new inputs, two hand-overs per run, a
//            host thread answering each: every run gives exactly what the host and the backend computed; and a host
//            that does not answer: the first receive records its branch in the channel's error word after the
//            timeout, the later one returns at once, and the graph finishes.
//
// A CPU thread pool of its own threads (ggml_threadpool_new_own_threads, ggml-ostinato.h: the residency worker's):
//   pool   - a graph of marked MUL_MAT_IDs, a GLU and a sum over the routes (the CPU branch of a layer) computed by a CPU
//            backend on such a pool, three times, asleep (ggml_threadpool_pause) in between, gives bitwise what the
//            CPU backend computes on its own threads (an OpenMP team in an OpenMP build); 2 and 4 threads.
//
// usage: test-residency-ops [-b <backend name>] [-v]    exit status 0 when every case passes

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ggml-ostinato.h" // GGML_MUL_MAT_ID_SKIP

struct mmid_case {
    ggml_type   type;
    int64_t     k;        // row length of an expert matrix (ne00)
    int64_t     m;        // rows of an expert matrix (ne01)
    int         n_as;     // experts
    int         n_used;   // routes per token
    int         n_tokens;
    bool        b_bcast;  // b is [k, 1, n_tokens] (gate/up of an expert FFN) rather than [k, n_used, n_tokens]
    std::string skip;     // which routes are cold: none, some, token (all of token 0), all

    std::string name() const {
        char buf[256];
        snprintf(buf, sizeof(buf), "MUL_MAT_ID_SKIP(type=%s,k=%lld,m=%lld,n_as=%d,n_used=%d,n_tokens=%d,b=%s,skip=%s)",
                 ggml_type_name(type), (long long) k, (long long) m, n_as, n_used, n_tokens,
                 b_bcast ? "bcast" : "per-route", skip.c_str());
        return buf;
    }
};

// routes of one case: the selected experts (distinct per token) and which of them are cold
struct mmid_routes {
    std::vector<int32_t> ids;   // [n_tokens][n_used]
    std::vector<bool>    cold;  // same shape
};

static mmid_routes make_routes(const mmid_case & c, std::mt19937 & rng) {
    mmid_routes r;
    std::vector<int32_t> perm(c.n_as);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int t = 0; t < c.n_tokens; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < c.n_used; ++j) {
            r.ids.push_back(perm[j]);
            bool cold = false;
            if (c.skip == "all") {
                cold = true;
            } else if (c.skip == "token") {
                cold = t == 0 || u(rng) < 0.3f;
            } else if (c.skip == "some") {
                cold = u(rng) < 0.5f;
            }
            r.cold.push_back(cold);
        }
    }
    if (c.skip == "some" && std::none_of(r.cold.begin(), r.cold.end(), [](bool b) { return b; })) {
        r.cold[0] = true;
    }
    return r;
}

// expert weights of `type`, random in [-1, 1], quantized as the model file would hold them
static std::vector<uint8_t> make_weights(const mmid_case & c, std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> f((size_t) (c.k * c.m * c.n_as));
    for (float & x : f) {
        x = u(rng);
    }
    std::vector<uint8_t> q(ggml_row_size(c.type, c.k) * c.m * c.n_as);
    ggml_quantize_chunk(c.type, f.data(), q.data(), 0, c.m * c.n_as, c.k, nullptr);
    return q;
}

static std::vector<float> make_input(const mmid_case & c, std::mt19937 & rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> b((size_t) (c.k * (c.b_bcast ? 1 : c.n_used) * c.n_tokens));
    for (float & x : b) {
        x = u(rng);
    }
    return b;
}

static ggml_context * make_ctx(size_t n_tensors) {
    ggml_init_params p = { ggml_tensor_overhead() * n_tensors + ggml_graph_overhead(), nullptr, true };
    return ggml_init(p);
}

static ggml_tensor * new_as(ggml_context * ctx, const mmid_case & c, int n_as) {
    return ggml_new_tensor_3d(ctx, c.type, c.k, c.m, n_as);
}

static ggml_tensor * new_b(ggml_context * ctx, const mmid_case & c) {
    return ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.k, c.b_bcast ? 1 : c.n_used, c.n_tokens);
}

static ggml_tensor * new_ids(ggml_context * ctx, const mmid_case & c) {
    return ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.n_used, c.n_tokens);
}

static ggml_tensor * mark_skip(ggml_tensor * t) {
    t->op_params[GGML_MUL_MAT_ID_SKIP] = 1;
    return t;
}

static std::vector<float> get_f32(const ggml_tensor * t) {
    std::vector<float> v(ggml_nelements(t));
    ggml_backend_tensor_get(t, v.data(), 0, ggml_nbytes(t));
    return v;
}

static void fill_nan(ggml_tensor * t) {
    std::vector<float> v(ggml_nelements(t), NAN);
    ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
}

// normalized mean squared error of the rows of `a` whose route is hot (test-backend-ops' measure)
static double nmse_hot(const std::vector<float> & a, const std::vector<float> & ref, const mmid_routes & r, int64_t m) {
    double err = 0.0, norm = 0.0;
    for (size_t route = 0; route < r.cold.size(); ++route) {
        if (r.cold[route]) {
            continue;
        }
        for (int64_t i = 0; i < m; ++i) {
            const double d = (double) a[route * m + i] - ref[route * m + i];
            err  += d * d;
            norm += (double) ref[route * m + i] * ref[route * m + i];
        }
    }
    return norm > 0.0 ? err / norm : err;
}

// number of values of cold routes' rows that are not exactly +0 or -0
static size_t nonzero_cold(const std::vector<float> & a, const mmid_routes & r, int64_t m) {
    size_t n = 0;
    for (size_t route = 0; route < r.cold.size(); ++route) {
        if (r.cold[route]) {
            for (int64_t i = 0; i < m; ++i) {
                n += a[route * m + i] != 0.0f;
            }
        }
    }
    return n;
}

struct result_counter {
    int n_ok = 0, n_fail = 0;
    bool verbose = false;

    void report(const std::string & what, const std::string & name, bool ok, const std::string & detail) {
        ok ? ++n_ok : ++n_fail;
        if (!ok || verbose) {
            printf("  %-6s %s: %s%s%s\n", what.c_str(), name.c_str(), ok ? "OK" : "FAIL",
                   detail.empty() ? "" : " - ", detail.c_str());
        }
    }
};

// cpu: the marked node against an unmarked one over the same (uncut) routes, all in one CPU graph
static void test_cpu(const mmid_case & c, ggml_backend_t cpu, int n_threads, std::mt19937 & rng, result_counter & res) {
    const mmid_routes r = make_routes(c, rng);
    const auto w = make_weights(c, rng);
    const auto x = make_input(c, rng);
    std::vector<int32_t> ids_skip(r.ids);
    for (size_t i = 0; i < ids_skip.size(); ++i) {
        ids_skip[i] = r.cold[i] ? -1 : r.ids[i];
    }

    ggml_context * ctx = make_ctx(16);
    ggml_tensor * as   = new_as(ctx, c, c.n_as);
    ggml_tensor * b    = new_b(ctx, c);
    ggml_tensor * ids0 = new_ids(ctx, c);
    ggml_tensor * ids1 = new_ids(ctx, c);
    ggml_tensor * out  = mark_skip(ggml_mul_mat_id(ctx, as, b, ids1));
    ggml_tensor * ref  = ggml_mul_mat_id(ctx, as, b, ids0);
    ggml_cgraph * gf   = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ref);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);

    ggml_backend_tensor_set(as, w.data(), 0, w.size());
    ggml_backend_tensor_set(b, x.data(), 0, x.size() * sizeof(float));
    ggml_backend_tensor_set(ids0, r.ids.data(), 0, r.ids.size() * sizeof(int32_t));
    ggml_backend_tensor_set(ids1, ids_skip.data(), 0, ids_skip.size() * sizeof(int32_t));
    fill_nan(out);

    const std::string name = c.name() + ",threads=" + std::to_string(n_threads);
    const bool supported = ggml_backend_supports_op(cpu, out);
    if (!supported) {
        res.report("cpu", name, false, "the CPU backend refuses a marked node");
    } else {
        ggml_backend_cpu_set_n_threads(cpu, n_threads);
        const bool done = ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS;
        const auto a = get_f32(out), e = get_f32(ref);
        const double err = nmse_hot(a, e, r, c.m);
        const size_t nz = nonzero_cold(a, r, c.m);
        char detail[128];
        snprintf(detail, sizeof(detail), "NMSE of hot rows = %.3g (<= 1e-6), %zu nonzero values in cold rows", err, nz);
        res.report("cpu", name, done && err <= 1e-6 && nz == 0 && !std::isnan(err), detail);
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

// pool: a layer's CPU branch on a pool of its own threads against the CPU backend's own threads, bitwise
static void test_pool(const mmid_case & c, ggml_backend_t cpu, int n_threads, std::mt19937 & rng, result_counter & res) {
    const mmid_routes r = make_routes(c, rng);
    const auto wg = make_weights(c, rng);
    const auto wu = make_weights(c, rng);
    const auto x  = make_input(c, rng);
    std::vector<int32_t> ids_skip(r.ids);
    for (size_t i = 0; i < ids_skip.size(); ++i) {
        ids_skip[i] = r.cold[i] ? r.ids[i] : -1; // the CPU branch computes the cold routes
    }

    ggml_context * ctx = make_ctx(16);
    ggml_tensor * gate = new_as(ctx, c, c.n_as);
    ggml_tensor * up   = new_as(ctx, c, c.n_as);
    ggml_tensor * b    = new_b(ctx, c);
    ggml_tensor * ids  = new_ids(ctx, c);
    ggml_tensor * g    = mark_skip(ggml_mul_mat_id(ctx, gate, b, ids));
    ggml_tensor * u    = mark_skip(ggml_mul_mat_id(ctx, up, b, ids));
    ggml_tensor * h    = ggml_swiglu_split(ctx, g, u);
    ggml_tensor * out  = ggml_sum_rows(ctx, ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_2d(ctx, h, h->ne[0], h->ne[1]*h->ne[2]))));
    ggml_cgraph * gf   = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    ggml_backend_tensor_set(gate, wg.data(), 0, wg.size());
    ggml_backend_tensor_set(up, wu.data(), 0, wu.size());
    ggml_backend_tensor_set(b, x.data(), 0, x.size() * sizeof(float));
    ggml_backend_tensor_set(ids, ids_skip.data(), 0, ids_skip.size() * sizeof(int32_t));

    const std::string name = c.name() + ",threads=" + std::to_string(n_threads);
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
    bool done = ggml_backend_graph_compute(cpu, gf) == GGML_STATUS_SUCCESS;
    const auto ref = get_f32(out);

    ggml_backend_t own = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    ggml_threadpool * tp = ggml_threadpool_new_own_threads(&tpp);
    ggml_backend_cpu_set_n_threads(own, n_threads);
    ggml_backend_cpu_set_threadpool(own, tp);
    int n_same = 0;
    for (int run = 0; run < 3; ++run) {
        fill_nan(out);
        ggml_threadpool_resume(tp);
        done = done && ggml_backend_graph_compute(own, gf) == GGML_STATUS_SUCCESS;
        ggml_threadpool_pause(tp);
        const auto a = get_f32(out);
        n_same += a.size() == ref.size() && memcmp(a.data(), ref.data(), a.size() * sizeof(float)) == 0;
    }
    ggml_backend_free(own);
    ggml_threadpool_free(tp);
    char detail[96];
    snprintf(detail, sizeof(detail), "%d of 3 runs bitwise the CPU backend's own threads'", n_same);
    res.report("pool", name, done && n_same == 3, detail);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

// sched: weights in host memory, activations made on the device, a marked node in between -> the CPU runs it
static void test_sched(const mmid_case & c, ggml_backend_t dev_be, ggml_backend_t cpu, std::mt19937 & rng,
                       result_counter & res) {
    const mmid_routes r = make_routes(c, rng);
    const auto w = make_weights(c, rng);
    const auto x = make_input(c, rng);
    std::vector<int32_t> ids(r.ids);
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = r.cold[i] ? -1 : r.ids[i];
    }
    const std::string name = c.name() + "," + ggml_backend_name(dev_be);

    // the CPU alone
    std::vector<float> expect;
    {
        ggml_context * ctx = make_ctx(8);
        ggml_tensor * as  = new_as(ctx, c, c.n_as);
        ggml_tensor * b   = new_b(ctx, c);
        ggml_tensor * idt = new_ids(ctx, c);
        ggml_tensor * out = mark_skip(ggml_mul_mat_id(ctx, as, b, idt));
        ggml_cgraph * gf  = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
        ggml_backend_tensor_set(as, w.data(), 0, w.size());
        ggml_backend_tensor_set(b, x.data(), 0, x.size() * sizeof(float));
        ggml_backend_tensor_set(idt, ids.data(), 0, ids.size() * sizeof(int32_t));
        ggml_backend_graph_compute(cpu, gf);
        expect = get_f32(out);
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }

    // weights in a host buffer, input and ids on the device, graph placed by the scheduler
    ggml_context * ctx_w = make_ctx(2);
    ggml_tensor * as = new_as(ctx_w, c, c.n_as);
    ggml_backend_buffer_t buf_w = ggml_backend_alloc_ctx_tensors(ctx_w, cpu);
    ggml_backend_tensor_set(as, w.data(), 0, w.size());

    ggml_context * ctx_in = make_ctx(4);
    ggml_tensor * xin = new_b(ctx_in, c);
    ggml_tensor * idt = new_ids(ctx_in, c);
    ggml_backend_buffer_t buf_in = ggml_backend_alloc_ctx_tensors(ctx_in, dev_be);
    ggml_backend_tensor_set(xin, x.data(), 0, x.size() * sizeof(float));
    ggml_backend_tensor_set(idt, ids.data(), 0, ids.size() * sizeof(int32_t));

    ggml_context * ctx = make_ctx(16);
    ggml_tensor * b   = ggml_scale(ctx, xin, 1.0f);               // computed on the device
    ggml_tensor * mm  = mark_skip(ggml_mul_mat_id(ctx, as, b, idt));
    ggml_tensor * out = ggml_scale(ctx, mm, 1.0f);
    ggml_set_output(out);
    ggml_cgraph * gf  = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    ggml_backend_t backends[2] = { dev_be, cpu };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, nullptr, 2, GGML_DEFAULT_GRAPH_SIZE, false, true);
    bool ok = ggml_backend_sched_alloc_graph(sched, gf);
    std::string detail = ok ? "" : "the scheduler could not allocate the graph";
    if (ok) {
        ok = ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS;
        ggml_backend_t where = ggml_backend_sched_get_tensor_backend(sched, mm);
        const auto a = get_f32(out);
        const double err = nmse_hot(a, expect, r, c.m);
        const size_t nz = nonzero_cold(a, r, c.m);
        char buf[192];
        snprintf(buf, sizeof(buf), "marked node on %s (expected CPU), NMSE vs the CPU alone = %.3g (<= 1e-6), "
                 "%zu nonzero values in cold rows", where ? ggml_backend_name(where) : "none", err, nz);
        detail = buf;
        ok = ok && where == cpu && err <= 1e-6 && nz == 0 && !std::isnan(err);
    }
    res.report("sched", name, ok, detail);
    ggml_backend_sched_free(sched);
    ggml_free(ctx);
    ggml_backend_buffer_free(buf_in);
    ggml_free(ctx_in);
    ggml_backend_buffer_free(buf_w);
    ggml_free(ctx_w);
}

// branch: a host thread that answers the hand-overs of a channel: out = 2*x + ids[0], for n answers (0: none)
static void host_answer(ggml_host_channel * ch, int n, int64_t n_x, int64_t ids_off, std::atomic<bool> * stop) {
    int64_t last = 0; // (the channel is new: reading ready[0] here could miss a hand-over made before this thread ran)
    for (int done = 0; done < n && !stop->load(); ) {
        const int64_t seq = ch->ready[0];
        if (seq == last) {
            std::this_thread::yield();
            continue;
        }
        std::atomic_thread_fence(std::memory_order_seq_cst);
        const float * x = (const float *) ch->buf;
        const int32_t id0 = *(const int32_t *) (ch->buf + ids_off);
        float * out = (float *) (ch->buf + ch->out_offset);
        for (int64_t i = 0; i < n_x; ++i) {
            out[i] = 2.0f*x[i] + (float) id0;
        }
        std::atomic_thread_fence(std::memory_order_seq_cst);
        ch->done[0] = seq;
        last = seq;
        ++done;
    }
}

static void test_branch(ggml_backend_t be, ggml_backend_dev_t dev, bool answer, result_counter & res) {
    const int64_t n_x = 256, n_ids = 4;
    ggml_backend_buffer_type_t buft_host = ggml_backend_dev_host_buffer_type(dev);
    if (buft_host == nullptr) {
        buft_host = ggml_backend_dev_buffer_type(dev);
    }
    ggml_backend_buffer_t buf_host = ggml_backend_buft_alloc_buffer(buft_host, 256 + 8192);
    ggml_backend_buffer_t buf_dev  = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), 256);
    ggml_backend_buffer_clear(buf_host, 0);
    ggml_backend_buffer_clear(buf_dev, 0);
    char * base = (char *) ggml_backend_buffer_get_base(buf_host);
    ggml_host_channel ch = {};
    ch.ready = (volatile int64_t *) base;
    ch.done  = (volatile int64_t *) (base + 64);
    ch.error = (volatile int64_t *) (base + 128);
    ch.waited = (volatile int64_t *) (base + 192);
    ch.busy  = (volatile int64_t *) (base + 208);
    ch.counter = (int64_t *) ggml_backend_buffer_get_base(buf_dev);
    ch.buf = base + 256;
    ch.buf_size = 8192;
    ch.out_offset = 4096;
    ch.timeout_ns = answer ? 10000000000ll : 50000000ll; // 10 s; 50 ms for the host that does not answer

    ggml_init_params ip = { 64*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * x   = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_x);
    ggml_tensor * ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_ids);
    ggml_set_input(x);
    ggml_set_input(ids);
    ggml_tensor * srcs[2] = { x, ids };
    // two hand-overs per graph (two layers), with the backend's own work between SEND and RECV
    ggml_tensor * s0  = ggml_host_branch_send(ctx, srcs, 2, &ch, 3);
    ggml_tensor * w0  = ggml_scale(ctx, x, 3.0f);
    ggml_tensor * r0  = ggml_host_branch_recv(ctx, s0, GGML_TYPE_F32, n_x, 1, 1, 1);
    ggml_tensor * y0  = ggml_add(ctx, r0, w0);                        // 5x + id0
    ggml_tensor * srcs1[2] = { y0, ids };
    ggml_tensor * s1  = ggml_host_branch_send(ctx, srcs1, 2, &ch, 4);
    ggml_tensor * w1  = ggml_scale(ctx, y0, 0.5f);
    ggml_tensor * r1  = ggml_host_branch_recv(ctx, s1, GGML_TYPE_F32, n_x, 1, 1, 1);
    ggml_tensor * out = ggml_add(ctx, r1, w1);                        // 2.5 y0 + id0
    ggml_set_output(out);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, s0);
    ggml_build_forward_expand(gf, w0);
    ggml_build_forward_expand(gf, out);
    bool supported = true;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        supported = supported && ggml_backend_supports_op(be, ggml_graph_node(gf, i));
    }
    ggml_backend_buffer_t buf = supported ? ggml_backend_alloc_ctx_tensors(ctx, be) : nullptr;
    const std::string name = std::string("HOST_BRANCH(") + (answer ? "answered" : "unanswered") + "),"
                             + ggml_backend_name(be);
    bool ok = supported && buf != nullptr;
    std::string detail = supported ? "" : "not supported";
    const size_t ids_off = (ggml_nbytes(x) + GGML_HOST_BRANCH_ALIGN - 1) / GGML_HOST_BRANCH_ALIGN * GGML_HOST_BRANCH_ALIGN;
    const int n_run = answer ? 4 : 1;
    std::atomic<bool> stop{false};
    double ms_all = 0.0; // the graphs' wall time, which the device's waits and its own work between hand-over and
                         // receive (by its clock) fit in
    std::thread host;
    if (ok) {
        host = std::thread(host_answer, &ch, answer ? 2*n_run : 0, n_x, (int64_t) ids_off, &stop);
    }
    for (int run = 0; ok && run < n_run; ++run) {
        std::vector<float> xv(n_x);
        for (int64_t i = 0; i < n_x; ++i) {
            xv[i] = (float) ((i*7 + run*13) % 29) - 14.0f;
        }
        std::vector<int32_t> iv = { 5 + run, 1, 2, 3 };
        ggml_backend_tensor_set(x, xv.data(), 0, ggml_nbytes(x));
        ggml_backend_tensor_set(ids, iv.data(), 0, ggml_nbytes(ids));
        const auto t0 = std::chrono::steady_clock::now();
        ok = ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS;
        ggml_backend_synchronize(be);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ms_all += ms;
        std::vector<float> ov(n_x);
        ggml_backend_tensor_get(out, ov.data(), 0, ggml_nbytes(out));
        if (answer) {
            int64_t bad = 0;
            for (int64_t i = 0; i < n_x; ++i) {
                const float y0v = 5.0f*xv[i] + (float) iv[0];
                bad += ov[i] != 2.5f*y0v + (float) iv[0];
            }
            const double waited_ms = ch.waited[0]/1e6, busy_ms = ch.busy[0]/1e6;
            ok = ok && bad == 0 && ch.error[0] == 0 && ch.done[0] == 2*(run + 1) && waited_ms >= 0.0 && busy_ms >= 0.0 &&
                 waited_ms + busy_ms <= ms_all;
            char b[200];
            snprintf(b, sizeof(b), "run %d: %lld wrong values, error word %lld, answered %lld, waits %.3f ms and own "
                     "work %.3f ms in %.3f ms", run, (long long) bad, (long long) ch.error[0], (long long) ch.done[0],
                     waited_ms, busy_ms, ms_all);
            detail = b;
        } else {
            // the first receive times out (branch 3 recorded), the second returns at once: about one timeout in all
            ok = ok && ch.error[0] == 3 + 1 && ch.error[1] == 1 && ms < 5000.0;
            char b[160];
            snprintf(b, sizeof(b), "error word %lld (expected 4: branch 3), hand-over %lld, %.0f ms", (long long) ch.error[0],
                     (long long) ch.error[1], ms);
            detail = b;
        }
    }
    stop = true;
    if (host.joinable()) {
        host.join();
    }
    res.report("branch", name, ok, detail);
    if (buf != nullptr) {
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    ggml_backend_buffer_free(buf_host);
    ggml_backend_buffer_free(buf_dev);
}

static std::vector<mmid_case> make_cases() {
    std::vector<mmid_case> cases;
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K };
    const char * skips[] = { "none", "some", "token", "all" };
    for (ggml_type t : types) {
        for (const char * s : skips) {
            // decode-like (1 token), short split-path pass, a pass wide enough for the CPU's tiled/grouped kernels
            cases.push_back({ t, 256, 32, 8, 2, 1, false, s });
            cases.push_back({ t, 256, 48, 16, 6, 7, true, s });
            cases.push_back({ t, 512, 16, 32, 6, 67, false, s });
            cases.push_back({ t, 256, 32, 4, 4, 130, true, s });
        }
    }
    return cases;
}

int main(int argc, char ** argv) {
    std::string only;
    result_counter res;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-b" && i + 1 < argc) {
            only = argv[++i];
        } else if (a == "-v") {
            res.verbose = true;
        } else {
            fprintf(stderr, "usage: %s [-b <backend name>] [-v]\n  unknown argument: %s\n", argv[0], a.c_str());
            return 2;
        }
    }

    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (cpu == nullptr) {
        fprintf(stderr, "test-residency-ops: no CPU backend\n");
        return 1;
    }
    const auto cases = make_cases();
    std::mt19937 rng(1234);

    if (only.empty() || only == ggml_backend_name(cpu)) {
        printf("Backend %s (%s):\n", ggml_backend_name(cpu), "marked MUL_MAT_ID on the CPU");
        for (const auto & c : cases) {
            for (int n_threads : { 1, 3 }) {
                test_cpu(c, cpu, n_threads, rng, res);
            }
        }
    }
    if (only.empty() || only == ggml_backend_name(cpu)) {
        for (bool answer : { true, false }) {
            test_branch(cpu, ggml_backend_get_device(cpu), answer, res);
        }
        for (const auto & c : cases) {
            if (c.type == GGML_TYPE_MXFP4 || c.type == GGML_TYPE_Q8_0) {
                for (int n_threads : { 2, 4 }) {
                    test_pool(c, cpu, n_threads, rng, res);
                }
            }
        }
    }
    ggml_backend_cpu_set_n_threads(cpu, 4);

    int n_dev_tested = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            continue;
        }
        if (!only.empty() && only != ggml_backend_dev_name(dev)) {
            continue;
        }
        ggml_backend_t be = ggml_backend_dev_init(dev, nullptr);
        if (be == nullptr) {
            printf("Backend %s: could not be initialized, skipped\n", ggml_backend_dev_name(dev));
            continue;
        }
        printf("Backend %s (%s):\n", ggml_backend_dev_name(dev), ggml_backend_dev_description(dev));
        for (const auto & c : cases) {
            test_sched(c, be, cpu, rng, res);
        }
        for (bool answer : { true, false }) {
            test_branch(be, dev, answer, res);
        }
        ggml_backend_free(be);
        ++n_dev_tested;
    }

    printf("%d/%d tests passed; %d non-CPU backend(s) tested\n", res.n_ok, res.n_ok + res.n_fail, n_dev_tested);
    ggml_backend_free(cpu);
    return res.n_fail == 0 && res.n_ok > 0 ? 0 : 1;
}
