"""Peer engines built from pinned sources (engine/peers.json) and run beside Ostinato, as a user would."""
