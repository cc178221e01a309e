"""Brokered model calls: a child's model calls, made by its parent."""
