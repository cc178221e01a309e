"""``zett-agent mcp``: the background task tools served to any MCP client over stdio.

Only ``_server`` imports the ``mcp`` SDK (the optional extra ``mcp``); the rest of this package,
and everything ``zett_agent.cli`` imports for other commands, stays free of it.
"""
