"""tabular-quickstart: a Flower app of its own (model, data, ClientApp, ServerApp)."""
