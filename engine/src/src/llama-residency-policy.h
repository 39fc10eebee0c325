// Expert policies on the resident pools: which experts sit in the pool slots and which passes use them.
//
//   static: the plan's experts, for the whole run (Ostinato);
//   lru:    one cache per pool (a GPU's layers of one expert size), least recently used out; passes of at most
//           max_pass tokens upload each missing expert on demand and compute every route from the pool; larger
//           passes compute as llama.cpp does (the expert cache of llama.cpp as the paper describes it);
//   decay:  per-expert scores that decay every decode step and grow with every route; decode steps compute the
//           cached experts from the pool and the others on the CPU; at the next token boundary up to `admit` layers
//           swap their lowest-scored cached expert for the highest-scored one the step missed, when it scores more
//           than (1 + hysteresis) times as much (buun's cache); passes of more than one token compute as llama.cpp.
//
// The decisions here are plain bookkeeping on host memory; src/llama-residency.cpp copies the experts and writes
// the index tables they imply. src/ostinato/residency/caches.py is the Python reference of the same rules.
#pragma once

#include "llama-ostinato.h"

#include <cstdint>
#include <cstdio>
#include <list>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

struct llama_residency_counts {
    int64_t hits       = 0; // distinct experts of the layer's pass found in the pool
    int64_t misses     = 0; // distinct experts not found
    int64_t evictions  = 0; // experts removed from the pool (lru) or swapped out (decay)
    int64_t admissions = 0; // experts put into the pool
};

// an expert that now sits in a slot and must be copied there
struct llama_residency_move {
    int     layer;
    int32_t expert;
    int32_t slot;
};

struct llama_residency_policy {
    llama_residency_policy_params params = {};
    uint32_t n_expert = 0;

    std::vector<int> layer_pool;                    // [layer] -> pool, -1 without one
    std::vector<std::vector<int32_t>> slot_of;      // [layer][expert] -> slot of its pool, -1 if not there
    std::vector<std::vector<int64_t>> slot_key;     // [pool][slot] -> layer*n_expert + expert, -1 if free

    // lru: keys least recently used first, per pool
    std::vector<std::list<int64_t>> lru;
    std::unordered_map<int64_t, std::list<int64_t>::iterator> lru_pos;

    // decay: score per (layer, expert); the row each layer routed in the last decode step
    std::vector<double> score;
    std::vector<std::vector<int32_t>> last;

    // the cache log (--residency-cache-log) and the pass counter
    FILE *   log    = nullptr;
    uint64_t n_pass = 0;

    // statistics (llama_model_residency_stats)
    uint64_t n_hits = 0, n_misses = 0, n_admissions = 0, n_copy_bytes = 0;
    int64_t  t_copy_us = 0;

    ~llama_residency_policy();

    // whether a pass of n_tokens uses the pool (else it computes as llama.cpp does)
    bool serves(int64_t n_tokens) const;

    // lru: one layer's pass, its distinct experts in first-use order; moves: the experts to copy into the pool;
    // dirty: the layers whose tables changed
    llama_residency_counts lru_serve(int il, const std::vector<int32_t> & distinct,
            std::vector<llama_residency_move> & moves, std::set<int> & dirty);

    // decay: a token boundary (the swaps the last step earned, as moves; swapped: their layers), then the decay
    void decay_boundary(std::vector<llama_residency_move> & moves, std::set<int> & dirty, std::set<int> & swapped);
    // decay: one layer's decode row (distinct experts); counts against the pool after the boundary's swaps
    llama_residency_counts decay_record(int il, const std::vector<int32_t> & row, bool swapped);
};

// "static", "lru" or "decay"; LLAMA_RESIDENCY_POLICY_STATIC .. DECAY, -1 if unknown
int32_t llama_residency_policy_from_name(const std::string & name);
const char * llama_residency_policy_name(int32_t policy);
