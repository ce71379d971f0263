"""The MCP gateway (svc-gateway): every tool call an agent makes checked before it is forwarded.

``svc gateway`` serves ``/mcp/{upstream}`` (an MCP proxy per upstream MCP server, Streamable
HTTP on the agent side) and ``/mcp/challenges/{challenge_qid}`` (the challenge wait), with the
probes. Modules: ``settings`` (``SVC_GATEWAY_*``), ``tokens`` (agent tokens, RFC 7519/8693),
``service`` (checks, outage tiers, containments, intake events), ``app`` (the ASGI app and
server), ``cli``. docs/gateway.md describes it.
"""
