"""Benchmarks and their sample data (run them with ``python -m croqq.bench.<name>``)."""
