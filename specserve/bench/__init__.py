"""Benchmark: datasets and workloads, the runner, metrics, costs, peers, replay, profile and reports."""
