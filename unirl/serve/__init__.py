"""``unirl serve``: the Tinker training and sampling API over any engine-mode backend (docs/tinker.md).

:mod:`unirl.serve.service` holds the models, sampling sessions and futures, :mod:`unirl.serve.app`
the HTTP routes, :mod:`unirl.serve.wire` the SDK's protobuf messages; :func:`serve` starts it all.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_access(host: str, api_key: str | None) -> None:
    """Refuse a server anyone on the network could train on: a non-loopback ``host`` needs a key,
    and a key must start with ``tml-`` (the SDK sends no other)."""
    from unirl.errors import UsageError

    if api_key is not None and not api_key.startswith("tml-"):
        raise UsageError("--api-key must start with 'tml-': the tinker SDK refuses to send any other key")
    loopback = host in LOOPBACK
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback and api_key is None:
        raise UsageError(f"--host {host} is reachable from other machines: give --api-key tml-... (or "
                         f"--api-key-file FILE) so only clients holding it can train; without a key the server "
                         f"binds 127.0.0.1 only")


def serve(recipe: str, overrides: list[str], *, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, model_name: str | None = None, console: Any = None,
          ready: Any = None) -> None:
    """Build the service and answer requests until interrupted; ``ready(url)`` (default: print one
    line) once the port listens."""
    import uvicorn

    from unirl.serve.app import build_app
    from unirl.serve.service import Service
    from unirl.serve.wire import pb

    check_access(host, api_key)
    pb()  # the SDK's wire definitions are importable: refuse now rather than at the first request
    service = Service(recipe, overrides, model_name=model_name, console=console)
    config = uvicorn.Config(build_app(service, api_key), host=host, port=port, log_level="warning",
                            lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.05)
        if server.started:
            sock = server.servers[0].sockets[0]
            bound = sock.getsockname()[1] if sock.family in (socket.AF_INET, socket.AF_INET6) else port
            shown = f"[{host}]" if ":" in host else host
            url = f"http://{shown}:{bound}"
            (ready or _announce)(url, service)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        service.close()


def _announce(url: str, service: Any) -> None:
    print(f"unirl serve: ready at {url} (backend={service.recipe.backend}, model {service.model_name!r}, "
          f"run.dir={service.run_dir}); ServiceClient(base_url={url!r})", flush=True)
