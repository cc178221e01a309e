"""The frames between the host and its workers: protocol, encoding, decoding."""
