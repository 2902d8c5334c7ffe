"""The infersight daemon: config, targets, collection loop, store, metrics, alerts, CLI."""
