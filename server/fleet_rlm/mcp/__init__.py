"""MCP face of fleet-rlm: tools, resources and prompts over the Engine (see ``server.build_server``)."""
