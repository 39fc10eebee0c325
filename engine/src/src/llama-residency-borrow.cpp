#include "llama-residency-borrow.h"

#include "ggml.h"

#include <algorithm>
#include <tuple>

llama_residency_borrow::~llama_residency_borrow() {
    {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
    }
    cv_work.notify_all();
    if (worker.joinable()) {
        worker.join();
    }
}

void llama_residency_borrow::start() {
    worker = std::thread([this] { run(); });
}

void llama_residency_borrow::run() {
    for (;;) {
        llama_residency_borrow_job job;
        {
            std::unique_lock<std::mutex> lock(mutex);
            cv_work.wait(lock, [this] { return stop || !queue.empty(); });
            if (stop) {
                return;
            }
            job = queue.front();
            queue.pop_front();
            busy = true;
        }
        const int64_t t0 = ggml_time_us();
        copy(job);
        t_copy_us += ggml_time_us() - t0;
        {
            std::lock_guard<std::mutex> lock(mutex);
            if (state[job.pool][job.slot] == LOADING) {
                state[job.pool][job.slot] = READY;
            }
            busy = false;
        }
        cv_idle.notify_all();
    }
}

void llama_residency_borrow::record(int il, const int32_t * ids_flat, int64_t n, bool decode) {
    const auto & plan = plan_slot[il];
    const auto & act  = active[il];
    bool hit = false;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t e = (int32_t) (ids_flat[i] % n_expert);
        if (plan[e] >= 0) {
            continue; // resident in the plan's pool
        }
        if (decode && act[e] >= 0) {
            hit = true;
            n_hits++;
            continue;
        }
        score[(size_t) il*n_expert + e] += 1.0; // computed on the CPU
        n_cpu_routes++;
    }
    if (hit && step_hit != step) {
        step_hit = step;
        n_steps_hit++;
    }
}

void llama_residency_borrow::boundary(std::set<int> & dirty) {
    step++;
    n_steps++;
    {
        // the copies queued at the last boundary join now, whatever the timing (waiting for them if they are not
        // done): the same routing gives the same tables at every step, so runs compute bitwise the same
        std::unique_lock<std::mutex> lock(mutex);
        const int64_t t0 = ggml_time_us();
        cv_idle.wait(lock, [this] { return queue.empty() && !busy; });
        t_wait_us += ggml_time_us() - t0;
        for (size_t ip = 0; ip < state.size(); ++ip) {
            for (size_t s = 0; s < state[ip].size(); ++s) {
                if (state[ip][s] != READY) {
                    continue;
                }
                state[ip][s] = ACTIVE;
                const int64_t key = slot_key[ip][s];
                const int     il  = (int) (key / n_expert);
                active[il][key % n_expert] = (int32_t) s;
                dirty.insert(il);
                n_admissions++;
                n_active++;
            }
        }
    }
    for (double & s : score) {
        s *= params.decay;
    }
    bool queued = false;
    for (size_t ip = 0; ip < pool_slots.size(); ++ip) {
        if (pool_slots[ip] == 0) {
            continue;
        }
        // the pool's cold experts that no slot holds yet, highest score first (ties: lower layer, lower expert)
        std::vector<std::tuple<double, int, int32_t>> cand;
        for (size_t il = 0; il < layer_pool.size(); ++il) {
            if (layer_pool[il] != (int) ip) {
                continue;
            }
            for (int32_t e = 0; e < (int32_t) n_expert; ++e) {
                const double sc = score[il*n_expert + e];
                if (sc > 0.0 && plan_slot[il][e] < 0 && taken[il][e] < 0) {
                    cand.emplace_back(sc, (int) il, e);
                }
            }
        }
        const size_t n_top = std::min(cand.size(), (size_t) params.n_admit);
        auto better = [](const auto & a, const auto & b) {
            if (std::get<0>(a) != std::get<0>(b)) {
                return std::get<0>(a) > std::get<0>(b);
            }
            return std::make_pair(std::get<1>(a), std::get<2>(a)) < std::make_pair(std::get<1>(b), std::get<2>(b));
        };
        std::partial_sort(cand.begin(), cand.begin() + n_top, cand.end(), better);
        auto & keys = slot_key[ip];
        for (size_t i = 0; i < n_top; ++i) {
            const auto [sc, il, e] = cand[i];
            int slot = -1;
            for (size_t s = 0; s < keys.size(); ++s) {
                if (keys[s] < 0) {
                    slot = (int) s;
                    break;
                }
            }
            if (slot < 0) {
                // full: the lowest-scored borrowed expert in the tables makes way only for a clearly higher one
                int low = -1;
                double low_sc = 0.0;
                for (size_t s = 0; s < keys.size(); ++s) {
                    if (state[ip][s] != ACTIVE) {
                        continue;
                    }
                    const double v = score[(size_t) keys[s]];
                    if (low < 0 || v < low_sc) {
                        low = (int) s;
                        low_sc = v;
                    }
                }
                if (low < 0 || !(sc > (1.0 + params.margin)*low_sc)) {
                    break; // candidates come in falling score: no later one is clearly higher
                }
                const int64_t old = keys[low];
                const int     ol  = (int) (old / n_expert);
                active[ol][old % n_expert] = -1;
                taken [ol][old % n_expert] = -1;
                dirty.insert(ol);
                n_evictions++;
                n_active--;
                slot = low;
            }
            keys[slot] = (int64_t) il*n_expert + e;
            taken[il][e] = slot;
            {
                std::lock_guard<std::mutex> lock(mutex);
                state[ip][slot] = LOADING;
                queue.push_back({(int) ip, slot, il, e});
            }
            queued = true;
        }
    }
    if (queued) {
        cv_work.notify_one();
    }
}

void llama_residency_borrow::reclaim(std::set<int> & dirty) {
    {
        std::unique_lock<std::mutex> lock(mutex);
        queue.clear();
        cv_idle.wait(lock, [this] { return !busy; });
        for (auto & st : state) {
            std::fill(st.begin(), st.end(), (uint8_t) FREE);
        }
    }
    uint64_t n = 0;
    for (auto & keys : slot_key) {
        for (int64_t & key : keys) {
            if (key < 0) {
                continue;
            }
            const int il = (int) (key / n_expert);
            if (active[il][key % n_expert] >= 0) {
                dirty.insert(il);
            }
            active[il][key % n_expert] = -1;
            taken [il][key % n_expert] = -1;
            key = -1;
            n++;
        }
    }
    if (n > 0) {
        n_reclaims += n;
        n_reclaim_passes++;
    }
    n_active = 0;
}
