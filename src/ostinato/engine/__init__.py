"""Engine build: the pinned llama.cpp source, the patch series, and the staged CMake build of the variants."""
