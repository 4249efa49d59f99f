"""Connecting to a Ray cluster that has token authentication on, as `ray job submit` users do.

Ray's core sends the token only when RAY_AUTH_MODE=token is set in the connecting process; a shell
that holds the cluster's token in ~/.ray/auth_token but not that variable meets a 20-30 s timeout
and Ray's "Failed to connect" (or "ray client connection timeout"). So before ray.init, the address is
asked one cheap question (0.2 s): a cluster that answers UNAUTHENTICATED while a token is at hand gets
RAY_AUTH_MODE=token for this process; without a token, one line says where to put it. A cluster that
does not answer at all is named in one line too, instead of after Ray's own timeout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raypack.errors import ConfigError

__all__ = ["check_cluster", "connect_error", "token_source"]

_PROBE_S = 5.0
_WHERE = "~/.ray/auth_token (or set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file that holds it)"


def token_source() -> str | None:
    """Where Ray would read this process's token from, in Ray's own order, or None: no token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH ({path})" if Path(path).expanduser().is_file() else None
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def check_cluster(address: str) -> None:
    """Ready this process to connect to the cluster at `address` (RAY_ADDRESS: host:port of its GCS,
    or ray://host:port): RAY_AUTH_MODE=token where the cluster wants a token and one is at hand (Ray
    reads the mode only from the environment); ConfigError, at once, where it wants one and none is,
    or where nothing answers there. Addresses Ray resolves itself ("auto") are left to it, as is
    everything where grpcio (Ray's client extra) is not installed."""
    if address.startswith(("http://", "https://")):
        raise ConfigError(
            f"RAY_ADDRESS={address} is a dashboard's address, what `ray job submit` takes; raypack "
            "joins a cluster at its GCS (RAY_ADDRESS=host:6379) or through Ray Client "
            "(ray://host:10001), or runs inside a job: ray job submit ... -- raypack pack job.yaml"
        )
    answer = _probe(address)
    if answer is None or answer == "ok":
        return
    if answer == "unauthenticated":
        where = token_source()
        if where is None:
            raise ConfigError(
                f"the Ray cluster at {address} has token authentication on and this shell has no token: "
                f"put the cluster's token in {_WHERE}; on the head, `ray get-auth-token` prints it"
            )
        if _probe(address, _token_header()) == "unauthenticated":
            raise _refused(address, where)
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            _token_mode()
        return
    raise ConfigError(f"no Ray cluster answers at {address} ({answer}); check RAY_ADDRESS")


def connect_error(address: str, error: Exception) -> ConfigError | None:
    """The one line for ray.init's failure to join the cluster at `address`, or None for another error."""
    name = type(error).__name__
    if name == "AuthenticationError":
        return _refused(address, token_source() or "no token found")
    if isinstance(error, ConnectionError):
        first = str(error).splitlines()[0] if str(error) else name
        return ConfigError(f"could not join the Ray cluster at {address}: {first}; check RAY_ADDRESS")
    return None


def _refused(address: str, where: str) -> ConfigError:
    return ConfigError(
        f"the Ray cluster at {address} refused this shell's token ({where}): use that cluster's token "
        f"(`ray get-auth-token` on its head) in {_WHERE}"
    )


def _token_header() -> tuple[tuple[str, str], ...]:
    """The token as Ray's own clients send it (an authorization header), read where Ray reads it."""
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    header = AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True)
    return tuple((key.lower(), value) for key, value in header.items())


def _token_mode() -> None:
    """Token authentication on for this process, as Ray turns it on for a local cluster it starts
    (ray._private.authentication.authentication_token_setup): the variable, and Ray's cached config
    read again, since `import ray` has read it already."""
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray._raylet import Config  # type: ignore[attr-defined]

    Config.initialize("")


def _probe(address: str, metadata: tuple[tuple[str, str], ...] = ()) -> str | None:
    """ "ok", "unauthenticated", a reason nothing answered, or None (not asked)."""
    try:
        import grpc
    except ImportError:
        return None
    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    if "://" in target or ":" not in target:
        return None  # "auto", "local", a dashboard URL: Ray's own business
    channel = grpc.insecure_channel(target)
    try:
        _ask(channel, client, metadata)
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return "unauthenticated"
        if code == grpc.StatusCode.UNAVAILABLE:
            return "connection refused or host unreachable"
        return None  # slow, or an answer not to this question (another Ray, a proxy): Ray decides
    finally:
        channel.close()
    return "ok"


def _ask(channel: object, client: bool, metadata: tuple[tuple[str, str], ...]) -> None:
    """One cheap call: the Ray client server's ping, or the GCS's cluster id."""
    generated: Any
    if client:
        from ray.core.generated import ray_client_pb2 as generated
        from ray.core.generated import ray_client_pb2_grpc

        ping = generated.ClusterInfoRequest(type=generated.ClusterInfoType.PING)
        ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=_PROBE_S, metadata=metadata)
    else:
        from ray.core.generated import gcs_service_pb2 as generated
        from ray.core.generated import gcs_service_pb2_grpc

        request = generated.GetClusterIdRequest()
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            request, timeout=_PROBE_S, metadata=metadata
        )
