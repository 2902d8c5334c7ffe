"""BPF probes, one per file: BCC C text plus a small Python class (start/read/stop/health)."""
