"""The portal's assistant: a question answered by a model with the portal's read-only operations.

Optional, as the reasoner's model is (docs/portal.md#the-assistant): with ``model_url`` set,
``Assistant.ask`` sends the question to an OpenAI-compatible chat-completions API through the
``openai`` client, offering as tools only read-only operations of the service layer
(``TOOLS``). Each tool call the model asks for runs as the signed-in person, through the same
service method GraphQL uses, so it is checked with the decision point as that person
(``view`` on its area); a refusal goes back to the model as the tool's result, naming the
decision's qid. After ``assistant_max_steps`` rounds of tool calls without an answer, the
assistant stops and says so. Nothing but the question, the tools' answers and their names goes
to the model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from svc.common.problems import Problem
from svc.portal.service import Denied, PortalService
from svc.portal.settings import PortalSettings

__all__ = ["TOOLS", "Assistant"]

log = logging.getLogger("svc.portal.assistant")

#: Longest tool answer sent back to the model, in characters (the rest is cut, and it is told).
MAX_TOOL_ANSWER = 20_000

INSTRUCTION = (
    "You answer questions about access decisions and security in svc, an authorization "
    "service. Use the tools to look things up; they answer as the person asking, and may "
    "refuse. Say which decisions (qid) and policies your answer rests on. Do not guess."
)


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_STR = {"type": "string"}
#: The read-only operations offered to the model (OpenAI function tools).
TOOLS = [
    _tool(
        "search_decisions",
        "A principal's or a resource's recorded decisions, oldest first (last 24 hours unless "
        "`since` is given, RFC 3339).",
        {
            "principal_type": _STR,
            "principal_id": _STR,
            "resource_type": _STR,
            "resource_id": _STR,
            "verdict": _STR,
            "action": _STR,
            "since": _STR,
        },
        [],
    ),
    _tool(
        "explain_decision",
        "A decision, its policies' text and its challenge.",
        {"qid": _STR},
        ["qid"],
    ),
    _tool(
        "who_can",
        "Which principals of a type may take an action on a resource.",
        {"action": _STR, "resource_type": _STR, "resource_id": _STR, "principal_type": _STR},
        ["action", "resource_type", "resource_id"],
    ),
    _tool("risk_scores", "The reasoner's risk scores, highest first.", {}, []),
    _tool("containments", "Every contained principal.", {}, []),
    _tool("investigations", "Investigations, newest first.", {"status": _STR}, []),
]


class Assistant:
    """Answers questions with a model and the portal's read-only operations (module docs).

    Args:
        settings: ``model_url``, ``model_name``, ``model_api_key_file``,
            ``assistant_max_steps``, ``call_timeout_secs``.
        service: the service layer whose read-only operations are the tools.

    """

    def __init__(self, settings: PortalSettings, service: PortalService) -> None:
        self.settings = settings
        self.service = service

    def run_tool(self, person: str, name: str, args: dict[str, Any]) -> Any:
        """Runs one of ``TOOLS`` as `person`; a refusal is answered as ``{"error", ...}``."""
        s = self.service

        def ref(t: str, i: str) -> dict[str, str] | None:
            return {"type": args[t], "id": args[i]} if args.get(t) and args.get(i) else None

        calls: dict[str, Callable[[], Any]] = {
            "search_decisions": lambda: s.decisions(
                person,
                principal=ref("principal_type", "principal_id"),
                resource=ref("resource_type", "resource_id"),
                verdict=args.get("verdict"),
                action=args.get("action"),
                since=_time(args.get("since")),
                first=50,
            ),
            "explain_decision": lambda: _explained(s.explain(person, str(args.get("qid", "")))),
            "who_can": lambda: s.who_can(
                person,
                str(args.get("action", "")),
                {
                    "type": str(args.get("resource_type", "")),
                    "id": str(args.get("resource_id", "")),
                },
                str(args.get("principal_type") or "Human"),
                50,
            ),
            "risk_scores": lambda: s.risk_scores(person),
            "containments": lambda: [
                {"principal": {"type": m.principal.type, "id": m.principal.id}, "reason": m.reason}
                for m in s.containments(person)
            ],
            "investigations": lambda: s.investigations(person, args.get("status")),
        }
        fn = calls.get(name)
        if fn is None:
            return {"error": f"no tool `{name}`"}
        try:
            return fn()
        except Denied as e:
            return {"error": e.detail, "decision_qid": e.qid}
        except Problem as p:
            return {"error": f"{p.title}: {p.detail}"}

    def ask(self, person: str, question: str) -> dict[str, Any]:
        """Answers `question` for `person` (``view`` on ``assistant``).

        Returns:
            ``{"answer", "steps": [{"tool", "arguments", "ok"}]}``: the model's answer and the
            tool calls made for it, in order (``ok`` false when the call was refused).

        Raises:
            Denied: the person may not use the assistant.
            Problem: 503 ``service-unavailable`` without ``model_url``, or when the model
                service does not answer; 400 for an empty or too long question.

        """
        self.service.authorize(person, "view", "assistant")
        s = self.settings
        if not s.model_url:
            raise Problem(
                503,
                "service-unavailable",
                "Service unavailable",
                "no model is configured (SVC_PORTAL_MODEL_URL)",
            )
        if not question.strip() or len(question) > 4000:
            raise Problem(
                400, "invalid-argument", "Invalid argument", "`question`: 1 to 4,000 characters"
            )
        import openai

        key = None
        if s.model_api_key_file:
            key = Path(s.model_api_key_file).read_text(encoding="utf-8").strip() or None
        client = openai.OpenAI(
            base_url=s.model_url, api_key=key or "none", timeout=s.call_timeout_secs, max_retries=0
        )
        messages: list[Any] = [
            {"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": question},
        ]
        steps: list[dict[str, Any]] = []
        try:
            for _ in range(s.assistant_max_steps):
                r = client.chat.completions.create(
                    model=s.model_name, messages=messages, tools=TOOLS, temperature=0
                )
                if not r.choices:
                    break
                msg = r.choices[0].message
                if not msg.tool_calls:
                    return {"answer": (msg.content or "").strip(), "steps": steps}
                messages.append(msg.model_dump(exclude_none=True))
                for call in msg.tool_calls:
                    name = getattr(call, "function", None)
                    fname = name.name if name is not None else ""
                    try:
                        args = json.loads(name.arguments) if name is not None else {}
                        if not isinstance(args, dict):
                            raise ValueError
                    except ValueError:
                        args = {}
                    out = self.run_tool(person, fname, args)
                    ok = not (isinstance(out, dict) and "error" in out)
                    steps.append({"tool": fname, "arguments": args, "ok": ok})
                    text = json.dumps(out, default=str)
                    if len(text) > MAX_TOOL_ANSWER:
                        text = text[:MAX_TOOL_ANSWER] + " ... (cut)"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        except openai.OpenAIError as e:
            log.error("the model service does not answer: %s", e)
            raise Problem(
                503,
                "service-unavailable",
                "Service unavailable",
                "the model service does not answer",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            client.close()
        return {
            "answer": f"no answer within {s.assistant_max_steps} rounds of tool calls",
            "steps": steps,
        }


def _time(value: Any) -> Any:
    from datetime import UTC, datetime

    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _explained(out: dict[str, Any] | None) -> Any:
    if out is None:
        return {"error": "no such decision"}
    ch = out.get("challenge")
    return {
        **out,
        "challenge": None if ch is None else {"qid": ch.qid, "state": int(ch.state)},
    }
