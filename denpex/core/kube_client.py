"""The CoreV1Api of the official Kubernetes client, configured the one way every part of
denpex that talks to an API server needs it (the remediation backend, the server's
credentials from a Secret): an explicit host, else the pod's service account, else a
kubeconfig. The client is an optional extra, imported here only when asked for."""

from __future__ import annotations

from typing import Any

INSTALL_HINT = "pip install 'denpex[kubernetes]'"


class KubeUnavailable(Exception):
    """The client is not installed, or no cluster is configured (the text says which)."""


def kubernetes_module() -> Any:
    """The `kubernetes` package, or KubeUnavailable saying how to install it."""
    try:
        import kubernetes
    except ImportError:
        raise KubeUnavailable(
            f"the Kubernetes Python client is not installed ({INSTALL_HINT})"
        ) from None
    return kubernetes


def core_v1(
    host: str | None = None, kubeconfig: str | None = None, context: str | None = None
) -> Any:
    """A CoreV1Api: `host` when given, else in-cluster, else the kubeconfig (`kubeconfig`
    or the default one, at `context` or its current one)."""
    k8s = kubernetes_module()
    if host:
        cfg = k8s.client.Configuration()
        cfg.host = host
        return k8s.client.CoreV1Api(k8s.client.ApiClient(cfg))
    try:
        k8s.config.load_incluster_config()
        return k8s.client.CoreV1Api(k8s.client.ApiClient())
    except k8s.config.ConfigException:
        pass
    try:
        api_client = k8s.config.new_client_from_config(config_file=kubeconfig, context=context)
    except (k8s.config.ConfigException, OSError) as exc:
        raise KubeUnavailable(f"no cluster configured ({type(exc).__name__}: {exc})") from None
    return k8s.client.CoreV1Api(api_client)
