"""Benchmarks of the control plane; `python bench/run.py --help` says what they measure."""
