"""Benchmarks of engine configurations on one machine (prefill by size, decode), compared within one run."""
