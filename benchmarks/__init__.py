"""Benchmarks of the agent's own cost (`infersight bench overhead|soak`): programs, not tests."""
