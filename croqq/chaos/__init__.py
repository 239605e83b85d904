"""Chaos: fault injection, the stress harness and the invariant checks. The runtime never imports it."""
