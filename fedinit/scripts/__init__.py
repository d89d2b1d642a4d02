"""The project's own tooling, not a user's commands (those are ``fedinit/cli/``): ``setup.sh`` and
``test.sh`` (CI and the README run them), ``flower_setup`` (setup's Flower config), the report
builders the docs' tables come from (``personal_report``, ``cluster_purity``,
``graph_purity``, ``ri_gain``, ``regime_graph``) and the dashboard's pictures
(``screenshots``, ``headless``)."""
