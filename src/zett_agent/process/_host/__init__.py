"""The host's side of the engine: pool, dispatch, supervisor, channels, jobs, executors."""
