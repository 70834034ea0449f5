"""The server's own wheel (``GET /v1/dist``), and providers whose cloud SDK is missing.

A launched machine installs the wheel the control plane serves, so its daemon runs the
server's exact code; the cloud SDKs come with extras, and a provider kind whose SDK is not
installed is refused at registration with a 422 naming the extra to install."""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile

import httpx
import pytest

from lakeshore.defaults import DIST_NAME
from lakeshore.distribution import build, own_wheel

PROVIDERS = "/v1/namespaces/default/providers"


async def test_the_wheel_is_described_and_served_with_its_checksum(
    api: httpx.AsyncClient,
) -> None:
    described = await api.get("/v1/dist")
    assert described.status_code == 200, described.text
    info = described.json()
    assert info["filename"] == f"lakeshore_queues-{info['version']}-py3-none-any.whl"
    served = await api.get(info["url"])
    assert served.status_code == 200, served.text
    assert served.headers["content-type"] == "application/octet-stream"
    assert hashlib.sha256(served.content).hexdigest() == info["sha256"]
    assert served.headers["x-checksum-sha256"] == info["sha256"]
    with zipfile.ZipFile(io.BytesIO(served.content)) as wheel:
        names = wheel.namelist()
        dist_info = f"lakeshore_queues-{info['version']}.dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        record = wheel.read(f"{dist_info}/RECORD").decode()
    assert f"Name: {DIST_NAME}" in metadata
    # code, templates, migrations and vendored assets: everything a daemon or server runs
    for shipped in (
        "lakeshore/api/routes/dist.py",
        "lakeshore/api/ui/templates/base.html",
        "lakeshore/store/migrations/script.py.mako",
        "lakeshore/py.typed",
    ):
        assert shipped in names
    assert any(n.startswith("lakeshore/api/ui/static/vendor/htmx-") for n in names)
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert "lakeshore = lakeshore.cli.main:main" in wheel_entry_points(served.content)
    assert all(name in record for name in names if not name.endswith("RECORD"))


def wheel_entry_points(data: bytes) -> str:
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        [entry_points] = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
        return wheel.read(entry_points).decode()


def test_the_wheel_is_reproducible() -> None:
    """Replicas running the same code serve the same bytes, so a start-up script written
    by one replica checks out against the wheel fetched from another."""
    assert build().data == build().data == own_wheel().data


async def test_the_wheel_needs_a_token_and_its_own_name(api: httpx.AsyncClient) -> None:
    info = (await api.get("/v1/dist")).json()
    anonymous = await api.get(info["url"], headers={"Authorization": ""})
    assert anonymous.status_code == 401
    other = await api.get("/v1/dist/lakeshore-9.9.9-py3-none-any.whl")
    assert other.status_code == 404
    assert info["filename"] in other.json()["error"]["message"]


@pytest.mark.parametrize(
    ("kind", "module", "extra", "config"),
    [
        ("ec2", "boto3", "aws", {"region": "us-east-1"}),
        ("gce", "google.cloud.compute_v1", "gcp", {"project": "p", "zone": "europe-west1-b"}),
        ("kube", "kubernetes", "kube", {}),
    ],
)
async def test_a_provider_whose_sdk_is_missing_is_refused_naming_its_extra(
    api: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    module: str,
    extra: str,
    config: dict[str, str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import fails
    refused = await api.post(PROVIDERS, json={"name": "cloud", "kind": kind, "config": config})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert f"pip install '{DIST_NAME}[{extra}]'" in error["message"], error
    assert (await api.get(PROVIDERS)).json()["providers"] == []
    monkeypatch.delitem(sys.modules, module)  # installed again: the same body registers
    if kind == "kube":
        return  # kube's config needs a cluster's; the refusal above is what is tested
    accepted = await api.post(PROVIDERS, json={"name": "cloud", "kind": kind, "config": config})
    assert accepted.status_code == 201, accepted.text
