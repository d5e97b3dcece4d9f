"""Running groups of a net's nodes in processes of their own."""
