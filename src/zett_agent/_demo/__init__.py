"""``zett-agent demo``: background child agents in their own processes, live."""
