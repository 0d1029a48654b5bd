"""One module per ``powerflow`` subcommand; each exposes ``register(subparsers)``."""
