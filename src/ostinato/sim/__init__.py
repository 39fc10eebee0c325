"""Trace-driven simulator: replays sessions and their routing through the cost model of each engine policy."""
