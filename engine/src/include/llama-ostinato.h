// Ostinato additions to the llama.cpp public API (see engine/README.md).
#pragma once

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

    // Routing traces: for every token position and layer, the experts the MoE router selected.
    //
    // path_record: write the selection of every computed token position to this trace file
    //              (created or truncated; rows are indexed by token position).
    // path_force:  make every MoE layer use the experts of this trace file instead of its own
    //              top-k (teacher-forced routing); the routing weights are still the router's
    //              probabilities at the forced experts.
    // Either may be NULL or "" to turn it off. Both may be set: then the recorded trace repeats
    // the forced one. Positions are those of the single sequence the context serves.
    // Returns 0 on success, -1 if a file cannot be opened or does not match the model.
    LLAMA_API int32_t llama_set_routing_files(
            struct llama_context * ctx,
                      const char * path_record,
                      const char * path_force);

#ifdef __cplusplus
}
#endif
