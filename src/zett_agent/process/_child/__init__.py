"""What runs in the launcher and the workers (it imports nothing heavy)."""
