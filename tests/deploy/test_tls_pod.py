"""The TLS overlay's pod run for real, without a cluster: its two containers started as the
rendered Deployment says (the engine's args, llmobs's environment), the Secret's files made by
a real CA where the pod mounts them, and then what the cluster would do: kubelet's https probes
(which check no certificate), Prometheus's scrapes as the PodMonitor configures them (the
Secret's CA, the Service's name), and a client's request through the Service's name."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.support import ROOT
from tests.support.certs import ca_file
from tests.support.kustomize import build, needs_kubectl
from tests.support.ports import free_port
from tests.support.processes import Processes

OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "cpu-sim-tls"
MOUNT = "/etc/llmobs/tls"
SERVICE = "llmobs"  # the name the certificate carries, as the Service's DNS name


def _pod() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = next(
        d for d in build(OVERLAY) if d["kind"] == "Deployment" and d["metadata"]["name"] == "llmobs"
    )
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    return containers["engine"], containers["llmobs"]


def _monitor() -> dict[str, Any]:
    monitor = next(d for d in build(OVERLAY) if d["kind"] == "PodMonitor")
    endpoints: dict[str, Any] = monitor["spec"]["podMetricsEndpoints"][0]
    return endpoints


class _Pod(Processes):
    def __init__(self, folder: Path, ports: dict[str, int]) -> None:
        super().__init__()
        self.folder, self.ports = folder, ports

    def here(self, value: str) -> str:
        """A value of the manifest with the Secret's mount and the ports moved to this test's."""
        value = value.replace(MOUNT, str(self.folder))
        for name, port in (("8000", self.ports["engine"]),):
            value = value.replace(f"127.0.0.1:{name}", f"127.0.0.1:{port}")
        return value

    async def start(self, *argv: str, env: dict[str, str]) -> None:
        await self.spawn(argv, env, None)


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[_Pod]:
    ca = trustme.CA()
    leaf = ca.issue_cert(SERVICE, "localhost")  # what cert-manager would put in the Secret
    (tmp_path / "tls.crt").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    (tmp_path / "tls.key").write_bytes(leaf.private_key_pem.bytes())
    ca_file(ca, tmp_path / "ca.crt")
    ports = {"engine": free_port(), "http": free_port(), "metrics": free_port()}
    running = _Pod(tmp_path, ports)
    engine, side = _pod()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLMOBS_", "OTEL_"))}
    args = [running.here(a) for a in engine["args"]]
    args[args.index("--port") + 1] = str(ports["engine"])
    env = {e["name"]: running.here(e["value"]) for e in side["env"] if "value" in e}
    env |= {"LLMOBS_PORT": str(ports["http"]), "LLMOBS_METRICS_PORT": str(ports["metrics"])}
    env |= {"LLMOBS_HOST": "127.0.0.1", "LLMOBS_METRICS_HOST": "127.0.0.1"}
    await running.start(*args, "--host", "127.0.0.1", env=clean)
    await running.start(*side["args"], env={**clean, **env})
    try:
        yield running
    finally:
        await running.stop()


def _probe(container: dict[str, Any], kind: str, ports: dict[str, int]) -> str:
    get = container[kind]["httpGet"]
    port = ports["metrics"] if get["port"] == "metrics" else ports["engine"]
    return f"{get['scheme'].lower()}://127.0.0.1:{port}{get['path']}"


async def _as_service(trust: ssl.SSLContext, method: str, url: str, **kw: Any) -> httpx.Response:
    """A request to 127.0.0.1 as if to the Service's name: sent (SNI) and checked as that."""
    async with httpx.AsyncClient(verify=trust, timeout=30) as http:
        return await http.request(method, url, extensions={"sni_hostname": SERVICE}, **kw)


@needs_kubectl
async def test_the_probes_the_scrapes_and_a_client_work_over_https(pod: _Pod) -> None:
    engine, side = _pod()
    probes = [
        _probe(side, "readinessProbe", pod.ports), _probe(side, "livenessProbe", pod.ports),
        _probe(engine, "livenessProbe", pod.ports),
    ]  # fmt: skip
    assert all(p.startswith("https://") for p in probes)
    async with httpx.AsyncClient(verify=False) as kubelet:  # kubelet checks no certificate
        async with asyncio.timeout(60):
            while True:
                try:
                    codes = [(await kubelet.get(url)).status_code for url in probes]
                except httpx.TransportError:
                    codes = []
                if codes == [200] * len(probes):
                    break
                await asyncio.sleep(0.2)

    monitor = _monitor()  # Prometheus: the Secret's CA, the name it configures
    assert monitor["tlsConfig"]["serverName"] == SERVICE
    trust = ssl.create_default_context(
        cafile=str(pod.folder / monitor["tlsConfig"]["ca"]["secret"]["key"])
    )
    for port in (pod.ports["metrics"], pod.ports["engine"]):
        url = f"{monitor['scheme']}://127.0.0.1:{port}{monitor['path']}"
        assert (await _as_service(trust, "GET", url)).status_code == 200, url

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    url = f"https://127.0.0.1:{pod.ports['http']}/v1/chat/completions"
    answer = await _as_service(trust, "POST", url, json=body)
    assert answer.status_code == 200 and answer.json()["choices"]
    metrics = f"https://127.0.0.1:{pod.ports['metrics']}/metrics"
    async with asyncio.timeout(30):  # the engine's /metrics, scraped over https (every 5 s)
        while True:
            text = (await _as_service(trust, "GET", metrics)).text
            if 'llmobs_collector_up{collector="engine"} 1' in text:
                break
            await asyncio.sleep(0.5)
    assert 'llmobs_tls_handshakes_total{result="ok"}' in text
