"""The ServerApp: validate config, build model + strategy, run rounds, evaluate, record."""
