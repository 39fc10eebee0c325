// Ostinato additions to ggml's public definitions (engine/README.md).
#pragma once

// op_params index of a MUL_MAT_ID node: non-zero marks a node whose negative ids are skipped (each gives a zero
// row) on the CPU; the CUDA backend refuses marked nodes. The resident pools' split path sets it
// (src/llama-residency.cpp); ggml-cpu.c, ggml-cuda.cu and the op tests read it.
#define GGML_MUL_MAT_ID_SKIP 15
