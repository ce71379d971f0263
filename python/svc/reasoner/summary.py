"""Investigation summaries: a model's, or a deterministic one (docs/reasoner.md#investigations).

``Summarizer.summarize(evidence)`` writes a few sentences from an investigation's evidence. With
a model configured it asks an OpenAI-compatible chat-completions API through the ``openai``
client, sending a fixed instruction and the evidence fields as JSON, nothing else: no record of
the history, no other field of the install leaves it. Without one it writes the same facts in a
fixed form. A model that does not answer raises ``Unavailable("model")``: the cycle fails before
it writes anything and is retried at the next (docs/reasoner.md#failures).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from svc.reasoner.clients import Unavailable

__all__ = ["EVIDENCE_FIELDS", "INSTRUCTION", "Summarizer", "deterministic_summary"]

#: The only evidence fields a model is sent.
EVIDENCE_FIELDS: tuple[str, ...] = (
    "principal",
    "kind",
    "score",
    "learning",
    "peer_group",
    "window",
    "factors",
    "gate",
    "mode",
)

#: The model's instruction (the system message).
INSTRUCTION = (
    "You are a security analyst. Summarize, in at most four sentences for a reviewer, why this "
    "principal was flagged, using only the JSON evidence given: name the strongest factors with "
    "their observed and usual values, say whether it was contained or would have been, and do "
    "not speculate beyond the evidence."
)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v[:5]) + (" ..." if len(v) > 5 else "")
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in list(v.items())[:4])
    return str(v)


def deterministic_summary(evidence: Mapping[str, Any]) -> str:
    """The facts of `evidence` in a fixed form (no model).

    Args:
        evidence: an investigation's evidence (``EVIDENCE_FIELDS``).

    Returns:
        A few sentences: who, the score, what happened (contained, would have been, scored
        high), and the largest factors with their observed and usual values.

    """
    p = evidence.get("principal") or {}
    who = f"{p.get('type', '?')}::{p.get('id', '?')}"
    kind = evidence.get("kind")
    verb = {
        "contain": "was contained automatically",
        "would_contain": "would have been contained (containment mode: monitor)",
        "score": "scored above the investigation threshold",
    }.get(str(kind), "was flagged")
    parts = [f"{who} {verb} with a risk score of {evidence.get('score', '?')}."]
    factors = list(evidence.get("factors") or [])[:3]
    if factors:
        said = []
        for f in factors:
            usual = f.get("baseline")
            peers = f.get("peers")
            text = f"{f.get('name')} {_fmt(f.get('observed'))}"
            if usual is not None:
                text += f" (usual {_fmt(usual)}"
                text += f", peers {_fmt(peers)})" if peers is not None else ")"
            elif peers is not None:
                text += f" (peers {_fmt(peers)})"
            said.append(text)
        parts.append("Largest factors: " + "; ".join(said) + ".")
    gate = evidence.get("gate") or {}
    if gate.get("reasons"):
        parts.append("Gate: " + "; ".join(str(r) for r in gate["reasons"]) + ".")
    if evidence.get("learning"):
        parts.append("The principal is still learning: compared with its peers only.")
    return " ".join(parts)


class Summarizer:
    """Writes summaries with a model when one is configured, else deterministically.

    Args:
        url: the chat-completions API's base URL (``http://127.0.0.1:8000/v1``), or None.
        model: the model's name.
        api_key: returns the API key for the next call (None: an empty key).
        timeout: seconds per call.

    """

    def __init__(
        self,
        url: str | None = None,
        model: str = "gpt-4o-mini",
        api_key: Callable[[], str | None] = lambda: None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.model = model
        self._api_key = api_key
        self._timeout = timeout

    @property
    def by(self) -> str:
        """What ``summary_by`` says: the model's name, or ``deterministic``."""
        return self.model if self.url else "deterministic"

    def summarize(self, evidence: Mapping[str, Any]) -> str:
        """A summary of `evidence` (only ``EVIDENCE_FIELDS`` are sent to a model).

        Raises:
            Unavailable: the model service did not answer, or answered no text.

        """
        if not self.url:
            return deterministic_summary(evidence)
        import openai

        sent = {k: evidence[k] for k in EVIDENCE_FIELDS if k in evidence}
        client = openai.OpenAI(
            base_url=self.url,
            api_key=self._api_key() or "none",
            timeout=self._timeout,
            max_retries=0,
        )
        try:
            r = client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": INSTRUCTION},
                    {"role": "user", "content": json.dumps(sent, sort_keys=True, default=str)},
                ],
                temperature=0,
            )
        except openai.OpenAIError as e:
            raise Unavailable("model", f"chat.completions: {type(e).__name__}: {e}") from e
        finally:
            client.close()
        text = (r.choices[0].message.content or "").strip() if r.choices else ""
        if not text:
            raise Unavailable("model", "chat.completions: an answer without text")
        return text
