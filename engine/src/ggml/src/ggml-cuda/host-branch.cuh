// ostinato: GGML_OP_HOST_BRANCH on CUDA (ggml-ostinato.h)
#include "common.cuh"

void ggml_cuda_op_host_branch(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
