"""Benchmarks (not tests): each prints a table and writes JSON to bench/results/."""
