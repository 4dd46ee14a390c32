"""One module per job the product does on nodes."""
