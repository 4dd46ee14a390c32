"""Python scripts run on nodes to gather facts (read as text, passed to the node's interpreter)."""
