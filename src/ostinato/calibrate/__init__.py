"""Calibration: the cost model's constants measured on this machine with the `ostinato` engine and forced routing."""
