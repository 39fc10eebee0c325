#include "llama-residency-policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>

llama_residency_policy::~llama_residency_policy() {
    if (log) {
        fclose(log);
    }
}

int32_t llama_residency_policy_from_name(const std::string & name) {
    if (name == "static") {
        return LLAMA_RESIDENCY_POLICY_STATIC;
    }
    if (name == "lru") {
        return LLAMA_RESIDENCY_POLICY_LRU;
    }
    if (name == "decay") {
        return LLAMA_RESIDENCY_POLICY_DECAY;
    }
    return -1;
}

const char * llama_residency_policy_name(int32_t policy) {
    switch (policy) {
        case LLAMA_RESIDENCY_POLICY_STATIC: return "static";
        case LLAMA_RESIDENCY_POLICY_LRU:    return "lru";
        case LLAMA_RESIDENCY_POLICY_DECAY:  return "decay";
        default:                            return "unknown";
    }
}

bool llama_residency_policy::serves(int64_t n_tokens) const {
    switch (params.policy) {
        case LLAMA_RESIDENCY_POLICY_LRU:   return n_tokens <= (int64_t) params.max_pass;
        case LLAMA_RESIDENCY_POLICY_DECAY: return n_tokens == 1;
        default:                           return true;
    }
}

llama_residency_counts llama_residency_policy::lru_serve(int il, const std::vector<int32_t> & distinct,
        std::vector<llama_residency_move> & moves, std::set<int> & dirty) {
    llama_residency_counts c;
    const int ip = layer_pool[il];
    auto & order = lru[ip];
    auto & keys  = slot_key[ip];
    std::vector<int32_t> admitted;

    for (int32_t e : distinct) {
        const int64_t key = (int64_t) il*n_expert + e;
        auto it = lru_pos.find(key);
        if (it != lru_pos.end()) {
            order.splice(order.end(), order, it->second); // most recently used
            c.hits++;
            continue;
        }
        c.misses++;
        if (keys.empty()) {
            continue; // a pool without slots: the route stays on the CPU
        }
        int32_t slot = -1;
        for (size_t s = 0; s < keys.size() && order.size() < keys.size(); ++s) {
            if (keys[s] < 0) {
                slot = (int32_t) s; // a free slot
                break;
            }
        }
        if (slot < 0) {
            const int64_t victim = order.front();
            order.pop_front();
            lru_pos.erase(victim);
            const int vl = (int) (victim / n_expert);
            const int32_t ve = (int32_t) (victim % n_expert);
            slot = slot_of[vl][ve];
            slot_of[vl][ve] = -1;
            dirty.insert(vl);
            c.evictions++;
        }
        keys[slot] = key;
        slot_of[il][e] = slot;
        order.push_back(key);
        lru_pos[key] = std::prev(order.end());
        admitted.push_back(e);
        c.admissions++;
    }
    // copy the admitted experts that are still in the pool at the end of the layer's pass (with fewer slots than
    // distinct experts, an expert admitted early can be evicted by a later one: the CPU then computes it)
    for (int32_t e : admitted) {
        if (slot_of[il][e] >= 0) {
            moves.push_back({il, e, slot_of[il][e]});
        }
    }
    if (c.admissions > 0 || c.evictions > 0) {
        dirty.insert(il);
    }
    return c;
}

void llama_residency_policy::decay_boundary(std::vector<llama_residency_move> & moves, std::set<int> & dirty,
        std::set<int> & swapped) {
    // per layer that routed in the last step: its best missed expert against its worst cached one
    std::vector<std::tuple<double, int, int32_t, int32_t>> gains; // gain, layer, victim, best
    for (size_t il = 0; il < last.size(); ++il) {
        const auto & row = last[il];
        if (row.empty()) {
            continue;
        }
        const double * sc = score.data() + il*n_expert;
        int32_t best = -1;
        for (int32_t e : row) {
            if (slot_of[il][e] >= 0) {
                continue;
            }
            if (best < 0 || sc[e] > sc[best] || (sc[e] == sc[best] && e < best)) {
                best = e;
            }
        }
        int32_t victim = -1;
        for (uint32_t e = 0; e < n_expert; ++e) {
            if (slot_of[il][e] >= 0 && (victim < 0 || sc[e] < sc[victim])) {
                victim = (int32_t) e;
            }
        }
        if (best < 0 || victim < 0) {
            continue;
        }
        if (sc[best] > sc[victim] * (1.0 + params.hysteresis)) {
            gains.emplace_back(sc[best] - sc[victim], (int) il, victim, best);
        }
    }
    // the largest gains first; equal gains: the lower layer first
    std::sort(gains.begin(), gains.end(), [](const auto & a, const auto & b) {
        if (std::get<0>(a) != std::get<0>(b)) {
            return std::get<0>(a) > std::get<0>(b);
        }
        return std::get<1>(a) < std::get<1>(b);
    });
    for (size_t i = 0; i < gains.size() && i < params.admit; ++i) {
        const auto [g, il, victim, best] = gains[i];
        (void) g;
        const int32_t slot = slot_of[il][victim];
        slot_of[il][victim] = -1;
        slot_of[il][best]   = slot;
        slot_key[layer_pool[il]][slot] = (int64_t) il*n_expert + best;
        moves.push_back({il, best, slot});
        dirty.insert(il);
        swapped.insert(il);
    }
    for (auto & row : last) {
        row.clear();
    }
    for (double & s : score) {
        s *= params.decay;
    }
}

llama_residency_counts llama_residency_policy::decay_record(int il, const std::vector<int32_t> & row, bool swapped) {
    llama_residency_counts c;
    for (int32_t e : row) {
        if (slot_of[il][e] >= 0) {
            c.hits++;
        } else {
            c.misses++;
        }
        score[(size_t) il*n_expert + e] += 1.0;
    }
    last[il] = row;
    c.evictions  = swapped ? 1 : 0;
    c.admissions = swapped ? 1 : 0;
    return c;
}
