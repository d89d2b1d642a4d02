"""The project's own namespace, as ``flwr`` is Flower's: everything beside the card's
``strategies``, ``server_app`` and ``client_app`` (methods, task, store, node, cli,
secure_aggregation, flower_compat, scripts), so an installed wheel puts no generic
top-level package into a user's site-packages."""
