"""The bridge layer: keys that cross to another host. It stands on the core's
public API (``shmrdv.Rendezvous``) and the narrow internal interface listed in
docs/architecture.md; the core never imports it."""
