"""The federated methods: one module per method holding its parameters, its typed server
state, its pure server update and its client rule, plus the pieces they share.

- ``method.py``: the shape every method has (``Params``, ``ServerState``, ``ServerRule``,
  ``ClientRule``, ``MethodSpec``) and what a round hands in (``ClientUpdate``, ``RoundInput``).
- ``registry.py``: the one list of methods, from which the run config is built.
- ``ri.py``: relaxed initialization, which composes with every method; ``norms.py``: the
  norms the reply filter measures; ``sampling.py``: seeded client sampling; ``wire.py``:
  the names on the wire and of the round metrics.
- ``robust.py``: the robust aggregation statistics (Flower's trimmed mean; the only module
  here that imports Flower).

The one Flower strategy all methods run in is ``strategies/method_strategy.py``; the client
half hands the client rule's ``train`` a ``LocalJob`` holding the run's SGD pass
(``client_app/round.py``).
This package imports nothing of the project's other packages.

The method modules import numpy only (torch inside a client hook), so the config check stays
fast. The package itself imports nothing.
"""
