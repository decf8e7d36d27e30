"""Executors (numpy reference, CUDA), the kernel registry and the measurement database."""
