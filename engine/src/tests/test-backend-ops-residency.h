// ostinato: test-backend-ops cases for the MUL_MAT_ID nodes of the resident expert pools
// (src/llama-residency.cpp); included by test-backend-ops.cpp after test_mul_mat_id.
//
// MUL_MAT_ID_SKIP - the CPU branch of the split path: a node marked GGML_MUL_MAT_ID_SKIP whose cold routes
//   have id -1. Only the CPU computes it: a backend must report it unsupported, or it is compared with the
//   CPU like any op (and fails if it reads the id -1). The CPU side is covered by test-residency-ops.
// MUL_MAT_ID_POOL - the GPU branch: an unmarked node over a pool whose last n_used experts are zero slots
//   (all-zero weights); each cold route at position j points at zero slot j, so a token's ids stay distinct.

#include <numeric>

#include "ggml-ostinato.h" // GGML_MUL_MAT_ID_SKIP

struct test_mul_mat_id_residency : public test_mul_mat_id {
    const bool  skip;        // true: MUL_MAT_ID_SKIP, false: MUL_MAT_ID_POOL
    const float cold_share;  // share of routes that are cold
    const int   n_resident;  // experts routed to (the pool's slots before the zero slots)

    std::string op_desc(ggml_tensor * t) override {
        GGML_UNUSED(t);
        return skip ? "MUL_MAT_ID_SKIP" : "MUL_MAT_ID_POOL";
    }

    std::string vars() override {
        return test_mul_mat_id::vars() + ",cold_share=" + std::to_string(cold_share);
    }

    // MUL_MAT_ID_POOL holds n_resident experts plus n_used zero slots
    test_mul_mat_id_residency(bool skip, ggml_type type_a, int n_resident, int n_used, bool b, int64_t m, int64_t n,
                              int64_t k, float cold_share)
        : test_mul_mat_id(type_a, GGML_TYPE_F32, skip ? n_resident : n_resident + n_used, n_used, b, m, n, k),
          skip(skip), cold_share(cold_share), n_resident(n_resident) {}

    ggml_tensor * build_graph(ggml_context * ctx) override {
        ggml_tensor * out = test_mul_mat_id::build_graph(ctx);
        if (skip) {
            out->op_params[GGML_MUL_MAT_ID_SKIP] = 1;
        }
        return out;
    }

    void initialize_tensors(ggml_context * ctx) override {
        std::default_random_engine rng(4242);
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (t->type == GGML_TYPE_I32) {
                if (ggml_is_view_op(t->op)) {
                    continue;
                }
                // per token: distinct experts of [0, n_resident); cold routes -> -1 (skip) or zero slot j (pool)
                for (int64_t r = 0; r < ggml_nrows(t); r++) {
                    std::vector<int32_t> data(t->ne[0]);
                    std::vector<int32_t> perm(n_resident);
                    std::iota(perm.begin(), perm.end(), 0);
                    std::shuffle(perm.begin(), perm.end(), rng);
                    for (int64_t j = 0; j < t->ne[0]; j++) {
                        data[j] = j < n_used ? perm[j] : perm[j % n_resident];
                        if (j < n_used && (u(rng) < cold_share || (r == 0 && cold_share > 0.0f))) {
                            data[j] = skip ? -1 : n_resident + (int32_t) j;
                        }
                    }
                    ggml_backend_tensor_set(t, data.data(), r * t->nb[1], t->ne[0] * sizeof(int32_t));
                }
            } else {
                init_tensor_uniform(t);
            }
        }
        if (skip) {
            return;
        }
        // zero slots: the pool's last n_used experts are all zero
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != NULL; t = ggml_get_next_tensor(ctx, t)) {
            if (strcmp(t->name, "as") == 0) {
                std::vector<uint8_t> zero(t->nb[2] * n_used, 0);
                std::vector<float> f((size_t) (t->ne[0] * t->ne[1] * n_used), 0.0f);
                ggml_quantize_chunk(t->type, f.data(), zero.data(), 0, t->ne[1] * n_used, t->ne[0], nullptr);
                ggml_backend_tensor_set(t, zero.data(), n_resident * t->nb[2], zero.size());
            }
        }
    }

    void reinit_perf_iter(ggml_context * ctx) override {
        GGML_UNUSED(ctx);  // keep the route pattern
    }
};

static void ostinato_add_residency_cases(std::vector<std::unique_ptr<test_case>> & test_cases) {
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K };
    for (bool skip : { true, false }) {
        for (ggml_type type_a : types) {
            for (float cold : { 0.0f, 0.3f, 1.0f }) {
                // decode (1 token), a short split-path pass, a pass big enough for the batched kernels
                test_cases.emplace_back(new test_mul_mat_id_residency(skip, type_a, 8, 2, false, 32, 1, 256, cold));
                test_cases.emplace_back(new test_mul_mat_id_residency(skip, type_a, 16, 6, true, 48, 7, 256, cold));
                test_cases.emplace_back(new test_mul_mat_id_residency(skip, type_a, 32, 6, false, 64, 67, 512, cold));
                test_cases.emplace_back(new test_mul_mat_id_residency(skip, type_a, 4, 4, true, 32, 130, 256, cold));
            }
        }
    }
}
