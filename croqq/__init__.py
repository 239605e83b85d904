"""croqq: a distributed control plane for non-stop GPU kernel tuning."""

__version__ = "0.1.0"
