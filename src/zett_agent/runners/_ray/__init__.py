"""Children as Ray tasks: the parts behind zett_agent.runners.ray."""
