"""Routing traces: per token position and MoE layer, the k experts selected (format shared with the engine)."""
