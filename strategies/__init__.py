"""One module per federated algorithm, each holding its server half and its client half.

``strategies.registry.METHODS`` maps a run-config ``method`` name to its pair; RI (relaxed
initialization) lives in ``strategies.ri`` and composes with all of them. The package itself
imports nothing, so the config check reads the light tables in ``strategies.names`` without
importing torch or Flower.
"""
