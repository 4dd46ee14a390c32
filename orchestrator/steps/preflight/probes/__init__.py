"""Python scripts the preflight runs on nodes (read as text, passed to the node's interpreter)."""
