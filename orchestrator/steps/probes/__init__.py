"""Programs the product ships to run on the nodes under the node's Python (standard library and torch
only; any Python 3): they are uploaded, never imported by the controller."""
