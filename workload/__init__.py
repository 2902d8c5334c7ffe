"""The bundled PyTorch inference server, load generator and fault switches."""
