// Ostinato addition to llama-server: GET /residency, the resident pools' statistics and the in-engine timers of the
// split path's branches (engine/README.md, "In-engine timers"). Included by the ostinato stage's server.cpp only.
#pragma once

#include "llama.h"
#include "llama-ostinato.h"
#include "server-common.h"
#include "server-http.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// the timings of passes after `after_pass` (a decimal pass count, default 0) and the pools' counters; 501 (as /metrics
// without --metrics) when the model has no residency plan, 503 while it loads; a query value that is no pass count is a 400 error
inline server_http_res_ptr ostinato_residency_response(llama_context * ctx, const std::string & after_pass) {
    auto res = std::make_unique<server_http_res>();
    if (ctx == nullptr) {
        res->status = 503;
        res->data = safe_json_to_str({{"error", format_error_response("the model is loading", ERROR_TYPE_UNAVAILABLE)}});
        return res;
    }
    const llama_model * model = llama_get_model(ctx);
    llama_residency_stats st = {};
    if (llama_model_residency_stats(model, &st) != 0) {
        res->status = 501;
        res->data = safe_json_to_str({{"error", format_error_response(
            "this server has no residency plan (start it with --residency-plan)", ERROR_TYPE_NOT_SUPPORTED)}});
        return res;
    }
    char * end = nullptr;
    errno = 0;
    const unsigned long long after = std::strtoull(after_pass.c_str(), &end, 10);
    if (after_pass.empty() || after_pass[0] == '-' || *end != '\0' || errno == ERANGE) {
        throw std::invalid_argument("after_pass: expected a pass count (a non-negative integer), got '" + after_pass + "'");
    }
    json out = {
        {"n_resident", st.n_resident},
        {"upload", {{"passes", st.n_upload_pass}, {"experts", st.n_upload_experts}, {"bytes", st.n_upload_bytes},
                    {"ms", st.t_upload_us / 1e3}}},
        {"cache", {{"hits", st.n_cache_hits}, {"misses", st.n_cache_misses}, {"admissions", st.n_cache_admissions},
                   {"bytes", st.n_cache_bytes}, {"ms", st.t_cache_us / 1e3}}},
        {"borrow", {{"slots", st.n_borrow_slots}, {"active", st.n_borrow_active},
                    {"admissions", st.n_borrow_admissions}, {"evictions", st.n_borrow_evictions},
                    {"reclaimed", st.n_borrow_reclaimed}, {"reclaim_passes", st.n_borrow_reclaim_passes},
                    {"steps", st.n_borrow_steps}, {"steps_hit", st.n_borrow_steps_hit}, {"hits", st.n_borrow_hits},
                    {"cpu_routes", st.n_borrow_cpu_routes}, {"bytes", st.n_borrow_bytes},
                    {"ms", st.t_borrow_us / 1e3}, {"wait_ms", st.t_borrow_wait_us / 1e3}}},
        {"graph", {{"step", st.graph_step != 0}, {"threads", st.n_graph_threads}, {"branches", st.n_graph_branches},
                   {"skipped", st.n_graph_skipped}, {"cpu_ms", st.t_graph_cpu_us / 1e3},
                   {"wait_ms", st.t_graph_wait_us / 1e3}, {"gpu_ms", st.t_graph_gpu_us / 1e3},
                   {"routes", st.n_graph_routes},
                   {"compute_ms", st.t_graph_compute_us / 1e3}}},
    };
    // the worker's answered layers by their cold routes: [routes, layers, compute ms] where it answered any
    json by_routes = json::array();
    for (int r = 0; r <= LLAMA_RESIDENCY_GRAPH_ROUTES_MAX; ++r) {
        if (st.n_graph_by_routes[r] > 0) {
            by_routes.push_back(json::array({r, st.n_graph_by_routes[r], st.t_graph_by_routes_us[r] / 1e3}));
        }
    }
    out["graph"]["by_routes"] = by_routes;
    // without timers (n_max 0 answers -1) nothing is allocated; with them, room for as many as the engine keeps
    const bool timers = llama_model_residency_timings(model, (uint64_t) after, nullptr, 0) >= 0;
    std::vector<llama_residency_timing> t(timers ? 262144 : 0);
    const int32_t n = timers ? llama_model_residency_timings(model, (uint64_t) after, t.data(), (int32_t) t.size()) : 0;
    json timings = json::array();
    for (int32_t i = 0; i < n; ++i) {
        timings.push_back({{"pass", t[i].pass}, {"layer", t[i].layer}, {"n_tokens", t[i].n_tokens},
                           {"n_cold", t[i].n_cold}, {"gpu_ms", t[i].gpu_ms}, {"cpu_ms", t[i].cpu_ms}});
    }
    out["timers"] = timers;
    out["timings"] = std::move(timings);
    res->data = safe_json_to_str(out);
    return res;
}
