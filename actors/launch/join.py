"""Reaching the Ray cluster a run joins (``run.ray_address``, ``shunter run --address``) before
``ray.init`` does: its GCS is asked for the cluster's id, within ``run.connect_timeout_s``.

Why: ``ray.init(address=...)`` against a wrong or dead address tries 20 times, up to 40 s each,
printing its C++ warnings and ignoring Ctrl-C meanwhile; against a cluster that wants an auth token
this process lacks it prints ~20 lines and a traceback. Here that is one error naming the address
and what to check.

Invariants: the question is the one ``ray.init`` asks first, asked as it asks it — the address
resolved by Ray's own rules (``auto``, ``RAY_ADDRESS``), the channel built by Ray (its TLS and
auth-token settings); it is awaited on the caller's event loop, so a stop signal ends it at once;
nothing in the cluster is changed. A Ray Client address (``ray://``) is left to ``ray.init``.
"""

from __future__ import annotations

import asyncio
import os
import socket

from shunter.engine.io.errors import EngineSetupError

KEYS = "run.ray_address / --address"
"""Where the address came from, as the errors name it."""
DOCS = "docs/cluster.md"


async def reach(address: str, timeout_s: float) -> None:
    """Return once the GCS at ``address`` answered; ``EngineSetupError`` in one line naming the
    address and what to check when it cannot be found, does not answer as a GCS within
    ``timeout_s``, or refuses this process's auth token."""
    if "://" in address:
        return
    import grpc
    from ray._private import services
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from ray.exceptions import AuthenticationError

    try:
        gcs = services.canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError) as e:
        raise EngineSetupError(f"no Ray cluster at {address!r} ({KEYS}): {e}") from None
    if address == "auto":  # as ray.init: only a cluster found on its own may turn token auth on
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    where = f"{address} ({KEYS})" if gcs == address else f"{address} ({KEYS}; Ray resolves it to {gcs})"
    # gRPC's own reconnects within one deadline, not ray.init's retries: bounded, and cancellable
    # on this loop (ray.init blocks the thread, signals unhandled); no proxy, as Ray's C++ client.
    options = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.min_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    channel = init_grpc_channel(gcs, options=options, asynchronous=True)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        await stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, wait_for_ready=True)
    except AuthenticationError:  # token mode on and no token to send: Ray raises before sending
        raise EngineSetupError(_refused(where)) from None
    except grpc.aio.AioRpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise EngineSetupError(_refused(where)) from None
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            why = f"no answer within {timeout_s:g}s (run.connect_timeout_s): {await _what_listens(gcs)}"
        else:
            why = f"something answers there, but not as a Ray GCS ({code.name}: {e.details()})"
        raise EngineSetupError(
            f"no Ray cluster at {where}: {why} — give the address `ray start --head` printed (its --port, "
            f"default 6379; not the dashboard's 8265 nor the Ray Client's 10001) and check the head is up; see {DOCS}"
        ) from None
    finally:
        await channel.close()


def _refused(where: str) -> str:
    return (
        f"the Ray cluster at {where} refused this process: {token_state()}; set RAY_AUTH_MODE=token and "
        "RAY_AUTH_TOKEN_PATH=<the cluster's token file> (the one its `ray start` was given) for shunter too, "
        f"as {DOCS} says"
    )


async def _what_listens(gcs: str) -> str:
    """Why a GCS did not answer, as far as a TCP connection tells."""
    host, _, port = gcs.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
    except socket.gaierror:
        return f"the host {host!r} is not known"
    except ConnectionRefusedError:
        return f"nothing listens on port {port} of {host}"
    except (TimeoutError, OSError):
        return f"{host} does not answer on port {port} (down, or a firewall between)"
    writer.close()
    return f"something listens on port {port} of {host}, but it does not answer as a Ray GCS"


def token_state() -> str:
    """What this process holds for Ray's token authentication (the token's value never shown)."""
    from ray._raylet import AuthenticationTokenLoader

    mode = os.environ.get("RAY_AUTH_MODE", "")
    if mode.lower() != "token":
        return f"RAY_AUTH_MODE is {mode or 'unset'} here, so it sent no auth token"
    try:
        found = AuthenticationTokenLoader.instance().has_token()
    except Exception:  # noqa: BLE001 - Ray raises where token mode is on and no token is found
        found = False
    if not found:
        return (
            "RAY_AUTH_MODE=token here, but no token was found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)"
        )
    if os.environ.get("RAY_AUTH_TOKEN"):
        source = "RAY_AUTH_TOKEN"
    elif os.environ.get("RAY_AUTH_TOKEN_PATH"):
        source = f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    else:
        source = "~/.ray/auth_token"
    return f"the token it sent ({source}) is not the cluster's"
