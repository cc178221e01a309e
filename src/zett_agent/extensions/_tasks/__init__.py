"""AsyncSubAgentExtension's background tasks: registry, start, tools, watch, store."""
