"""The framework that serves tools over MCP, apart from the tools it serves (`perfgate.tools`).

- `spec`: what a tool module declares (``ToolSpec``); `runtime`: what a tool gets for one call (the
  workspace, the ledger, path confinement, progress); `globs`: glob patterns expanded inside the
  workspace only;
- `adapter`: a spec turned into the tool the MCP SDK registers, with `lean` (the input schemas
  ``tools/list`` carries), `gating` (the approval gate of tools that run commands), `answer` (the text an
  agent reads) and `failures` (argument errors and crashes in words);
- `catalog`: tools listed from the generated catalog and imported on their first call;
- `config` (the server-wide settings) and `state` (what lives as long as the server).

Nothing here imports a tool: the server hands the registry's specs in, and the catalog imports a tool's
module by the name the generated index gives. The package itself imports nothing, so the command line
can read `config` before anything else loads.
"""
