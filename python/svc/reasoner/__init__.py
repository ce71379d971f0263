"""The reasoner (svc-reasoner): risk per person and per agent from history (docs/reasoner.md).

* ``scoring``: the model, daily rollups and peers to a 0..100 score with its factors.
* ``gate``: the automated containment gate.
* ``service``: one cycle (read, score, decide, write) with clients handed in.
* ``app``: the probes and the loop (one replica through ``lease``).
* ``cli``: ``svc reasoner serve`` and ``svc reasoner cycle``.
"""
