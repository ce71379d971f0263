"""svc-connectors: resources from Google Drive and work items from Jira into the context service.

docs/connectors.md describes it; ``svc.connectors.service.ConnectorsService`` is the logic,
``svc.connectors.app`` the probes and the process, ``svc.connectors.cli`` the command.
"""
