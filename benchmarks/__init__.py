"""Benchmarks of croqq (``python -m benchmarks``; see benchmarks/README.md). Not part of the installed
package: they run from a checkout, whose root is on ``sys.path``, and take test infrastructure from
``tests``."""
