"""The input-length sweep of Figure 7b: TTFT by new tokens after a prefix and decode TPOT of engine presets at equal GPU memory for experts, compared within one run."""
