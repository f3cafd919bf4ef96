"""The bundled skill (markdown), served as MCP resources and prompts."""
