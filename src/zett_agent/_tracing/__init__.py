"""The runtime's spans: their vocabulary, the tracer in use, OpenTelemetry, a child's records."""
