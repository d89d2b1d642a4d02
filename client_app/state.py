"""Kept for ``client_app/round.py``'s import only: the client state now lives in
``store.client_store`` (``ClientStore``, its disk half ``store.state_dir.StateDir``)."""

from store.client_store import W_PREV
from store.client_store import ClientStore as ClientState

__all__ = ["W_PREV", "ClientState"]
