"""The demo company and its traffic: the demo job of docs/architecture.md#components.

``svc demo`` and ``svc up --demo`` use three steps, one module each (docs/demo.md):

* ``svc.demo.company``: ``generate(seed, people)`` builds a synthetic organization (people in
  departments with managers and groups, AI and non-AI service accounts with owners, documents,
  tickets, customers and work items); ``write_bundle`` writes its policy bundle, whose policies
  exercise every verdict, challenge kind and plan outcome; ``provision`` loads work items,
  containments and risk scores into a decision point's engine.
* ``svc.demo.traffic``: ``drive(company, pdp_url, intake_url, token)`` sends checks, AuthZEN
  evaluations, paged plans, list reports and app events over HTTP and returns a ``DriveReport``.
* ``svc.demo.summary``: ``summarize(client, report)`` reads the history store back and prints
  what it holds; ``history_counts(client)`` for waiting until the loader caught up.
"""

from svc.demo.company import Company, generate, provision, write_bundle

__all__ = ["Company", "generate", "provision", "write_bundle"]
