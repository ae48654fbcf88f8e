"""The disaggregated prefill and decode overlays (deploy/kubernetes/overlays/pd-decode and
pd-prefill), read as the cluster would run them: every port a container is told of is one
another container listens on, and the pod's own port leads through llmobs; then both pods run
for real without a cluster, each container as the rendered Deployment says (llmobs's
environment, the routing sidecar's flags, vLLM's port), the sim standing in for vLLM and
tests/support/pd_router.py for llm-d's routing sidecar, and a user's request with a remote
prefill is counted once as a user's and once as each of its two legs."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT
from tests.support.kustomize import build, needs_kubectl
from tests.support.pd_router import PdRouter
from tests.support.ports import free_port
from tests.support.processes import Processes

pytestmark = needs_kubectl

OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"
LOOPBACK = ("127.0.0.1", "localhost")
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}

Doc = dict[str, Any]


@dataclass
class Pod:
    """One role's rendered objects: its Deployment's pod, its Service and PodMonitor."""

    docs: list[Doc]
    kinds: dict[str, Doc] = field(init=False)

    def __post_init__(self) -> None:
        self.kinds = {d["kind"]: d for d in self.docs}

    @property
    def spec(self) -> Doc:
        spec: Doc = self.kinds["Deployment"]["spec"]["template"]["spec"]
        return spec

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
        return labels

    @property
    def containers(self) -> dict[str, Doc]:
        """Every container, the init (native sidecar) ones too, by name."""
        every = [*self.spec["containers"], *self.spec.get("initContainers", [])]
        return {c["name"]: c for c in every}

    def env(self, container: str) -> dict[str, str]:
        return {e["name"]: e["value"] for e in self.containers[container]["env"] if "value" in e}

    def args(self, container: str) -> dict[str, str]:
        """A container's ``--flag value`` and ``--flag=value`` pairs."""
        words = [str(w) for w in self.containers[container].get("args", [])]
        out: dict[str, str] = {}
        for i, word in enumerate(words):
            if word.startswith("--"):
                flag, eq, value = word.partition("=")
                following = words[i + 1] if i + 1 < len(words) else "--"
                out[flag] = value if eq else ("" if following.startswith("--") else following)
        return out

    def ports(self) -> dict[int, tuple[str, str]]:
        """Each port the pod's containers declare: (container, port name)."""
        return {
            p["containerPort"]: (c["name"], p["name"])
            for c in self.containers.values()
            for p in c.get("ports", [])
        }

    def port(self, container: str, name: str) -> int:
        (number,) = [n for n, owner in self.ports().items() if owner == (container, name)]
        return number

    def target(self, service_port: Doc) -> tuple[str, str] | None:
        """The container and port name a Service port leads to (None: nothing listens)."""
        target = service_port["targetPort"]
        for number, (container, name) in self.ports().items():
            if target in (number, name):
                return container, name
        return None


@functools.cache
def _rendered(overlay: str) -> str:
    return json.dumps(build(OVERLAYS / overlay))


def render(overlay: str) -> Pod:
    """The overlay as ``kubectl kustomize`` renders it (a copy of its own, to change)."""
    docs: list[Doc] = json.loads(_rendered(overlay))
    return Pod(docs)


def local_port(url: str) -> int | None:
    """The port of a URL on the pod's loopback (None: not on it)."""
    parts = urlsplit(url)
    return parts.port if parts.hostname in LOOPBACK else None


def common_problems(pod: Pod) -> list[str]:
    """What both roles need: the pod's port is llmobs's, the Service leads to it alone,
    llmobs reads the roles, vLLM speaks NIXL with its side channel on the pod's IP."""
    problems = []
    env = pod.env("llmobs")
    if int(env["LLMOBS_PORT"]) != pod.port("llmobs", "http"):
        problems.append("llmobs listens on another port than its declared http port")
    for service_port in pod.kinds["Service"]["spec"]["ports"]:
        if pod.target(service_port) not in (("llmobs", "http"), ("llmobs", "metrics")):
            problems.append(f"the Service's {service_port['name']} port bypasses llmobs")
    http = [p for p in pod.kinds["Service"]["spec"]["ports"] if p["name"] == "http"]
    if [pod.target(p) for p in http] != [("llmobs", "http")]:
        problems.append("the Service's http port does not lead to llmobs's port")
    if env.get("LLMOBS_PD_ROLES", "auto") == "off":
        problems.append("llmobs reads no roles (LLMOBS_PD_ROLES=off)")
    vllm = pod.args("engine")
    if json.loads(vllm.get("--kv-transfer-config", "{}")) != NIXL:
        problems.append("vLLM does not run the NixlConnector as kv_both")
    if int(vllm["--port"]) != pod.port("engine", "engine"):
        problems.append("vLLM listens on another port than its declared one")
    side_channel = {e["name"]: e for e in pod.containers["engine"]["env"]}
    host = side_channel.get("VLLM_NIXL_SIDE_CHANNEL_HOST", {})
    if host.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
        problems.append("NIXL's side channel is not on the pod's IP")
    port = int(side_channel.get("VLLM_NIXL_SIDE_CHANNEL_PORT", {}).get("value", 0))
    if pod.ports().get(port) != ("engine", "nixl"):
        problems.append("NIXL's side channel port is not declared by vLLM")
    numbers = [p["containerPort"] for c in pod.containers.values() for p in c.get("ports", [])]
    if len(numbers) != len(set(numbers)):
        problems.append(f"two containers of the pod declare one port: {sorted(numbers)}")
    return problems


def decode_problems(pod: Pod) -> list[str]:
    """The decode pod's chain: pod port -> llmobs -> routing sidecar -> llmobs's decode
    listener -> vLLM, each hop on the pod's loopback to the port the next one listens on."""
    problems = common_problems(pod)
    env, routing, vllm = pod.env("llmobs"), pod.args("routing-proxy"), pod.args("engine")
    sidecar = pod.containers["routing-proxy"]
    if local_port(env["LLMOBS_UPSTREAM"]) != int(routing["--port"]):
        problems.append("llmobs's upstream is not the routing sidecar's port")
    if int(routing["--port"]) != pod.port("routing-proxy", "routing"):
        problems.append("the routing sidecar listens on another port than its declared one")
    decoder = int(routing["--vllm-port"])
    if decoder != int(env.get("LLMOBS_PD_DECODE_PORT", 8201)):
        problems.append("the sidecar's decoder (--vllm-port) is not llmobs's decode listener")
    if pod.ports().get(decoder) != ("llmobs", "pd-decode"):
        problems.append("the sidecar's decoder is not the decode listener llmobs declares")
    if decoder == int(vllm["--port"]):
        problems.append("the sidecar's decoder is vLLM itself: decode legs bypass llmobs")
    if local_port(env.get("LLMOBS_PD_DECODE_UPSTREAM", "")) != int(vllm["--port"]):
        problems.append("llmobs's decode listener does not lead to vLLM's port")
    if local_port(env.get("LLMOBS_ENGINE_METRICS_URL", "")) != int(vllm["--port"]):
        problems.append("the engine collector scrapes another port than vLLM's")
    if routing.get("--connector") != "nixlv2":
        problems.append("the routing sidecar does not speak vLLM's NIXL protocol (nixlv2)")
    plain = urlsplit(env["LLMOBS_UPSTREAM"]).scheme == "http"
    if plain != (routing.get("--secure-proxy") == "false"):
        problems.append("llmobs and the routing sidecar disagree on TLS")
    native = sidecar in pod.spec.get("initContainers", [])
    if not native or sidecar.get("restartPolicy") != "Always":
        problems.append("the routing sidecar is not a native sidecar: it would stop first")
    # llmobs's /readyz asks the sidecar, which answers by itself: vLLM must say it is ready
    ready = pod.containers["engine"].get("readinessProbe", {}).get("httpGet", {})
    if ready.get("path") != "/health":
        problems.append("nothing waits for vLLM before the pod is Ready")
    return problems


def prefill_problems(pod: Pod) -> list[str]:
    """The prefill pod: pod port -> llmobs -> vLLM, no routing sidecar."""
    problems = common_problems(pod)
    env = pod.env("llmobs")
    if local_port(env["LLMOBS_UPSTREAM"]) != int(pod.args("engine")["--port"]):
        problems.append("llmobs's upstream is not vLLM's port")
    if "routing-proxy" in pod.containers or env.get("LLMOBS_PD_DECODE_UPSTREAM"):
        problems.append("a prefill pod has no routing sidecar and no decode listener")
    return problems


def test_the_decode_pod_leads_every_request_through_llmobs_twice() -> None:
    assert decode_problems(render("pd-decode")) == []


def test_the_prefill_pod_leads_every_leg_through_llmobs() -> None:
    assert prefill_problems(render("pd-prefill")) == []


def _env(container: str, name: str, value: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        (entry,) = [e for e in pod.containers[container]["env"] if e["name"] == name]
        entry["value"] = value

    return change


def _arg(container: str, old: str, new: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        args = pod.containers[container]["args"]
        args[args.index(old)] = new

    return change


def _service_to(target: str) -> Callable[[Pod], None]:
    def change(pod: Pod) -> None:
        pod.kinds["Service"]["spec"]["ports"][0]["targetPort"] = target

    return change


def _sidecar_as_container(pod: Pod) -> None:
    sidecar = pod.spec.pop("initContainers")[0]
    del sidecar["restartPolicy"]
    pod.spec["containers"].append(sidecar)


MISTAKES: dict[str, Callable[[Pod], None]] = {
    "the sidecar's decoder is vLLM": _arg("routing-proxy", "--vllm-port=8201", "--vllm-port=8200"),
    "llmobs relays straight to vLLM": _env("llmobs", "LLMOBS_UPSTREAM", "http://127.0.0.1:8200"),
    "the decode listener loops to the sidecar": _env(
        "llmobs", "LLMOBS_PD_DECODE_UPSTREAM", "http://127.0.0.1:8100"
    ),
    "llmobs's decode port is not the sidecar's decoder": _env(
        "llmobs", "LLMOBS_PD_DECODE_PORT", "8202"
    ),
    "the Service reaches the sidecar": _service_to("routing"),
    "the Service reaches vLLM": _service_to("engine"),
    "roles off": _env("llmobs", "LLMOBS_PD_ROLES", "off"),
    "the sidecar serves TLS": _arg("routing-proxy", "--secure-proxy=false", "--secure-proxy=true"),
    "the sidecar stops first": _sidecar_as_container,
    "no NIXL": _arg(
        "engine", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}', '{"kv_connector":"X"}'
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_miswired_decode_pod_is_caught(mistake: str) -> None:
    pod = render("pd-decode")
    MISTAKES[mistake](pod)
    assert decode_problems(pod) != []


def test_both_roles_share_a_namespace_and_keep_apart() -> None:
    """Applied together: no object of one replaces the other's, each role's Service and
    PodMonitor select its own pods only, one copy of the rules, the pod port the scheduler
    puts in x-prefiller-host-port is llmobs's on both, and both export traces to one place
    (the join across pods is the trace) under a name of their own."""
    decode, prefill = render("pd-decode"), render("pd-prefill")
    names = [
        (d["metadata"]["namespace"], d["kind"], d["metadata"]["name"])
        for d in [*decode.docs, *prefill.docs]
    ]
    assert len(names) == len(set(names))
    assert {n for n, _, _ in names} == {"llmobs"}
    for own, other in ((decode, prefill), (prefill, decode)):
        for kind, path in (("Service", ("selector",)), ("PodMonitor", ("selector", "matchLabels"))):
            selector = functools.reduce(lambda d, k: d[k], path, own.kinds[kind]["spec"])
            assert selector.items() <= own.labels.items(), kind
            assert not selector.items() <= other.labels.items(), kind
    assert [d["kind"] for d in [*decode.docs, *prefill.docs]].count("PrometheusRule") == 1
    assert decode.port("llmobs", "http") == prefill.port("llmobs", "http")
    nixl = [pod.args("engine")["--kv-transfer-config"] for pod in (decode, prefill)]
    assert nixl[0] == nixl[1]
    decode_env, prefill_env = decode.env("llmobs"), prefill.env("llmobs")
    endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert decode_env[endpoint] and decode_env[endpoint] == prefill_env[endpoint]
    assert decode_env["OTEL_SERVICE_NAME"] != prefill_env["OTEL_SERVICE_NAME"]
    assert decode.labels["llm-d.ai/role"] == "decode"
    assert prefill.labels["llm-d.ai/role"] == "prefill"


# --- both pods, run ----------------------------------------------------------------------


class _Running(Processes):
    """One pod's processes on this machine: each port the pod declares moved to a free one
    (the pods share this machine's loopback, not a network namespace each)."""

    def __init__(self, pod: Pod, folder: Path) -> None:
        super().__init__()
        self.pod, self.folder = pod, folder
        self.moved = {number: free_port() for number in pod.ports()}

    def here(self, value: str) -> str:
        """A value of the manifest (a URL, a flag, a port) with the pod's ports moved."""

        def swap(found: re.Match[str]) -> str:
            number = int(found.group(0))
            return str(self.moved.get(number, number))

        return re.sub(r"(?<![\w.])\d{2,5}(?![\w.])", swap, value)

    def url(self, container: str, name: str) -> str:
        return f"http://127.0.0.1:{self.moved[self.pod.port(container, name)]}"

    async def start(self, name: str, *argv: str, env: dict[str, str]) -> None:
        await self.spawn(argv, env, self.folder / f"{name}.log")

    async def run(self, role: str, clean: dict[str, str]) -> None:
        """vLLM (the sim in its role, on the port vLLM's args name) and llmobs (its
        environment as rendered, no collector to export to here)."""
        vllm = self.pod.args("engine")
        await self.start(
            f"{role}-engine", "sim", "--pd-role", role, "--host", "127.0.0.1",
            "--port", self.here(vllm["--port"]), env=clean,
        )  # fmt: skip
        env = {k: self.here(v) for k, v in self.pod.env("llmobs").items()}
        env = {k: v for k, v in env.items() if not k.startswith("OTEL_EXPORTER_")}
        env |= {"LLMOBS_HOST": "127.0.0.1", "LLMOBS_METRICS_HOST": "127.0.0.1",
                "LLMOBS_GPU_SAMPLE_INTERVAL": "0"}  # fmt: skip
        llmobs = self.pod.containers["llmobs"]
        await self.start(f"{role}-llmobs", *llmobs["args"], env={**clean, **env})

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in self.folder.glob("*.log")
        )


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """``name{label="value",...}`` -> value, from a /metrics."""
    async with session.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(samples: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, value in samples.items():
        sample, _, rest = key.partition("{")
        have = json.loads("{" + rest)
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


async def _ready(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url + "/readyz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_a_user_request_through_both_pods_is_one_users_and_two_legs(
    tmp_path: Path,
) -> None:
    """The scheduler's request, to the decode pod's port and naming the prefill pod's: the
    decode pod's llmobs counts one user's request (disaggregated), its decode leg (at the
    listener the sidecar's --vllm-port names) and joins them; the prefill pod's llmobs
    counts the prefill leg, and no user's request. A request with no prefiller is a whole
    one, its pass through the decode listener a local leg."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLMOBS_", "OTEL_"))}
    (tmp_path / "decode").mkdir()
    (tmp_path / "prefill").mkdir()
    decode = _Running(render("pd-decode"), tmp_path / "decode")
    prefill = _Running(render("pd-prefill"), tmp_path / "prefill")
    # llm-d's routing sidecar, where its flags say: it dials its decoder on localhost
    routing = decode.pod.args("routing-proxy")
    router = PdRouter(f"http://127.0.0.1:{decode.here(routing['--vllm-port'])}")
    runner = web.AppRunner(router.app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(decode.here(routing["--port"]))).start()
    try:
        await decode.run("decode", clean)
        await prefill.run("prefill", clean)
        async with aiohttp.ClientSession() as session:
            metrics = [p.url("llmobs", "metrics") for p in (decode, prefill)]
            async with asyncio.timeout(60):
                while not all([await _ready(session, url) for url in metrics]):
                    assert all(p.returncode is None for p in decode.procs + prefill.procs), (
                        decode.logs() + prefill.logs()
                    )
                    await asyncio.sleep(0.2)
            entry = decode.url("llmobs", "http")  # the Service's and the InferencePool's port
            # the scheduler names the prefill pod by its IP and the same port
            prefiller = prefill.url("llmobs", "http").removeprefix("http://")
            body = {"model": "m", "stream": True, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "abcd " * 40}]}  # fmt: skip
            for headers in ({"x-prefiller-host-port": prefiller}, {}):
                async with session.post(
                    entry + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
                    assert b"data: [DONE]" in await r.read()
            assert [leg.prefill_status for leg in router.legs] == [200]
            expected = {"disaggregated": 1.0, "decode_leg": 1.0, "local_leg": 1.0,
                        "prefill_leg": 1.0}  # fmt: skip
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # a record is made just after its response's end
                at_decode = await _scrape(session, metrics[0])
                at_prefill = await _scrape(session, metrics[1])
                roles = {
                    role: _total(at_decode, "llmobs_pd_requests_total", pd_role=role)
                    for role in ("disaggregated", "decode_leg", "local_leg")
                } | {"prefill_leg": _total(at_prefill, "llmobs_pd_requests_total")}
                if roles == expected or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert roles == expected, decode.logs() + prefill.logs()
            # two users' requests at the decode pod's door; legs never count as users'
            assert _total(at_decode, "llmobs_requests_total") == 2
            assert _total(at_prefill, "llmobs_requests_total") == 0
            assert _total(at_decode, "llmobs_pd_joins_total", result="joined") >= 1
            assert _total(at_decode, "llmobs_pd_joins_total", result="orphan_leg") == 0
    finally:
        await runner.cleanup()
        await decode.stop()
        await prefill.stop()


def test_the_overlays_render_unchanged_by_the_checks() -> None:
    """``render`` hands out copies: a test's change never reaches another's."""
    pod = render("pd-decode")
    MISTAKES["roles off"](pod)
    assert render("pd-decode").env("llmobs")["LLMOBS_PD_ROLES"] == "auto"
