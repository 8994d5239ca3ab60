"""Benchmark: datasets and (with its issue) the runner, metrics, peers and reports."""
