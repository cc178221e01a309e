"""The agent loop: the agent, its requests, turns, hooks, model calls and tool batches."""
