"""The kernel every layer stands on: errors and their canonical codes, the one status mapping,
settings, deadlines, retry, memory, logs, tracing and offloading to a child process. Imports
nothing of tfservo above it (tests/test_package_graph.py checks)."""
