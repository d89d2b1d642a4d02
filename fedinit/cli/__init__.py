"""The commands a user runs (pyproject ``[project.scripts]``): ``fedinit-simulate``
(``simulate``), ``fedinit-sweep`` (``sweep``), ``fedinit-report`` (``report``),
``fedinit-deploy`` (``deploy_local``) and ``fedinit-dashboard`` (``dashboard``), and the
modules only they need. The project's own tooling (CI, the docs' report builders,
screenshots) is in ``fedinit/scripts/``, which may import this package, never the other way round.
"""
