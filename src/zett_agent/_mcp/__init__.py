"""``zett-agent mcp``: background child agents served to MCP clients, over stdio or HTTP.

The modules that serve import the ``mcp`` SDK (the optional extra ``mcp``); ``_cli``,
``_load`` and ``_watch``, and everything ``zett_agent.cli`` imports for other commands, stay
free of it.
"""
