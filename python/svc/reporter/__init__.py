"""svc-reporter: the once-a-minute heartbeat of fixed-schema health numbers (docs/reporter.md).

``svc.reporter.service.Reporter`` is the logic, ``heartbeat.schema.json`` the schema,
``svc.reporter.app`` the probes and the process, ``svc.reporter.cli`` the command.
"""
