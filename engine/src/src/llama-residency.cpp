#include "llama-residency.h"

#include "llama-ostinato.h"
#include "llama-context.h"
#include "llama-impl.h"
#include "llama-model.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <tuple>

using json = nlohmann::json;

static const char * k_kind_name[LLAMA_RESIDENCY_N_KIND] = { "up", "gate", "down", "gate_up" };

llama_residency::~llama_residency() {
    hosts.clear();  // their workers read the borrow scores and the model's experts
    borrow.reset(); // its thread copies into the buffers below
    for (auto * b : bufs) {
        ggml_backend_buffer_free(b);
    }
    for (auto * c : ctxs) {
        ggml_free(c);
    }
}

static uint64_t residency_fnv1a64(const std::vector<uint32_t> & words) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t w : words) {
        for (int i = 0; i < 4; ++i) {
            h ^= (uint8_t) (w >> (8*i));
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

static void residency_layer_exps(const llama_layer & layer, ggml_tensor ** exps) {
    exps[LLAMA_RESIDENCY_UP]      = layer.ffn_up_exps;
    exps[LLAMA_RESIDENCY_GATE]    = layer.ffn_gate_exps;
    exps[LLAMA_RESIDENCY_DOWN]    = layer.ffn_down_exps;
    exps[LLAMA_RESIDENCY_GATE_UP] = layer.ffn_gate_up_exps;
}

static bool residency_layer_has_extras(const llama_layer & layer) {
    return layer.ffn_gate_exps_b || layer.ffn_down_exps_b || layer.ffn_up_exps_b || layer.ffn_gate_up_exps_b ||
           layer.ffn_gate_exps_s || layer.ffn_down_exps_s || layer.ffn_up_exps_s;
}

// bytes of one routed expert of a layer: one slice of every expert matrix
static uint64_t residency_expert_bytes(ggml_tensor * const * exps) {
    uint64_t n = 0;
    for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
        if (exps[k]) {
            n += exps[k]->nb[2];
        }
    }
    return n;
}

// the index tables of one layer from its slots (slot_of[e]: pool slot of expert e, -1 if not in the pool)
static void residency_write_tables(const llama_residency & rsd, int il, const std::vector<int32_t> & slot_of) {
    const auto & lr = rsd.layers[il];
    const auto & p  = rsd.pools[lr.pool];
    const int64_t n_expert = p.n_expert, n_used = p.n_used;
    const size_t n_tab = (size_t) n_used*n_expert;
    std::vector<int32_t> t_slot(n_tab), t_cold(n_tab), t_stage(n_tab);
    for (int64_t j = 0; j < n_used; ++j) {
        for (int64_t e = 0; e < n_expert; ++e) {
            const int32_t s = slot_of[e];
            const size_t  i = (size_t) (j*n_expert + e);
            t_slot[i]  = s >= 0 ? s : (int32_t) (p.n_slot + j);
            t_cold[i]  = s >= 0 ? -1 : (int32_t) e;
            t_stage[i] = s >= 0 ? (int32_t) (p.n_expert + j) : (int32_t) e;
        }
    }
    ggml_backend_tensor_set(lr.tab_slot,  t_slot.data(),  0, n_tab*sizeof(int32_t));
    ggml_backend_tensor_set(lr.tab_cold,  t_cold.data(),  0, n_tab*sizeof(int32_t));
    ggml_backend_tensor_set(lr.tab_stage, t_stage.data(), 0, n_tab*sizeof(int32_t));
}

// borrowed memory: the decode tables of one layer (active[e]: borrowed slot of expert e, -1 if none)
static void residency_write_borrow_tables(const llama_residency & rsd, int il, const std::vector<int32_t> & active) {
    const auto & lr = rsd.layers[il];
    const auto & p  = rsd.pools[lr.pool];
    const auto & plan = rsd.slot_of[il];
    const int64_t n_expert = p.n_expert, n_used = p.n_used;
    const size_t n_tab = (size_t) n_used*n_expert;
    const int64_t stage0 = p.n_slot + n_used; // the staging area's first slot in `all`
    std::vector<int32_t> t_hot(n_tab), t_cold(n_tab);
    for (int64_t j = 0; j < n_used; ++j) {
        for (int64_t e = 0; e < n_expert; ++e) {
            const size_t i = (size_t) (j*n_expert + e);
            t_hot[i]  = plan[e] >= 0   ? plan[e]
                      : active[e] >= 0 ? (int32_t) (stage0 + active[e])
                      :                  (int32_t) (p.n_slot + j);
            t_cold[i] = plan[e] < 0 && active[e] < 0 ? (int32_t) e : -1;
        }
    }
    ggml_backend_tensor_set(lr.tab_hot_b,  t_hot.data(),  0, n_tab*sizeof(int32_t));
    ggml_backend_tensor_set(lr.tab_cold_b, t_cold.data(),   0, n_tab*sizeof(int32_t));
}

// the plan's JSON types, as its schema states them (src/ostinato/residency/plan.schema.json): "" if they hold,
// else what is wrong, naming the key. Integers must be JSON integers (no fraction, no exponent).
static bool residency_is_int(const json & v, int64_t lo, uint64_t hi) {
    if (v.is_number_unsigned()) {
        return v.get<uint64_t>() <= hi && (lo <= 0 || v.get<uint64_t>() >= (uint64_t) lo);
    }
    return v.is_number_integer() && v.get<int64_t>() >= lo && (v.get<int64_t>() < 0 || (uint64_t) v.get<int64_t>() <= hi);
}

static std::string residency_plan_shape_error(const json & doc) {
    const uint64_t u32 = 4294967295ull, u64 = UINT64_MAX, i31 = 2147483647ull;
    if (!doc.is_object()) {
        return "expected a JSON object";
    }
    if (!doc.contains("format") || doc["format"] != "ostinato-plan" || !doc.contains("version") ||
            !residency_is_int(doc["version"], 1, 1)) {
        return "key 'format'/'version': expected \"ostinato-plan\" and the integer 1";
    }
    if (!doc.contains("model") || !doc["model"].is_object()) {
        return "key 'model': expected an object";
    }
    const json & m = doc["model"];
    for (const char * k : { "n_layer", "n_expert", "n_expert_used" }) {
        if (!m.contains(k) || !residency_is_int(m[k], 1, std::string(k) == "n_expert" ? 65535 : u32)) {
            return std::string("key 'model.") + k + "': expected an integer >= 1";
        }
    }
    if (!m.contains("expert_bytes") || !m["expert_bytes"].is_array()) {
        return "key 'model.expert_bytes': expected an array";
    }
    for (size_t i = 0; i < m["expert_bytes"].size(); ++i) {
        if (!residency_is_int(m["expert_bytes"][i], 0, u64)) {
            return "key 'model.expert_bytes[" + std::to_string(i) + "]': expected an integer >= 0";
        }
    }
    if (!doc.contains("gpus") || !doc["gpus"].is_array() || doc["gpus"].empty()) {
        return "key 'gpus': expected a non-empty array";
    }
    for (size_t i = 0; i < doc["gpus"].size(); ++i) {
        const json & g = doc["gpus"][i];
        const std::string at = "key 'gpus[" + std::to_string(i) + "]";
        if (!g.is_object()) {
            return at + "': expected an object";
        }
        if (!g.contains("gpu") || !residency_is_int(g["gpu"], 0, i31)) {
            return at + ".gpu': expected an integer >= 0";
        }
        if (!g.contains("layers") || !g["layers"].is_array() || g["layers"].empty()) {
            return at + ".layers': expected a non-empty array";
        }
        for (const json & l : g["layers"]) {
            if (!residency_is_int(l, 0, i31)) {
                return at + ".layers': expected integers >= 0";
            }
        }
        if (g.contains("pool_bytes") && !residency_is_int(g["pool_bytes"], 0, u64)) {
            return at + ".pool_bytes': expected an integer >= 0";
        }
        if (!g.contains("slots") || !g["slots"].is_array()) {
            return at + ".slots': expected an array";
        }
        for (const json & sl : g["slots"]) {
            if (!sl.is_array() || sl.size() != 2 || !residency_is_int(sl[0], 0, i31) || !residency_is_int(sl[1], 0, i31)) {
                return at + ".slots': expected [layer, expert] pairs of integers >= 0";
            }
        }
    }
    if (!doc.contains("checksum") || !doc["checksum"].is_string()) {
        return "key 'checksum': expected a string";
    }
    return "";
}

#define RSD_FAIL(...) do { LLAMA_LOG_ERROR("%s: residency plan '%s': ", __func__, path); LLAMA_LOG_ERROR(__VA_ARGS__); LLAMA_LOG_ERROR("\n"); return nullptr; } while (0)

llama_residency * llama_residency_load(llama_model & model, const char * path, uint32_t n_upload_min) {
    const auto & hparams = model.hparams;
    const uint32_t n_layer  = hparams.n_layer();
    const uint32_t n_expert = hparams.n_expert;
    const uint32_t n_used   = hparams.n_expert_used_max();

    if (n_expert == 0) {
        RSD_FAIL("the model has no MoE layers");
    }
    if (n_upload_min == 0) {
        RSD_FAIL("Np (the upload path's minimum pass) must be at least 1");
    }

    json doc;
    {
        std::ifstream f(path);
        if (!f) {
            RSD_FAIL("cannot open the file");
        }
        try {
            doc = json::parse(f);
        } catch (const std::exception & e) {
            RSD_FAIL("not JSON: %s", e.what());
        }
    }

    std::vector<std::vector<int>>                 gpu_layers;
    std::vector<std::vector<std::pair<int, int>>> gpu_slots;
    std::vector<uint64_t>                         gpu_pool_bytes;
    {
        const std::string err = residency_plan_shape_error(doc);
        if (!err.empty()) {
            RSD_FAIL("%s", err.c_str());
        }
    }
    try {
        const json & m = doc.at("model");
        const uint32_t p_layer = m.at("n_layer"), p_expert = m.at("n_expert"), p_used = m.at("n_expert_used");
        if (p_layer != n_layer || p_expert != n_expert || p_used != n_used) {
            RSD_FAIL("key 'model': n_layer=%u n_expert=%u n_expert_used=%u, the model has %u %u %u",
                    p_layer, p_expert, p_used, n_layer, n_expert, n_used);
        }
        const std::vector<uint64_t> p_bytes = m.at("expert_bytes").get<std::vector<uint64_t>>();
        if (p_bytes.size() != n_layer) {
            RSD_FAIL("key 'model.expert_bytes': %zu entries, expected one per layer (%u)", p_bytes.size(), n_layer);
        }
        for (uint32_t il = 0; il < n_layer; ++il) {
            ggml_tensor * exps[LLAMA_RESIDENCY_N_KIND];
            residency_layer_exps(model.layers[il], exps);
            const uint64_t b = residency_expert_bytes(exps);
            if (p_bytes[il] != b) {
                RSD_FAIL("key 'model.expert_bytes[%u]': %" PRIu64 " bytes, the model's experts of layer %u have %" PRIu64,
                        il, p_bytes[il], il, b);
            }
        }

        const json & gpus = doc.at("gpus");
        gpu_layers.resize(gpus.size());
        gpu_slots.resize(gpus.size());
        gpu_pool_bytes.resize(gpus.size());
        for (const json & g : gpus) {
            const int j = g.at("gpu");
            if (j < 0 || j >= (int) gpus.size() || !gpu_layers[j].empty()) {
                RSD_FAIL("key 'gpus': GPUs must be numbered 0..%zu once each (found %d)", gpus.size() - 1, j);
            }
            gpu_layers[j] = g.at("layers").get<std::vector<int>>();
            if (gpu_layers[j].empty()) {
                RSD_FAIL("key 'gpus[%d].layers': empty", j);
            }
            gpu_pool_bytes[j] = g.value("pool_bytes", (uint64_t) 0);
            for (const json & s : g.at("slots")) {
                const std::pair<int, int> sl(s.at(0).get<int>(), s.at(1).get<int>());
                if (!gpu_slots[j].empty() && !(gpu_slots[j].back() < sl)) {
                    RSD_FAIL("key 'gpus[%d].slots': (%d, %d) after (%d, %d): slots are sorted by layer, then expert, once each",
                            j, sl.first, sl.second, gpu_slots[j].back().first, gpu_slots[j].back().second);
                }
                gpu_slots[j].push_back(sl);
            }
        }

        std::vector<uint32_t> words = { n_layer, n_expert, n_used, (uint32_t) gpus.size() };
        for (size_t j = 0; j < gpu_slots.size(); ++j) {
            words.push_back((uint32_t) j);
            words.push_back((uint32_t) gpu_slots[j].size());
            for (const auto & s : gpu_slots[j]) {
                words.push_back((uint32_t) s.first);
                words.push_back((uint32_t) s.second);
            }
        }
        char cs[40];
        snprintf(cs, sizeof(cs), "fnv1a64:%016" PRIx64, residency_fnv1a64(words));
        if (doc.value("checksum", "") != cs) {
            RSD_FAIL("key 'checksum': '%s' does not match the slots (%s)", doc.value("checksum", "").c_str(), cs);
        }
    } catch (const json::exception & e) {
        RSD_FAIL("%s", e.what());
    }

    auto rsd = std::make_unique<llama_residency>();
    rsd->path = path;
    rsd->n_upload_min = n_upload_min;
    rsd->layers.resize(n_layer);

    // pools: one per (plan GPU, size class); layer -> pool; slot numbers per pool in plan order
    using klass = std::vector<std::tuple<int, int64_t, int64_t>>; // per kind: type, ne0, ne1 (type -1: absent)
    std::map<std::pair<int, klass>, int> pool_of;
    std::vector<int> layer_gpu(n_layer, -1);

    for (size_t j = 0; j < gpu_layers.size(); ++j) {
        ggml_backend_dev_t dev = nullptr;
        for (int il : gpu_layers[j]) {
            if (il < 0 || il >= (int) n_layer) {
                RSD_FAIL("key 'gpus[%zu].layers': layer %d is outside the model (%u layers)", j, il, n_layer);
            }
            if (layer_gpu[il] >= 0) {
                RSD_FAIL("key 'gpus[%zu].layers': layer %d is also on GPU %d", j, il, layer_gpu[il]);
            }
            layer_gpu[il] = (int) j;
            ggml_backend_dev_t d = model.dev_layer(il);
            if (dev == nullptr) {
                dev = d;
            } else if (d != dev) {
                RSD_FAIL("key 'gpus[%zu].layers': llama.cpp put layer %d on %s but earlier layers of this GPU on %s; "
                        "plan the GPUs as llama.cpp splits the layers", j, il, ggml_backend_dev_name(d), ggml_backend_dev_name(dev));
            }

            const llama_layer & layer = model.layers[il];
            ggml_tensor * exps[LLAMA_RESIDENCY_N_KIND];
            residency_layer_exps(layer, exps);
            if (residency_expert_bytes(exps) == 0) {
                continue; // dense layer
            }
            if (residency_layer_has_extras(layer)) {
                RSD_FAIL("layer %d: experts with biases or scales are not supported by the resident pools", il);
            }
            klass kl;
            for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
                ggml_tensor * t = exps[k];
                if (t == nullptr) {
                    kl.emplace_back(-1, 0, 0);
                    continue;
                }
                if (t->buffer == nullptr || !ggml_backend_buffer_is_host(t->buffer)) {
                    RSD_FAIL("tensor %s is in %s, not in host memory: the resident pools need every routed expert "
                            "in host memory (llama-server: --cpu-moe, added by --residency-plan)",
                            t->name, t->buffer ? ggml_backend_buffer_name(t->buffer) : "no buffer");
                }
                if (!ggml_is_contiguous(t) || t->ne[2] != (int64_t) n_expert) {
                    RSD_FAIL("tensor %s: expected a contiguous [*, *, %u] expert tensor", t->name, n_expert);
                }
                kl.emplace_back((int) t->type, t->ne[0], t->ne[1]);
            }
            auto key = std::make_pair((int) j, kl);
            auto it = pool_of.find(key);
            if (it == pool_of.end()) {
                llama_residency_pool p;
                p.gpu = (int) j;
                p.dev = dev;
                p.n_expert = n_expert;
                p.n_used   = n_used;
                it = pool_of.emplace(key, (int) rsd->pools.size()).first;
                rsd->pools.push_back(p);
            }
            auto & lr = rsd->layers[il];
            lr.pool = it->second;
            std::copy(exps, exps + LLAMA_RESIDENCY_N_KIND, lr.host);
        }
    }

    // slots
    std::vector<std::vector<int32_t>> slot_of(n_layer, std::vector<int32_t>(n_expert, -1));
    for (size_t j = 0; j < gpu_slots.size(); ++j) {
        uint64_t used = 0;
        for (const auto & [il, e] : gpu_slots[j]) {
            if (il < 0 || il >= (int) n_layer || e < 0 || e >= (int) n_expert) {
                RSD_FAIL("key 'gpus[%zu].slots': (%d, %d) is outside the model", j, il, e);
            }
            if (layer_gpu[il] != (int) j) {
                RSD_FAIL("key 'gpus[%zu].slots': layer %d is not on this GPU", j, il);
            }
            auto & lr = rsd->layers[il];
            if (lr.pool < 0) {
                RSD_FAIL("key 'gpus[%zu].slots': layer %d has no routed experts", j, il);
            }
            if (slot_of[il][e] >= 0) {
                RSD_FAIL("key 'gpus[%zu].slots': expert (%d, %d) is resident twice", j, il, e);
            }
            slot_of[il][e] = (int32_t) rsd->pools[lr.pool].n_slot++;
            lr.n_resident++;
            used += residency_expert_bytes(lr.host);
        }
        if (gpu_pool_bytes[j] > 0 && used > gpu_pool_bytes[j]) {
            RSD_FAIL("key 'gpus[%zu]': the slots need %" PRIu64 " bytes, pool_bytes is %" PRIu64, j, used, gpu_pool_bytes[j]);
        }
    }

    // allocate: one context and buffer per pool (its experts, staging area and its layers' tables)
    for (size_t ip = 0; ip < rsd->pools.size(); ++ip) {
        auto & p = rsd->pools[ip];
        ggml_init_params ip_params = {
            /*.mem_size   =*/ ggml_tensor_overhead() * (3*LLAMA_RESIDENCY_N_KIND + 5*n_layer + 1),
            /*.mem_buffer =*/ nullptr,
            /*.no_alloc   =*/ true,
        };
        ggml_context * ctx = ggml_init(ip_params);
        rsd->ctxs.push_back(ctx);

        const llama_residency_layer * first = nullptr;
        for (auto & lr : rsd->layers) {
            if (lr.pool == (int) ip) {
                first = first ? first : &lr;
            }
        }
        for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
            const ggml_tensor * h = first->host[k];
            if (h == nullptr) {
                continue;
            }
            const int64_t n_pool = p.n_slot + p.n_used, n_stage = p.n_expert + p.n_used;
            p.all[k]   = ggml_new_tensor_3d(ctx, h->type, h->ne[0], h->ne[1], n_pool + n_stage);
            p.exps[k]  = ggml_view_3d(ctx, p.all[k], h->ne[0], h->ne[1], n_pool,  p.all[k]->nb[1], p.all[k]->nb[2], 0);
            p.stage[k] = ggml_view_3d(ctx, p.all[k], h->ne[0], h->ne[1], n_stage, p.all[k]->nb[1], p.all[k]->nb[2],
                                      (size_t) n_pool*p.all[k]->nb[2]);
            ggml_format_name(p.all[k],   "pool%zu.all.%s", ip, k_kind_name[k]);
            ggml_format_name(p.exps[k],  "pool%zu.%s", ip, k_kind_name[k]);
            ggml_format_name(p.stage[k], "stage%zu.%s", ip, k_kind_name[k]);
        }
        for (uint32_t il = 0; il < n_layer; ++il) {
            auto & lr = rsd->layers[il];
            if (lr.pool != (int) ip) {
                continue;
            }
            lr.tab_slot  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, (int64_t) n_used*n_expert);
            lr.tab_cold  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, (int64_t) n_used*n_expert);
            lr.tab_stage = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, (int64_t) n_used*n_expert);
            ggml_format_name(lr.tab_slot,  "residency_slot-%u", il);
            ggml_format_name(lr.tab_cold,  "residency_cold-%u", il);
            ggml_format_name(lr.tab_stage, "residency_stage-%u", il);
            lr.tab_hot_b  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, (int64_t) n_used*n_expert);
            lr.tab_cold_b = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 1, (int64_t) n_used*n_expert);
            ggml_format_name(lr.tab_hot_b,  "residency_hot_b-%u", il);
            ggml_format_name(lr.tab_cold_b, "residency_cold_b-%u", il);
        }

        p.route_offset = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_used, 1);
        ggml_format_name(p.route_offset, "residency_route_offset%zu", ip);

        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(p.dev);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
        if (buf == nullptr) {
            RSD_FAIL("cannot allocate pool %zu (%" PRId64 " resident experts and a staging area of %" PRId64 ") on %s",
                    ip, p.n_slot, p.n_expert, ggml_backend_dev_name(p.dev));
        }
        rsd->bufs.push_back(buf);
        ggml_backend_buffer_clear(buf, 0); // zero slots, and no stale NaNs in staging slots
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        LLAMA_LOG_INFO("%s: pool %zu on %s (plan GPU %d): %" PRId64 " resident experts, %.2f MiB with its staging area\n",
                __func__, ip, ggml_backend_dev_name(p.dev), p.gpu, p.n_slot, ggml_backend_buffer_get_size(buf)/1048576.0);
    }

    // copy the resident experts and write the tables
    for (uint32_t il = 0; il < n_layer; ++il) {
        auto & lr = rsd->layers[il];
        if (lr.pool < 0) {
            continue;
        }
        const auto & p = rsd->pools[lr.pool];
        for (uint32_t e = 0; e < n_expert; ++e) {
            const int32_t s = slot_of[il][e];
            if (s < 0) {
                continue;
            }
            for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
                const ggml_tensor * h = lr.host[k];
                if (h) {
                    ggml_backend_tensor_set(p.exps[k], (const char *) h->data + e*h->nb[2], (size_t) s*h->nb[2], h->nb[2]);
                }
            }
        }
        residency_write_tables(*rsd, (int) il, slot_of[il]);
    }
    rsd->slot_of = std::move(slot_of);
    for (uint32_t il = 0; il < n_layer; ++il) {
        if (rsd->layers[il].pool >= 0) {
            residency_write_borrow_tables(*rsd, (int) il, std::vector<int32_t>(n_expert, -1)); // nothing borrowed
        }
    }
    std::vector<float> off(n_used);
    for (uint32_t j = 0; j < n_used; ++j) {
        off[j] = (float) ((size_t) j*n_expert); // exact in F32 (far below 2^24)
    }
    for (const auto & p : rsd->pools) {
        ggml_backend_tensor_set(p.route_offset, off.data(), 0, n_used*sizeof(float));
    }

    int n_moe = 0, n_res = 0;
    for (size_t il = 0; il < rsd->layers.size(); ++il) {
        const auto & lr = rsd->layers[il];
        if (lr.pool >= 0 && rsd->il_first < 0) {
            rsd->il_first = (int) il;
        }
        n_moe += lr.pool >= 0;
        n_res += lr.n_resident;
    }
    LLAMA_LOG_INFO("%s: residency plan '%s': %d resident experts over %d MoE layers in %zu pool(s); "
            "passes of fewer than %u tokens take the split path, longer ones the upload path\n",
            __func__, path, n_res, n_moe, rsd->pools.size(), n_upload_min);

    return rsd.release();
}

//
// graph
//

static llm_graph_input_residency * residency_input_get(llm_graph_result * res) {
    for (auto & inp : res->inputs) {
        if (auto * r = dynamic_cast<llm_graph_input_residency *>(inp.get())) {
            return r;
        }
    }
    return nullptr;
}

static llm_graph_input_residency * residency_input_get_or_add(llm_graph_result * res, const llama_residency * rsd) {
    auto * inp = residency_input_get(res);
    if (inp == nullptr) {
        inp = static_cast<llm_graph_input_residency *>(res->add_input(std::make_unique<llm_graph_input_residency>(rsd)));
    }
    return inp;
}

static void residency_log_header(FILE * f) {
    fprintf(f, "pass\tpos0\tn_tokens\trows\tlayer\tpool\tpath\thits\tmisses\tevictions\tadmissions\texperts\n");
    fflush(f);
}

static ggml_backend_t residency_backend_for(ggml_backend_sched_t sched, ggml_backend_dev_t dev);

// borrowed memory before a pass runs: an upload pass takes every borrowed slot back (it fills the staging areas with its
// own cold experts), a decode step is a token boundary (experts copied since the last one join, new copies are queued);
// the layers whose decode tables change are rewritten once the pools' devices are idle
static void residency_borrow_before(llm_graph_input_residency & inp) {
    const llama_residency & rsd = *inp.rsd;
    std::set<int> dirty;
    if (!inp.upload_nodes.empty()) {
        rsd.borrow->reclaim(dirty);
    } else if (inp.borrow_decode) {
        rsd.borrow->boundary(dirty);
    }
    if (dirty.empty()) {
        return;
    }
    std::set<ggml_backend_t> sync;
    for (int il : dirty) {
        ggml_backend_t b = inp.sched ? residency_backend_for(inp.sched, rsd.pools[rsd.layers[il].pool].dev) : nullptr;
        if (b != nullptr && sync.insert(b).second) {
            ggml_backend_synchronize(b); // no pass still reads the tables
        }
    }
    for (int il : dirty) {
        residency_write_borrow_tables(rsd, il, rsd.borrow->active[il]);
    }
}

llm_graph_input_residency::~llm_graph_input_residency() {
    for (auto & b : host_branches) {
        if (b.galloc != nullptr) {
            ggml_gallocr_free(b.galloc);
        }
    }
    if (host_ctx != nullptr) {
        ggml_free(host_ctx);
    }
}

bool llm_graph_input_residency::can_reuse(const llm_graph_params & params) {
    (void) params;
    for (const auto & hg : host_graphs) {
        if (hg.host->failed) {
            return false;
        }
    }
    return true;
}

void llm_graph_input_residency::set_input(const llama_ubatch * ubatch) {
    if (rsd->borrow && ubatch != nullptr) {
        residency_borrow_before(*this);
    }
    for (auto & hg : host_graphs) {
        hg.host->arm(&hg.by_layer, hg.n_send);
    }
    llama_residency_policy * pol = rsd->policy.get();
    if (pol == nullptr || ubatch == nullptr) {
        return;
    }
    pass     = pol->n_pass++;
    pos0     = ubatch->pos ? ubatch->pos[0] : -1;
    n_tokens = ubatch->n_tokens;
    started  = false;
    swapped.clear();
    if (native && pol->log) {
        fprintf(pol->log, "%" PRIu64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t-1\t-1\tnative\t0\t0\t0\t0\t\n",
                pass, pos0, n_tokens, n_tokens);
        fflush(pol->log);
    }
}

// mark the MUL_MAT_ID nodes that read `ids` so that the CPU skips ids < 0; they sit a few ops above
// `out` (down <- activation <- gate/up), so the walk stops after a few levels instead of visiting the graph
static void residency_mark_skip(ggml_tensor * out, const ggml_tensor * ids, int depth, std::set<ggml_tensor *> & seen) {
    if (out == nullptr || out == ids || depth > 12 || !seen.insert(out).second) {
        return;
    }
    if (out->op == GGML_OP_MUL_MAT_ID && out->src[2] == ids) {
        out->op_params[GGML_MUL_MAT_ID_SKIP] = 1;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        residency_mark_skip(out->src[i], ids, depth + 1, seen);
    }
}

// whether t depends on `on` within a few ops (the walk of residency_mark_skip)
static bool residency_depends_on(const ggml_tensor * t, const ggml_tensor * on, int depth, std::set<const ggml_tensor *> & seen) {
    if (t == nullptr || depth > 12 || !seen.insert(t).second) {
        return false;
    }
    if (t == on) {
        return true;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (residency_depends_on(t->src[i], on, depth + 1, seen)) {
            return true;
        }
    }
    return false;
}

// the inputs of the cold branch that come from outside it: the ids and what the marked MUL_MAT_IDs multiply that does
// not itself depend on the ids (the FFN input; the down projection's input is computed inside the branch)
static void residency_cold_inputs(ggml_tensor * out, const ggml_tensor * ids, int depth, std::set<ggml_tensor *> & seen,
                                  std::vector<ggml_tensor *> & inputs) {
    if (out == nullptr || out == ids || depth > 12 || !seen.insert(out).second) {
        return;
    }
    if (out->op == GGML_OP_MUL_MAT_ID && out->src[2] == ids) {
        std::set<const ggml_tensor *> seen_dep;
        ggml_tensor * b = out->src[1];
        if (!residency_depends_on(b, ids, 0, seen_dep) && std::find(inputs.begin(), inputs.end(), b) == inputs.end()) {
            inputs.push_back(b);
        }
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        residency_cold_inputs(out->src[i], ids, depth + 1, seen, inputs);
    }
}

// the split path's three CPU nodes (CPU-only GGML_OP_CUSTOM nodes that compute nothing; every thread of the CPU backend
// calls them, thread 0 acts), in the graph order [cold_in] [GPU branch] [hot_wait] [CPU branch] [cold_done] [sum] of
// every split-path pass, whatever the branch order and the timers: the same nodes in the same order, so the scheduler
// makes the same splits and the graph allocator the same placements, and the orders compute bitwise the same.
// - cold_in takes the cold branch's inputs and ids: the scheduler copies them to the CPU when it reaches it (waiting for
//   the GPU up to the router), and the cold branch, placed after the GPU branch, reads those copies without another
//   copy or synchronization. Timers: counts the cold routes and stamps t0.
// - hot_wait reads nothing from the GPU, so the scheduler launches the GPU branch asynchronously and goes on to the
//   CPU split. In turn (or timed) it waits for the GPU's stream, so the CPU branch starts after the GPU branch has
//   finished; overlapped it returns at once, and the CPU computes the cold routes while the GPU computes the resident
//   ones. Timers: stamps t1.
// - cold_done reads the cold branch's output. Timers: stamps t2 and keeps the layer's timing.
static void residency_cold_in(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) nth;
    auto * b = (llama_residency_branch_node *) userdata;
    if (ith != 0) {
        return;
    }
    int n_src = 0;
    while (n_src < GGML_MAX_SRC && dst->src[n_src] != nullptr) {
        ++n_src;
    }
    const ggml_tensor * ids = dst->src[n_src - 1]; // the last source: the cold ids, I32 [n_used, n_tokens], -1 if not cold
    if (b->borrow != nullptr) {
        // borrowed memory: the one before it is the layer's flat route ids (I32 [n_used*n_tokens], contiguous)
        const ggml_tensor * flat = dst->src[n_src - 2];
        b->borrow->record(b->layer, (const int32_t *) flat->data, ggml_nelements(flat), b->decode);
    }
    if (b->slot == nullptr) {
        return;
    }
    auto * s = b->slot;
    int32_t n_cold = 0;
    for (int64_t t = 0; t < ids->ne[1]; ++t) {
        const int32_t * row = (const int32_t *) ((const char *) ids->data + t*ids->nb[1]);
        for (int64_t j = 0; j < ids->ne[0]; ++j) {
            n_cold += row[j] >= 0;
        }
    }
    if (s->layer == s->owner->layer_first) {
        std::lock_guard<std::mutex> lock(s->owner->mutex);
        s->owner->n_pass++;
    }
    s->pass     = s->owner->n_pass;
    s->n_cold   = n_cold;
    s->n_tokens = (int32_t) ids->ne[1];
    s->t0_us    = ggml_time_us();
}

static void residency_hot_wait(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) dst; (void) nth;
    auto * b = (llama_residency_branch_node *) userdata;
    if (ith != 0) {
        return;
    }
    if (b->wait && b->backend != nullptr) {
        ggml_backend_synchronize(b->backend);
    }
    if (b->slot != nullptr) {
        b->slot->t1_us = ggml_time_us();
    }
}

static void residency_cold_done(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) dst; (void) nth;
    auto * b = (llama_residency_branch_node *) userdata;
    if (ith != 0 || b->slot == nullptr) {
        return;
    }
    const int64_t t2_us = ggml_time_us();
    auto * s = b->slot;
    llama_residency_timing r = {};
    r.pass     = s->pass;
    r.layer    = s->layer;
    r.n_tokens = s->n_tokens;
    r.n_cold   = s->n_cold;
    r.gpu_ms   = (s->t1_us - s->t0_us) / 1e3;
    r.cpu_ms   = (t2_us - s->t1_us) / 1e3;
    std::lock_guard<std::mutex> lock(s->owner->mutex);
    s->owner->records.push_back(r);
    if (s->owner->records.size() > llama_residency_timers::n_keep) {
        s->owner->records.pop_front();
    }
}

// one graph per decode step: swap the sources of the cold branch's nodes (reachable from out, stopping at the inputs)
// for their stand-ins in the channel; every swap is recorded so that it can be undone
static void residency_swap_srcs(ggml_tensor * out, const std::map<const ggml_tensor *, ggml_tensor *> & standin, int depth,
                                std::set<ggml_tensor *> & seen, std::vector<std::tuple<ggml_tensor *, int, ggml_tensor *>> & swaps) {
    if (out == nullptr || depth > 12 || standin.count(out) || !seen.insert(out).second) {
        return;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        ggml_tensor * s = out->src[i];
        auto it = standin.find(s);
        if (s != nullptr && it != standin.end()) {
            swaps.emplace_back(out, i, s);
            out->src[i] = it->second;
        } else {
            residency_swap_srcs(s, standin, depth + 1, seen, swaps);
        }
    }
}

// whether the nodes below t (down to tensors with memory of their own) are few and reach no input of the decode graph
static bool residency_host_graph_closed(const ggml_tensor * t, std::set<const ggml_tensor *> & seen) {
    if (t == nullptr || t->data != nullptr || !seen.insert(t).second) {
        return true;
    }
    if (seen.size() > 200 || (t->op == GGML_OP_NONE && t->view_src == nullptr)) {
        return false;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (!residency_host_graph_closed(t->src[i], seen)) {
            return false;
        }
    }
    return t->view_src == nullptr || residency_host_graph_closed(t->view_src, seen);
}

// one graph per decode step: the layer's CPU branch becomes a host branch of the decode graph (engine/README.md, "One
// graph per decode step"): a SEND node hands the cold inputs (and, with borrowed memory, the layer's routes) to the
// worker of the pool's device and the graph goes on with the GPU branch; a RECV node waits for the worker's result. The
// cold branch's nodes, built by build_experts as on the other paths, are taken out of the graph into a graph of their
// own that reads the channel. nullptr (nothing changed) when the branch does not fit the channel.
static ggml_tensor * residency_build_host_branch(
        const llama_residency * rsd, llama_residency_host * host, ggml_context * ctx0, llm_graph_result * res,
        ggml_cgraph * gf, int il, ggml_tensor * out_hot, ggml_tensor * out_cold, ggml_tensor * ids_cold,
        ggml_tensor * ids_flat, bool borrow_decode, const std::vector<ggml_tensor *> & cold_inputs) {
    std::vector<ggml_tensor *> srcs = cold_inputs;
    if (rsd->borrow) {
        srcs.push_back(ids_flat);
    }
    srcs.push_back(ids_cold);
    const char * why = nullptr;
    size_t in_bytes = 0;
    for (ggml_tensor * t : srcs) {
        if (!ggml_is_contiguous(t)) {
            why = "an input of the cold branch is not contiguous";
        }
        in_bytes += (ggml_nbytes(t) + GGML_HOST_BRANCH_ALIGN - 1) / GGML_HOST_BRANCH_ALIGN * GGML_HOST_BRANCH_ALIGN;
    }
    if (srcs.size() > GGML_MAX_SRC) {
        why = "the cold branch has too many inputs";
    } else if (in_bytes > host->ch.out_offset || host->ch.out_offset + ggml_nbytes(out_cold) > host->ch.buf_size) {
        why = "the cold branch does not fit the channel";
    } else if (out_cold->type != GGML_TYPE_F32 || !ggml_is_contiguous(out_cold) || out_cold->view_src != nullptr) {
        why = "the cold branch's output is not a contiguous F32 tensor";
    }
    std::map<const ggml_tensor *, ggml_tensor *> standin;
    std::vector<std::tuple<ggml_tensor *, int, ggml_tensor *>> swaps;
    auto * inp = residency_input_get_or_add(res, rsd);
    if (why == nullptr) {
        size_t off = 0;
        for (ggml_tensor * t : srcs) {
            ggml_tensor * h = ggml_new_tensor(ctx0, t->type, GGML_MAX_DIMS, t->ne);
            ggml_format_name(h, "ffn_moe_host_in-%d", il);
            h->buffer = host->buf_host;
            h->data   = host->ch.buf + off;
            off += (ggml_nbytes(t) + GGML_HOST_BRANCH_ALIGN - 1) / GGML_HOST_BRANCH_ALIGN * GGML_HOST_BRANCH_ALIGN;
            standin[t] = h;
        }
        std::set<ggml_tensor *> seen;
        residency_swap_srcs(out_cold, standin, 0, seen, swaps);

        if (inp->host_ctx == nullptr) {
            ggml_init_params ip = { rsd->layers.size()*ggml_graph_overhead_custom(256, false) + 4096, nullptr, true };
            inp->host_ctx = ggml_init(ip);
        }
        inp->host_branches.emplace_back();
        auto & b = inp->host_branches.back();
        b.layer    = il;
        b.decode   = borrow_decode;
        b.ids_cold = standin[ids_cold];
        b.ids_flat = rsd->borrow ? standin[ids_flat] : nullptr;
        b.out      = out_cold;
        b.gf       = inp->host_ctx ? ggml_new_graph_custom(inp->host_ctx, 256, false) : nullptr;
        if (b.gf == nullptr) {
            why = "no memory for the cold branch's graph";
        } else {
            // the branch's graph must not reach back into the decode graph: below its output, every tensor is a node of
            // the branch or has memory of its own (a weight, a stand-in)
            std::set<const ggml_tensor *> seen_chk;
            if (!residency_host_graph_closed(out_cold, seen_chk)) {
                why = "the cold branch reads a tensor of the decode graph other than its inputs";
            } else {
                out_cold->buffer = host->buf_host;
                out_cold->data   = host->ch.buf + host->ch.out_offset;
                ggml_build_forward_expand(b.gf, out_cold);
            }
            if (why == nullptr) {
                b.galloc = ggml_gallocr_new(ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)));
                if (b.galloc == nullptr || !ggml_gallocr_alloc_graph(b.galloc, b.gf)) {
                    why = "cannot allocate the cold branch's host memory";
                }
            }
        }
        if (why != nullptr) {
            for (auto it = swaps.rbegin(); it != swaps.rend(); ++it) {
                std::get<0>(*it)->src[std::get<1>(*it)] = std::get<2>(*it);
            }
            out_cold->buffer = nullptr;
            out_cold->data   = nullptr;
            if (b.galloc != nullptr) {
                ggml_gallocr_free(b.galloc);
            }
            inp->host_branches.pop_back();
        }
    }
    if (why != nullptr) {
        if (!rsd->graph_step_warned) {
            LLAMA_LOG_WARN("%s: --residency-graph step: layer %d of a decode graph computes on per-segment graphs: %s\n",
                           __func__, il, why);
            const_cast<llama_residency *>(rsd)->graph_step_warned = true;
        }
        return nullptr;
    }

    llm_graph_input_residency::host_graph * hg = nullptr;
    for (auto & g : inp->host_graphs) {
        if (g.host == host) {
            hg = &g;
        }
    }
    if (hg == nullptr) {
        inp->host_graphs.push_back({host, std::vector<llama_residency_host_branch *>(rsd->layers.size(), nullptr), 0});
        hg = &inp->host_graphs.back();
    }
    hg->by_layer[il] = &inp->host_branches.back();
    hg->n_send++;

    // [send] [GPU branch] [recv] [sum]: the GPU computes the resident routes while the worker computes the cold ones
    ggml_tensor * send = ggml_host_branch_send(ctx0, srcs.data(), (int) srcs.size(), &host->ch, il);
    ggml_format_name(send, "ffn_moe_host_send-%d", il);
    ggml_build_forward_expand(gf, send);
    ggml_build_forward_expand(gf, out_hot);
    ggml_tensor * recv = ggml_host_branch_recv(ctx0, send, GGML_TYPE_F32, out_cold->ne[0], out_cold->ne[1],
                                               out_cold->ne[2], out_cold->ne[3]);
    ggml_format_name(recv, "ffn_moe_host_recv-%d", il);
    return recv;
}

// table lookup per route: flat index j*n_expert + e of every route -> [n_used, n_tokens] values of tab
static ggml_tensor * residency_lookup(ggml_context * ctx0, ggml_tensor * tab, ggml_tensor * idx, int64_t n_used, int64_t n_tokens) {
    ggml_tensor * v = ggml_get_rows(ctx0, tab, idx); // [1, n_used*n_tokens]
    return ggml_reshape_2d(ctx0, v, n_used, n_tokens);
}

ggml_tensor * llama_residency_build_moe(
        const llama_residency * rsd,
               ggml_context * ctx0,
           llm_graph_result * res,
                ggml_cgraph * gf,
                ggml_tensor * selected,
                        int   il,
                    int64_t   n_pass,
          ggml_tensor * const * exps,
                       bool   has_extras,
        const llama_residency_experts_fn & build_experts) {
    if (rsd == nullptr || il < 0 || il >= (int) rsd->layers.size() || has_extras) {
        return nullptr;
    }
    const auto & lr = rsd->layers[il];
    if (lr.pool < 0) {
        return nullptr;
    }
    for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
        if (exps[k] != lr.host[k]) {
            return nullptr; // another expert set than the plan's (not the layer's routed experts)
        }
    }
    const auto & p = rsd->pools[lr.pool];

    const int64_t n_used   = selected->ne[0];
    const int64_t n_tokens = selected->ne[1];

    llama_residency_policy * pol = rsd->policy.get();
    if (pol != nullptr) {
        auto * inp = residency_input_get_or_add(res, rsd);
        if (!pol->serves(n_pass)) {
            inp->native = true; // a pass the cache does not serve computes as llama.cpp does
            return nullptr;
        }
    }

    if (rsd->prefill_native && n_pass > 1) {
        // ablation: prefill takes llama.cpp's native path (all routes from host memory: on the CPU, or uploaded
        // by the backend's op offload), only single-token passes use the pools
        if (il == rsd->il_first) {
            LLAMA_LOG_INFO("%s: native prefill graph of %lld tokens: resident experts not used\n", __func__, (long long) n_pass);
        }
        return nullptr;
    }

    // flat table index j*n_expert + e of every route (route position j, expert e), computed in F32
    // (exact: far below 2^24) because ggml has no integer add
    if (n_used != p.route_offset->ne[0]) {
        return nullptr;
    }
    ggml_tensor * idx = ggml_add(ctx0, ggml_cast(ctx0, selected, GGML_TYPE_F32), p.route_offset);
    ggml_tensor * ids_flat = ggml_reshape_1d(ctx0, ggml_cast(ctx0, idx, GGML_TYPE_I32), n_used*n_tokens);

    if (pol != nullptr) {
        // a dynamic policy: the eval callback reads the pass's routes here, updates the pool and the tables, and
        // only then do the lookups below run; routes the pool does not hold go to the CPU as on the split path
        ggml_format_name(ids_flat, "ffn_moe_ids_flat-%d", il);
        ggml_build_forward_expand(gf, ids_flat);
        residency_input_get(res)->cache_nodes[ids_flat] = il;
    }

    const bool split = pol != nullptr || n_tokens < (int64_t) rsd->n_upload_min;
    // borrowed memory: a decode step's GPU branch computes the experts lent the staging area in the same expert
    // computation as the pool's (both in the pool's `all` tensors), and its CPU branch only the experts neither holds
    const bool borrow_decode = rsd->borrow != nullptr && split && n_pass == 1;

    // GPU branch: resident (and borrowed) experts from the pool, other routes on the pool's zero slots
    ggml_tensor * ids_hot = residency_lookup(ctx0, borrow_decode ? lr.tab_hot_b : lr.tab_slot, ids_flat, n_used, n_tokens);
    ggml_format_name(ids_hot, "ffn_moe_ids_hot-%d", il);
    ggml_tensor * out_hot = build_experts(ids_hot, borrow_decode ? p.all : p.exps);
    ggml_format_name(out_hot, "ffn_moe_hot-%d", il);
    if (borrow_decode) {
        residency_input_get_or_add(res, rsd)->borrow_decode = true;
    }

    ggml_tensor * out_cold = nullptr;
    if (split) {
        // split path: cold routes on the CPU from host memory, resident routes skipped (id -1)
        ggml_tensor * ids_cold = residency_lookup(ctx0, borrow_decode ? lr.tab_cold_b : lr.tab_cold, ids_flat, n_used, n_tokens);
        ggml_format_name(ids_cold, "ffn_moe_ids_cold-%d", il);
        out_cold = build_experts(ids_cold, lr.host);
        std::set<ggml_tensor *> seen;
        residency_mark_skip(out_cold, ids_cold, 0, seen);
        ggml_format_name(out_cold, "ffn_moe_cold-%d", il);
        llama_residency_timer_slot * slot = rsd->timers ? &rsd->timers->slots[il] : nullptr;
        // the graph order [cold_in] [GPU branch] [hot_wait] [CPU branch] [cold_done] [sum], for every branch order
        // and with or without timers (the nodes above); only what hot_wait does differs
        std::vector<ggml_tensor *> in;
        std::set<ggml_tensor *> seen_in;
        residency_cold_inputs(out_cold, ids_cold, 0, seen_in, in);
        // one graph per decode step (--residency-graph step): the cold routes go to the pool device's CPU worker
        if (n_pass == 1 && !rsd->hosts.empty() && pol == nullptr && slot == nullptr) {
            llama_residency_host * host = nullptr;
            for (const auto & h : rsd->hosts) {
                if (h->dev == p.dev && !h->failed) {
                    host = h.get();
                }
            }
            if (host != nullptr) {
                ggml_tensor * recv = residency_build_host_branch(rsd, host, ctx0, res, gf, il, out_hot, out_cold, ids_cold,
                                                                 ids_flat, borrow_decode, in);
                if (recv != nullptr) {
                    return ggml_add(ctx0, out_hot, recv);
                }
            }
        }
        if (rsd->borrow) {
            in.push_back(ids_flat); // borrowed memory: the layer's routes, counted by cold_in
        }
        in.push_back(ids_cold);
        if ((int) in.size() <= GGML_MAX_SRC) {
            auto * inp = residency_input_get_or_add(res, rsd);
            inp->branch_nodes.push_back({p.dev, nullptr, !rsd->overlap || slot != nullptr, slot,
                                         rsd->borrow.get(), il, borrow_decode});
            void * ud = &inp->branch_nodes.back();
            ggml_tensor * cold_in = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, in.data(), (int) in.size(),
                                                   residency_cold_in, 1, ud);
            ggml_format_name(cold_in, "ffn_moe_cold_in-%d", il);
            ggml_build_forward_expand(gf, cold_in);
            ggml_build_forward_expand(gf, out_hot);
            ggml_tensor * hot_wait = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, &cold_in, 1,
                                                    residency_hot_wait, 1, ud);
            ggml_format_name(hot_wait, "ffn_moe_hot_wait-%d", il);
            ggml_build_forward_expand(gf, hot_wait);
            ggml_build_forward_expand(gf, out_cold);
            ggml_tensor * cold_done = ggml_custom_4d(ctx0, GGML_TYPE_F32, 1, 1, 1, 1, &out_cold, 1,
                                                     residency_cold_done, 1, ud);
            ggml_format_name(cold_done, "ffn_moe_cold_done-%d", il);
            ggml_build_forward_expand(gf, cold_done);
        } else {
            if (il == rsd->il_first) {
                LLAMA_LOG_WARN("%s: the cold branch has %zu inputs (more than %d): its branches compute in turn, untimed%s\n",
                               __func__, in.size(), GGML_MAX_SRC, rsd->borrow ? ", and no CPU use raises a score" : "");
            }
        }
    } else {
        // upload path: the eval callback copies each distinct cold expert into the staging area once,
        // when the staging ids are computed; resident routes use the staging zero slot
        ggml_tensor * ids_stage = residency_lookup(ctx0, lr.tab_stage, ids_flat, n_used, n_tokens);
        ggml_format_name(ids_stage, "ffn_moe_ids_stage-%d", il);
        ggml_build_forward_expand(gf, ids_stage); // computed (and its callback run) before the staging matmuls

        auto * inp = residency_input_get(res);
        if (inp == nullptr) {
            inp = static_cast<llm_graph_input_residency *>(res->add_input(std::make_unique<llm_graph_input_residency>(rsd)));
        }
        inp->upload_nodes[ids_stage] = il;
        inp->upload_last = il;

        out_cold = build_experts(ids_stage, p.stage);
        ggml_format_name(out_cold, "ffn_moe_staged-%d", il);
    }

    // each route is computed by exactly one branch; the other gives an exact zero
    return ggml_add(ctx0, out_hot, out_cold);
}

//
// upload path: the eval callback
//

static ggml_backend_t residency_backend_for(ggml_backend_sched_t sched, ggml_backend_dev_t dev) {
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_t b = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_get_device(b) == dev) {
            return b;
        }
    }
    return nullptr;
}

static void residency_upload(llm_graph_input_residency & inp, ggml_tensor * t, int il) {
    const llama_residency & rsd = *inp.rsd;
    const auto & lr = rsd.layers[il];
    const auto & p  = rsd.pools[lr.pool];

    const int64_t t0 = ggml_time_us();

    std::vector<int32_t> ids(ggml_nelements(t));
    ggml_backend_tensor_get(t, ids.data(), 0, ids.size()*sizeof(int32_t));

    std::vector<uint8_t> used(p.n_expert, 0);
    for (int32_t id : ids) {
        GGML_ASSERT(id >= 0 && id < p.n_expert + p.n_used);
        if (id < p.n_expert) {
            used[id] = 1; // ids from n_expert on are the zero slots of resident routes
        }
    }

    ggml_backend_t backend = residency_backend_for(inp.sched, p.dev);
    uint64_t n_exp = 0, n_bytes = 0;

    // copy runs of consecutive cold experts: staging slot e holds expert e
    for (int64_t e = 0; e < p.n_expert; ) {
        if (!used[e]) {
            ++e;
            continue;
        }
        int64_t e1 = e;
        while (e1 + 1 < p.n_expert && used[e1 + 1]) {
            ++e1;
        }
        for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
            const ggml_tensor * h = lr.host[k];
            if (h == nullptr) {
                continue;
            }
            const size_t off = (size_t) e*h->nb[2];
            const size_t n   = (size_t) (e1 - e + 1)*h->nb[2];
            if (backend) {
                ggml_backend_tensor_set_async(backend, p.stage[k], (const char *) h->data + off, off, n);
            } else {
                ggml_backend_tensor_set(p.stage[k], (const char *) h->data + off, off, n);
            }
            n_bytes += n;
        }
        n_exp += e1 - e + 1;
        e = e1 + 1;
    }
    if (backend) {
        ggml_backend_synchronize(backend);
    }

    const int64_t dt = ggml_time_us() - t0;
    inp.pass_experts += n_exp;
    inp.pass_bytes   += n_bytes;
    inp.pass_us      += dt;

    if (il == inp.upload_last) {
        rsd.n_upload_pass    += 1;
        rsd.n_upload_experts += inp.pass_experts;
        rsd.n_upload_bytes   += inp.pass_bytes;
        rsd.t_upload_us      += inp.pass_us;
        LLAMA_LOG_INFO("%s: upload pass of %" PRId64 " routes: %" PRIu64 " cold experts, %.1f MiB in %.2f ms (%.2f GB/s)\n",
                __func__, (int64_t) ids.size(), inp.pass_experts, inp.pass_bytes/1048576.0, inp.pass_us/1000.0,
                inp.pass_us > 0 ? inp.pass_bytes/(inp.pass_us*1000.0) : 0.0);
        inp.pass_experts = 0;
        inp.pass_bytes   = 0;
        inp.pass_us      = 0;
    }
}

//
// dynamic policies: the eval callback on each served layer's route ids
//

// copy experts into their pool slots (one wait per backend at the end)
static void residency_copy_moves(llm_graph_input_residency & inp, const std::vector<llama_residency_move> & moves) {
    if (moves.empty()) {
        return;
    }
    const llama_residency & rsd = *inp.rsd;
    llama_residency_policy & pol = *rsd.policy;
    const int64_t t0 = ggml_time_us();
    std::set<ggml_backend_t> used;
    for (const auto & m : moves) {
        const auto & lr = rsd.layers[m.layer];
        const auto & p  = rsd.pools[lr.pool];
        ggml_backend_t backend = residency_backend_for(inp.sched, p.dev);
        for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
            const ggml_tensor * h = lr.host[k];
            if (h == nullptr) {
                continue;
            }
            const char * src = (const char *) h->data + (size_t) m.expert*h->nb[2];
            const size_t off = (size_t) m.slot*h->nb[2];
            if (backend) {
                ggml_backend_tensor_set_async(backend, p.exps[k], src, off, h->nb[2]);
            } else {
                ggml_backend_tensor_set(p.exps[k], src, off, h->nb[2]);
            }
            pol.n_copy_bytes += h->nb[2];
        }
        if (backend) {
            used.insert(backend);
        }
    }
    for (ggml_backend_t b : used) {
        ggml_backend_synchronize(b);
    }
    pol.n_admissions += moves.size();
    pol.t_copy_us    += ggml_time_us() - t0;
}

static void residency_cache_serve(llm_graph_input_residency & inp, ggml_tensor * t, int il) {
    const llama_residency & rsd = *inp.rsd;
    llama_residency_policy & pol = *rsd.policy;
    const auto & lr = rsd.layers[il];
    const auto & p  = rsd.pools[lr.pool];

    std::vector<int32_t> ids(ggml_nelements(t));
    ggml_backend_tensor_get(t, ids.data(), 0, ids.size()*sizeof(int32_t));

    // the layer's distinct experts in first-use order (token by token, route by route)
    std::vector<int32_t> distinct;
    std::vector<uint8_t> seen(p.n_expert, 0);
    for (int32_t v : ids) {
        GGML_ASSERT(v >= 0 && v < p.n_used*p.n_expert);
        const int32_t e = (int32_t) (v % p.n_expert);
        if (!seen[e]) {
            seen[e] = 1;
            distinct.push_back(e);
        }
    }

    std::vector<llama_residency_move> moves;
    std::set<int> dirty;
    llama_residency_counts c;
    if (pol.params.policy == LLAMA_RESIDENCY_POLICY_LRU) {
        c = pol.lru_serve(il, distinct, moves, dirty);
    } else {
        if (!inp.started) {
            pol.decay_boundary(moves, dirty, inp.swapped); // the token boundary: swaps the last step earned
        }
        c = pol.decay_record(il, distinct, inp.swapped.count(il) > 0);
    }
    inp.started = true;

    residency_copy_moves(inp, moves);
    for (int l : dirty) {
        residency_write_tables(rsd, l, pol.slot_of[l]);
    }
    pol.n_hits   += c.hits;
    pol.n_misses += c.misses;

    if (pol.log) {
        std::string ex;
        for (size_t i = 0; i < distinct.size(); ++i) {
            ex += (i ? "," : "") + std::to_string(distinct[i]);
        }
        fprintf(pol.log, "%" PRIu64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%d\t%d\tcache\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%s\n",
                inp.pass, inp.pos0, inp.n_tokens, (int64_t) ids.size()/p.n_used, il, lr.pool,
                c.hits, c.misses, c.evictions, c.admissions, ex.c_str());
        fflush(pol.log);
    }
}

static bool residency_eval_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto * inp = static_cast<llm_graph_input_residency *>(user_data);
    auto it = inp->upload_nodes.find(t);
    if (it != inp->upload_nodes.end()) {
        if (!ask) {
            residency_upload(*inp, t, it->second);
        }
        return true; // our own node: the user's callback does not see it
    }
    auto ic = inp->cache_nodes.find(t);
    if (ic != inp->cache_nodes.end()) {
        if (!ask) {
            residency_cache_serve(*inp, t, ic->second);
        }
        return true;
    }
    if (inp->cb_user == nullptr) {
        return false;
    }
    return inp->cb_user(t, ask, inp->cb_user_data);
}

void llama_residency_after_build(
        const llama_residency * rsd,
           llm_graph_result & res,
       ggml_backend_sched_t   sched,
  ggml_backend_sched_eval_callback cb_user,
                       void * cb_user_data) {
    if (rsd == nullptr) {
        return;
    }
    auto * inp = residency_input_get(&res);
    if (inp != nullptr) {
        for (auto & b : inp->branch_nodes) {
            b.backend = residency_backend_for(sched, b.dev); // the backend the split path's hot_wait synchronizes
        }
        inp->sched = sched; // (borrowed memory: the backends to wait for before the tables change)
    }
    if (inp == nullptr || (inp->upload_nodes.empty() && inp->cache_nodes.empty())) {
        ggml_backend_sched_set_eval_callback(sched, cb_user, cb_user_data);
        return;
    }
    inp->sched        = sched;
    inp->cb_user      = cb_user;
    inp->cb_user_data = cb_user_data;
    ggml_backend_sched_set_eval_callback(sched, residency_eval_cb, inp);
}

//
// public API
//

bool llama_residency_after_compute(const llama_residency * rsd, llm_graph_result & res, ggml_backend_sched_t sched) {
    if (rsd == nullptr || rsd->hosts.empty()) {
        return true;
    }
    auto * inp = residency_input_get(&res);
    if (inp == nullptr || inp->host_graphs.empty()) {
        return true;
    }
    ggml_backend_sched_synchronize(sched);
    bool ok = true;
    for (auto & hg : inp->host_graphs) {
        std::string err;
        if (!hg.host->finish(err)) {
            LLAMA_LOG_ERROR("%s: --residency-graph step: %s (bound: --residency-worker-timeout); the step fails, and later "
                            "decode steps compute on per-segment graphs\n", __func__, err.c_str());
            ok = false;
        }
    }
    return ok;
}

int32_t llama_model_load_residency(struct llama_model * model, const char * path_plan, uint32_t n_upload_min) {
    if (path_plan == nullptr || path_plan[0] == '\0') {
        model->residency.reset();
        return 0;
    }
    llama_residency * rsd = llama_residency_load(*model, path_plan, n_upload_min);
    if (rsd == nullptr) {
        return -1;
    }
    model->residency.reset(rsd);
    return 0;
}

int32_t llama_model_residency_set_prefill_native(struct llama_model * model, bool native) {
    if (model->residency == nullptr || (native && model->residency->borrow)) {
        return -1;
    }
    model->residency->prefill_native = native;
    LLAMA_LOG_INFO("%s: %s\n", __func__, native
            ? "passes of more than one token take llama.cpp's native path (resident experts used by single-token passes only)"
            : "passes of more than one token take the split or upload path");
    return 0;
}

int32_t llama_model_residency_set_overlap(struct llama_model * model, bool overlap) {
    if (model->residency == nullptr) {
        return -1;
    }
    model->residency->overlap = overlap;
    LLAMA_LOG_INFO("%s: %s\n", __func__, overlap
            ? "split-path passes overlap their branches (the CPU computes the cold routes while the GPU computes the resident ones)"
            : "split-path passes compute their branches in turn (the GPU's, then the CPU's)");
    return 0;
}

int32_t llama_model_residency_set_timers(struct llama_model * model, bool on) {
    if (model->residency == nullptr) {
        return -1;
    }
    auto & rsd = *model->residency;
    if (on == (rsd.timers != nullptr)) {
        return 0;
    }
    if (!on) {
        rsd.timers.reset(); // (the graphs built since they were turned on point to their slots: before any context)
        return 0;
    }
    auto t = std::make_unique<llama_residency_timers>();
    t->slots.resize(rsd.layers.size());
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        t->slots[il].owner = t.get();
        t->slots[il].layer = (int) il;
    }
    t->layer_first = rsd.il_first;
    rsd.timers = std::move(t);
    LLAMA_LOG_INFO("%s: split-path passes time their GPU and CPU branches per layer (the branches run one after the other)\n", __func__);
    return 0;
}

int32_t llama_model_residency_timings(const struct llama_model * model, uint64_t after_pass,
                                      struct llama_residency_timing * out, int32_t n_max) {
    if (model->residency == nullptr || model->residency->timers == nullptr || n_max < 0) {
        return -1;
    }
    auto & t = *model->residency->timers;
    std::lock_guard<std::mutex> lock(t.mutex);
    // records are in pass order: the first one after `after_pass`
    auto it = std::upper_bound(t.records.begin(), t.records.end(), after_pass,
                               [](uint64_t p, const llama_residency_timing & r) { return p < r.pass; });
    int32_t n = 0;
    for (; it != t.records.end() && n < n_max; ++it) {
        out[n++] = *it;
    }
    return n;
}

struct llama_residency_policy_params llama_residency_policy_default_params(void) {
    llama_residency_policy_params p = {};
    p.policy     = LLAMA_RESIDENCY_POLICY_STATIC;
    p.max_pass   = 32;
    p.decay      = 0.95;
    p.hysteresis = 0.25;
    p.admit      = 1;
    p.log_path   = nullptr;
    return p;
}

int32_t llama_model_residency_set_policy(struct llama_model * model, const struct llama_residency_policy_params * params) {
    if (model->residency == nullptr) {
        LLAMA_LOG_ERROR("%s: an expert policy needs a residency plan (its pools)\n", __func__);
        return -1;
    }
    llama_residency & rsd = *model->residency;
    const auto & pp = *params;
    const bool has_log = pp.log_path != nullptr && pp.log_path[0] != '\0';
    if (pp.policy == LLAMA_RESIDENCY_POLICY_STATIC) {
        if (has_log) {
            LLAMA_LOG_ERROR("%s: the cache log is written by the lru and decay policies only\n", __func__);
            return -1;
        }
        rsd.policy.reset();
        return 0;
    }
    if (pp.policy != LLAMA_RESIDENCY_POLICY_LRU && pp.policy != LLAMA_RESIDENCY_POLICY_DECAY) {
        LLAMA_LOG_ERROR("%s: unknown policy %d\n", __func__, pp.policy);
        return -1;
    }
    if (pp.policy == LLAMA_RESIDENCY_POLICY_LRU && pp.max_pass < 1) {
        LLAMA_LOG_ERROR("%s: lru: the largest served pass must be at least 1 token\n", __func__);
        return -1;
    }
    if (pp.policy == LLAMA_RESIDENCY_POLICY_DECAY &&
            (!(pp.decay > 0.0 && pp.decay <= 1.0) || !(pp.hysteresis >= 0.0) || !std::isfinite(pp.hysteresis))) {
        LLAMA_LOG_ERROR("%s: decay: expected decay in (0, 1] and hysteresis >= 0, got %g and %g\n", __func__, pp.decay, pp.hysteresis);
        return -1;
    }
    if (rsd.prefill_native) {
        LLAMA_LOG_ERROR("%s: the native prefill ablation and a dynamic policy cannot be combined\n", __func__);
        return -1;
    }
    if (rsd.borrow) {
        LLAMA_LOG_ERROR("%s: borrowed memory and a dynamic policy cannot be combined\n", __func__);
        return -1;
    }

    auto pol = std::make_unique<llama_residency_policy>();
    pol->params   = pp;
    pol->params.log_path = nullptr;
    pol->n_expert = rsd.pools.empty() ? 0 : (uint32_t) rsd.pools[0].n_expert;
    pol->slot_of  = rsd.slot_of;
    pol->layer_pool.resize(rsd.layers.size());
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        pol->layer_pool[il] = rsd.layers[il].pool;
    }
    pol->slot_key.resize(rsd.pools.size());
    pol->lru.resize(rsd.pools.size());
    for (size_t ip = 0; ip < rsd.pools.size(); ++ip) {
        pol->slot_key[ip].assign(rsd.pools[ip].n_slot, -1);
    }
    // the plan's experts fill the pools; the least recently used first is the plan's first slot
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        if (rsd.layers[il].pool < 0) {
            continue;
        }
        for (size_t e = 0; e < pol->slot_of[il].size(); ++e) {
            const int32_t s = pol->slot_of[il][e];
            if (s >= 0) {
                pol->slot_key[rsd.layers[il].pool][s] = (int64_t) il*pol->n_expert + e;
            }
        }
    }
    for (size_t ip = 0; ip < rsd.pools.size(); ++ip) {
        for (int64_t key : pol->slot_key[ip]) {
            pol->lru[ip].push_back(key);
            pol->lru_pos[key] = std::prev(pol->lru[ip].end());
        }
    }
    // decay: the plan's experts start with score 1 (warmed), every other expert with 0
    pol->score.assign(rsd.layers.size()*pol->n_expert, 0.0);
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        for (size_t e = 0; e < pol->slot_of[il].size(); ++e) {
            if (pol->slot_of[il][e] >= 0) {
                pol->score[il*pol->n_expert + e] = 1.0;
            }
        }
    }
    pol->last.resize(rsd.layers.size());

    if (has_log) {
        pol->log = fopen(pp.log_path, "w");
        if (pol->log == nullptr) {
            LLAMA_LOG_ERROR("%s: cannot create the cache log '%s': %s\n", __func__, pp.log_path, strerror(errno));
            return -1;
        }
        residency_log_header(pol->log);
    }
    if (pp.policy == LLAMA_RESIDENCY_POLICY_LRU) {
        LLAMA_LOG_INFO("%s: lru: passes of at most %u tokens use the pools, each missing expert uploaded on demand "
                "(least recently used out); larger passes compute as llama.cpp does\n", __func__, pp.max_pass);
    } else {
        LLAMA_LOG_INFO("%s: decay: single-token passes use the pools (missing experts on the CPU); at each token "
                "boundary up to %u swaps by decaying access counts (decay %g, hysteresis %g); larger passes compute "
                "as llama.cpp does\n", __func__, pp.admit, pp.decay, pp.hysteresis);
    }
    rsd.policy = std::move(pol);
    return 0;
}

struct llama_residency_borrow_params llama_residency_borrow_default_params(void) {
    llama_residency_borrow_params p = {};
    p.n_slot = 0;
    p.decay  = 0.95;
    p.margin = 0.25;
    p.n_admit = 4;
    return p;
}

int32_t llama_model_residency_set_borrow(struct llama_model * model, const struct llama_residency_borrow_params * params) {
    if (model->residency == nullptr) {
        LLAMA_LOG_ERROR("%s: borrowed memory needs a residency plan (its pools' staging areas)\n", __func__);
        return -1;
    }
    llama_residency & rsd = *model->residency;
    const auto & pp = *params;
    if (pp.n_slot == 0) {
        rsd.borrow.reset();
        return 0;
    }
    if (!(pp.decay > 0.0 && pp.decay <= 1.0) || !(pp.margin >= 0.0) || !std::isfinite(pp.margin) || pp.n_admit < 1) {
        LLAMA_LOG_ERROR("%s: expected decay in (0, 1], margin >= 0 and admit >= 1, got %g, %g and %u\n", __func__,
                pp.decay, pp.margin, pp.n_admit);
        return -1;
    }
    if (rsd.policy != nullptr || rsd.prefill_native) {
        LLAMA_LOG_ERROR("%s: borrowed memory works with the static policy and the split and upload paths only\n", __func__);
        return -1;
    }
    auto bw = std::make_unique<llama_residency_borrow>();
    bw->params     = pp;
    bw->n_expert   = rsd.pools.empty() ? 0 : rsd.pools[0].n_expert;
    bw->plan_slot  = rsd.slot_of;
    bw->layer_pool.resize(rsd.layers.size());
    bw->active.assign(rsd.layers.size(), std::vector<int32_t>(bw->n_expert, -1));
    bw->taken .assign(rsd.layers.size(), std::vector<int32_t>(bw->n_expert, -1));
    bw->score .assign(rsd.layers.size()*bw->n_expert, 0.0);
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        bw->layer_pool[il] = rsd.layers[il].pool;
    }
    int64_t n_total = 0;
    for (const auto & p : rsd.pools) {
        // a pool's borrowed slots are the first slots of its staging area (a layer's experts; then its zero slots)
        const int64_t n = std::min<int64_t>(pp.n_slot, p.n_expert);
        bw->pool_slots.push_back(n);
        bw->slot_key.emplace_back(n, -1);
        bw->state.emplace_back(n, (uint8_t) llama_residency_borrow::FREE);
        n_total += n;
    }
    llama_residency * r = &rsd;
    llama_residency_borrow * b = bw.get();
    bw->copy = [r, b](const llama_residency_borrow_job & job) {
        const auto & lr = r->layers[job.layer];
        const auto & p  = r->pools[job.pool];
        for (int k = 0; k < LLAMA_RESIDENCY_N_KIND; ++k) {
            const ggml_tensor * h = lr.host[k];
            if (h == nullptr) {
                continue;
            }
            // (a CUDA buffer copies on the calling thread's own stream and waits for it: the compute stream goes on)
            ggml_backend_tensor_set(p.stage[k], (const char *) h->data + (size_t) job.expert*h->nb[2],
                                    (size_t) job.slot*h->nb[2], h->nb[2]);
            b->n_bytes += h->nb[2];
        }
    };
    for (size_t il = 0; il < rsd.layers.size(); ++il) {
        if (rsd.layers[il].pool >= 0) {
            residency_write_borrow_tables(rsd, (int) il, bw->active[il]);
        }
    }
    bw->start();
    rsd.borrow = std::move(bw);
    LLAMA_LOG_INFO("%s: decode steps borrow %" PRId64 " staging slots in %zu pool(s) for the highest-scored cold experts "
            "(decay %g, margin %g, %u copies per pool and step); upload passes take them back\n", __func__, n_total,
            rsd.pools.size(), pp.decay, pp.margin, pp.n_admit);
    return 0;
}

int32_t llama_model_residency_set_graph(struct llama_model * model, bool step, int32_t n_threads, double timeout_ms) {
    if (model->residency == nullptr) {
        LLAMA_LOG_ERROR("%s: one graph per decode step needs a residency plan (its pools)\n", __func__);
        return -1;
    }
    llama_residency & rsd = *model->residency;
    rsd.hosts.clear();
    if (!step) {
        return 0;
    }
    if (n_threads < 1 || !(timeout_ms > 0.0) || !std::isfinite(timeout_ms)) {
        LLAMA_LOG_ERROR("%s: expected at least 1 thread and a timeout > 0 ms, got %d and %g\n", __func__, n_threads, timeout_ms);
        return -1;
    }
    if (rsd.policy != nullptr || rsd.timers != nullptr) {
        LLAMA_LOG_ERROR("%s: one graph per decode step works with the static policy and without the timers only\n", __func__);
        return -1;
    }
    // a channel holds one layer's cold inputs for one token (the FFN input, at most 4 activations' room, and the route
    // ids) and its output (k expert rows)
    const size_t n_embd = model->hparams.n_embd;
    const size_t n_used = model->hparams.n_expert_used_max();
    const size_t in_bytes  = 4*n_embd*sizeof(float) + 4*n_used*sizeof(int32_t) + 8*GGML_HOST_BRANCH_ALIGN;
    const size_t out_bytes = n_embd*n_used*sizeof(float);
    std::vector<ggml_backend_dev_t> devs;
    for (const auto & p : rsd.pools) {
        if (std::find(devs.begin(), devs.end(), p.dev) == devs.end()) {
            devs.push_back(p.dev);
        }
    }
    for (ggml_backend_dev_t dev : devs) {
        auto h = std::make_unique<llama_residency_host>(dev, in_bytes, out_bytes, n_threads, timeout_ms, &rsd.borrow);
        if (!h->ok()) {
            LLAMA_LOG_ERROR("%s: %s: %s\n", __func__, ggml_backend_dev_name(dev), h->start_error.c_str());
            rsd.hosts.clear();
            return -1;
        }
        // the device must run the hand-over nodes itself (else the scheduler would put them on the CPU)
        ggml_init_params ip = { 4*ggml_tensor_overhead(), nullptr, true };
        ggml_context * c = ggml_init(ip);
        ggml_tensor * x = ggml_new_tensor_1d(c, GGML_TYPE_F32, 16);
        ggml_tensor * snd = ggml_host_branch_send(c, &x, 1, &h->ch, 0);
        const bool supported = ggml_backend_dev_supports_op(dev, snd) &&
            ggml_backend_dev_supports_op(dev, ggml_host_branch_recv(c, snd, GGML_TYPE_F32, 16, 1, 1, 1));
        ggml_free(c);
        if (!supported) {
            LLAMA_LOG_ERROR("%s: %s cannot run the hand-over to a CPU worker (GGML_OP_HOST_BRANCH)\n", __func__,
                            ggml_backend_dev_name(dev));
            rsd.hosts.clear();
            return -1;
        }
        rsd.hosts.push_back(std::move(h));
    }
    // the workers' pools have threads of their own, created and placed once (ggml-ostinato.h), in every build
    LLAMA_LOG_INFO("%s: decode steps compute as one graph per device: %zu resident CPU worker(s) of %d threads take "
                   "the cold routes, %s, asleep between steps (answer within %.0f ms)\n", __func__, rsd.hosts.size(),
                   n_threads, rsd.hosts.front()->pinned ? "pinned to the first cores" :
                   "not pinned (this process may use fewer cores)", timeout_ms);
    return 0;
}

int32_t llama_model_residency_stats(const struct llama_model * model, struct llama_residency_stats * out) {
    if (model->residency == nullptr) {
        return -1;
    }
    const auto & r = *model->residency;
    out->n_resident = 0;
    out->n_upload_pass    = r.n_upload_pass;
    out->n_upload_experts = r.n_upload_experts;
    out->n_upload_bytes   = r.n_upload_bytes;
    out->t_upload_us      = r.t_upload_us;
    out->n_cache_hits       = r.policy ? r.policy->n_hits       : 0;
    out->n_cache_misses     = r.policy ? r.policy->n_misses     : 0;
    out->n_cache_admissions = r.policy ? r.policy->n_admissions : 0;
    out->n_cache_bytes      = r.policy ? r.policy->n_copy_bytes : 0;
    out->t_cache_us         = r.policy ? r.policy->t_copy_us    : 0;
    const llama_residency_borrow * bw = r.borrow.get();
    out->n_borrow_slots = 0;
    if (bw != nullptr) {
        for (int64_t n : bw->pool_slots) {
            out->n_borrow_slots += n;
        }
    }
    out->n_borrow_active         = bw ? bw->n_active.load()         : 0;
    out->n_borrow_admissions     = bw ? bw->n_admissions.load()     : 0;
    out->n_borrow_evictions      = bw ? bw->n_evictions.load()      : 0;
    out->n_borrow_reclaimed      = bw ? bw->n_reclaims.load()       : 0;
    out->n_borrow_reclaim_passes = bw ? bw->n_reclaim_passes.load() : 0;
    out->n_borrow_steps          = bw ? bw->n_steps.load()          : 0;
    out->n_borrow_steps_hit      = bw ? bw->n_steps_hit.load()      : 0;
    out->n_borrow_hits           = bw ? bw->n_hits.load()           : 0;
    out->n_borrow_cpu_routes     = bw ? bw->n_cpu_routes.load()     : 0;
    out->n_borrow_bytes          = bw ? bw->n_bytes.load()          : 0;
    out->t_borrow_us             = bw ? bw->t_copy_us.load()        : 0;
    out->t_borrow_wait_us        = bw ? bw->t_wait_us.load()        : 0;
    out->graph_step       = r.hosts.empty() ? 0 : 1;
    out->n_graph_threads  = r.hosts.empty() ? 0 : r.hosts.front()->n_threads;
    out->n_graph_branches = 0;
    out->n_graph_skipped  = 0;
    out->t_graph_cpu_us   = 0;
    out->t_graph_wait_us  = 0;
    out->t_graph_gpu_us   = 0;
    out->n_graph_routes     = 0;
    out->t_graph_compute_us = 0;
    for (int i = 0; i <= LLAMA_RESIDENCY_GRAPH_ROUTES_MAX; ++i) {
        out->n_graph_by_routes[i]    = 0;
        out->t_graph_by_routes_us[i] = 0;
    }
    for (const auto & h : r.hosts) {
        out->n_graph_branches += h->n_branches.load();
        out->n_graph_skipped  += h->n_skipped.load();
        out->t_graph_cpu_us   += h->t_cpu_us.load();
        out->t_graph_wait_us  += h->ch.waited[0] / 1000;
        out->t_graph_gpu_us   += h->ch.busy[0] / 1000;
        out->n_graph_routes     += h->n_routes.load();
        for (int i = 0; i <= LLAMA_RESIDENCY_GRAPH_ROUTES_MAX; ++i) {
            const int64_t t = h->t_by_routes_us[i].load();
            out->n_graph_by_routes[i]    += h->n_by_routes[i].load();
            out->t_graph_by_routes_us[i] += t;
            out->t_graph_compute_us      += t;
        }
    }
    for (const auto & lr : r.layers) {
        out->n_resident += lr.n_resident;
    }
    return 0;
}
