"""Monitoring: the Prometheus collector over the cluster's Redis state and the exporter that serves it."""
