"""cluster-bootstrap: turn machines on a LAN into one PyTorch training cluster."""

__version__ = "0.1.0"
