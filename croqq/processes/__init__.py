"""Processes: the Celery app and tasks, starting each role (boot), supervision, the embedded Redis, the
local cluster and each process's runtime context."""
