"""OTLP export: windows and detector state as metrics, regressions as log records (docs/otlp.md)."""
