"""The distributed engine: Celery app, Redis keys, step ledger, leases, coordinator, tasks, housekeeping."""
