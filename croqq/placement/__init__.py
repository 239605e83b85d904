"""Placement: which GPU holds which shape (assignment, quarantine, migration) and the GPU and worker
registries it decides from."""
