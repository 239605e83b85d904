"""Delivery: Redis keys, the step ledger (exactly-once application of at-least-once messages), leases,
message models, queue names, the Redis client and a shape's live state."""
