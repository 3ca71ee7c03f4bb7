"""Built-in backend plugins (import name ``unirl_backends``), each loaded through the
``unirl`` entry-point group exactly like a third-party backend."""
