// Ostinato additions to llama-server (engine/README.md, "A server a local agent can use"): routing trace paths of
// requests confined to --routing-dir, and the watchdog that /health reads.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

// The path a request names, resolved under dir: relative, without "..", and, after symlinks are resolved, still
// inside dir. Returns false with err set otherwise (or when dir is empty: the field is then refused).
inline bool ostinato_routing_path(const std::string & dir, const std::string & rel, std::string & out, std::string & err) {
    namespace fs = std::filesystem;
    out.clear();
    if (rel.empty()) {
        return true;
    }
    if (dir.empty()) {
        err = "this server takes no routing trace paths from requests: start it with --routing-dir DIR to allow them";
        return false;
    }
    const fs::path p(rel);
    if (p.is_absolute()) {
        err = "routing trace '" + rel + "': expected a path relative to --routing-dir";
        return false;
    }
    for (const auto & part : p) {
        if (part == "..") {
            err = "routing trace '" + rel + "': '..' is not allowed";
            return false;
        }
    }
    std::error_code ec;
    const fs::path base = fs::weakly_canonical(fs::path(dir), ec);
    if (ec) {
        err = "--routing-dir '" + dir + "': " + ec.message();
        return false;
    }
    const fs::path full = fs::weakly_canonical(base / p, ec);
    if (ec) {
        err = "routing trace '" + rel + "': " + ec.message();
        return false;
    }
    const fs::path inside = full.lexically_relative(base);
    if (inside.empty() || *inside.begin() == "..") {
        err = "routing trace '" + rel + "' resolves outside --routing-dir";
        return false;
    }
    out = full.string();
    return true;
}

// The watchdog: when the server loop entered its current iteration (0 when it is not inside one), so that /health
// reports a loop that has not come back for longer than --health-stuck-s.
inline std::atomic<int64_t> & ostinato_loop_since_us() {
    static std::atomic<int64_t> since{0};
    return since;
}

inline int64_t ostinato_now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// seconds the loop has been inside its current iteration (0 when it is between iterations)
inline double ostinato_loop_busy_s() {
    const int64_t since = ostinato_loop_since_us().load();
    return since == 0 ? 0.0 : (ostinato_now_us() - since) / 1e6;
}

// Fault injection for the tests of the watchdog: OSTINATO_FAULT_STEP_DELAY_MS=N makes every step of the server loop
// take N ms longer (read once; unset in normal use).
inline int64_t ostinato_fault_step_delay_ms() {
    static const int64_t ms = [] {
        const char * v = std::getenv("OSTINATO_FAULT_STEP_DELAY_MS");
        return v ? std::max<int64_t>(0, std::atoll(v)) : 0;
    }();
    return ms;
}

struct ostinato_loop_guard {
    ostinato_loop_guard() {
        ostinato_loop_since_us().store(ostinato_now_us());
        if (ostinato_fault_step_delay_ms() > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ostinato_fault_step_delay_ms()));
        }
    }
    ~ostinato_loop_guard() { ostinato_loop_since_us().store(0); }
};
