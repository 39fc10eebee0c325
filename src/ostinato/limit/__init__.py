"""The cache limit of seed 004 (Belady's MIN with bypass): fewest host expert reads for a GPU cache of a given size."""

from ostinato.limit.belady import (LimitResult, belady_min_bypass, limit_for_trace, lru_reads, next_use,
                                   request_keys)

__all__ = ["LimitResult", "belady_min_bypass", "limit_for_trace", "lru_reads", "next_use", "request_keys"]
