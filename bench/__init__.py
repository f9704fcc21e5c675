"""Benchmarks behind `make bench`; results land in docs/benchmarks.md with the command that made them."""
