"""User-space sources of a Window: py-spy stacks, server latency, process counters, GPU."""
