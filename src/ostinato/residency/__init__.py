"""Offline residency planning: routing profiles, the capacity test, the frequency-ranked planner, plan files."""
