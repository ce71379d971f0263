"""The decision point's in-process engine (docs/decisions.md).

`Engine` wraps the Rust decision core: a Cedar policy bundle plus an in-memory entity store
(principals, groups, service accounts, resources, work items, containments, risk scores),
each replaced atomically while checks run.

Example::

    from svc.pdp import Engine
    engine = Engine.from_bundle_dir("examples/bundles/acme")
    engine.evaluate({"principal": {"type": "Human", "id": "alice"},
                     "action": "view",
                     "resource": {"type": "Document", "id": "roadmap"}})
    # {'qid': '019...', 'verdict': 'allow', 'challenges': [], 'policies': [...], 'mode': 'enforce'}

`Server` serves an engine over gRPC and HTTP on one port (docs/api.md); `svc.pdp.server` runs it
in standalone mode over one bundle directory (`svc pdp --bundle DIR`).

What the engine returns is typed (`svc.pdp.shapes`, re-exported here): `evaluate` and
`evaluate_many` give `Decision`s, `decide` a `DecisionRecord`, `plan` a `Plan` whose `filter`
is a `FilterNode` tree (docs/api.md, docs/history.md#schema, docs/plans.md). They are
`TypedDict`s: plain dicts at run time, checked by mypy.

Errors: `BundleError` (a bundle does not load; `.errors` lists every problem with file, line
and column) and `RequestError` (a `ValueError`; `.field` names the request field at fault).
"""

from svc._pdp_core import BundleError, Engine, RequestError, Server, set_limits
from svc.pdp.shapes import (
    Comparison,
    Decision,
    DecisionRecord,
    EntityRef,
    FilterCompare,
    FilterConst,
    FilterContains,
    FilterContainsSet,
    FilterEntity,
    FilterHas,
    FilterJunction,
    FilterLike,
    FilterNode,
    FilterNot,
    FilterResidual,
    Mode,
    Outcome,
    Plan,
    PlanOutcome,
    Verdict,
)

__all__ = [
    "BundleError",
    "Comparison",
    "Decision",
    "DecisionRecord",
    "Engine",
    "EntityRef",
    "FilterCompare",
    "FilterConst",
    "FilterContains",
    "FilterContainsSet",
    "FilterEntity",
    "FilterHas",
    "FilterJunction",
    "FilterLike",
    "FilterNode",
    "FilterNot",
    "FilterResidual",
    "Mode",
    "Outcome",
    "Plan",
    "PlanOutcome",
    "RequestError",
    "Server",
    "Verdict",
    "set_limits",
]
