from __future__ import annotations

import grp
import json
import os
import socket
from dataclasses import dataclass, field

import aiohttp
import pytest

from elasticd.api.server import AdminApi, SocketInUse, json_in_slices


@dataclass
class Outcome:
    ok: bool
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)


class FakeControl:
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.reloads = 0

    async def status_in_slices(self):
        return {"pid": 1, "tenants": {}}

    async def reload(self, everything: bool = False):
        self.reloads += 1
        self.everything = everything
        return self.outcome


async def _call(path: str, method: str, url: str):
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session, \
            session.request(method, f"http://elasticd{url}") as response:
        return response.status, await response.json()


async def test_routes_and_refusals(tmp_path):
    control = FakeControl(Outcome(ok=False, error="tenants.acme (line 3): bad"))
    api = AdminApi(control, str(tmp_path / "run" / "admin.sock"))
    await api.start()
    try:
        assert oct(os.stat(api.path).st_mode & 0o777) == "0o600"
        assert await _call(api.path, "GET", "/v1/status") == (200, {"pid": 1, "tenants": {}})
        code, body = await _call(api.path, "POST", "/v1/reload")
        assert (code, body["ok"], body["error"]) == (422, False, "tenants.acme (line 3): bad")
        control.outcome = Outcome(ok=True, problems=["note"])
        assert await _call(api.path, "POST", "/v1/reload") == (200, {"ok": True, "problems": ["note"], "written": []})
        assert control.everything is False
        assert (await _call(api.path, "POST", "/v1/reload?all=1"))[0] == 200 and control.everything is True
        assert (await _call(api.path, "POST", "/v1/reload?all=yes"))[0] == 400
        code, body = await _call(api.path, "GET", "/v1/nothing")
        assert code == 404 and "GET /v1/nothing" in body["error"]
        code, body = await _call(api.path, "GET", "/v1/reload")
        assert code == 405
        # A second daemon must not steal the socket of one that runs.
        with pytest.raises(SocketInUse):
            await AdminApi(control, api.path).start()
    finally:
        await api.stop()
    assert not os.path.exists(api.path)


async def test_admin_group_widens_to_0660(tmp_path):
    group = grp.getgrgid(os.getgid()).gr_name
    api = AdminApi(FakeControl(Outcome(ok=True)), str(tmp_path / "admin.sock"), group)
    await api.start()
    try:
        st = os.stat(api.path)
        assert oct(st.st_mode & 0o777) == "0o660"
        assert st.st_gid == os.getgid()
    finally:
        await api.stop()


async def test_unknown_group_is_refused(tmp_path):
    api = AdminApi(FakeControl(Outcome(ok=True)), str(tmp_path / "admin.sock"), "no-such-group-here")
    with pytest.raises(ValueError, match='no group "no-such-group-here"'):
        await api.start()


def test_stale_socket_is_replaced(tmp_path):
    path = tmp_path / "admin.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody answers: what a crash leaves
    from elasticd.api.server import _claim_socket_path
    _claim_socket_path(str(path))
    assert not path.exists()


def test_openapi_describes_every_route():
    from pathlib import Path

    from ruamel.yaml import YAML

    import elasticd.api.server as server
    spec = YAML(typ="safe").load(Path(server.__file__).with_name("openapi.yaml").read_text())
    described = {(path, method.upper()) for path, item in spec["paths"].items() for method in item}
    app = AdminApi(FakeControl(Outcome(ok=True)), "/unused")._app()
    served = {(r.resource.canonical, r.method) for r in app.router.routes() if r.method != "HEAD"}
    assert served == described


@pytest.mark.parametrize("value", [
    {"tenants": {}},
    {"pid": 1, "tenants": {}},
    {"pid": 1, "name": "caf\u00e9 \"x\"", "tenants": {"acme": {"apps": {"shop": [1, 2.5, None, True]}},
                                                       "b\u00e9ta": {"limits": {"cpu": "50%"}}}},
    {"tenants": {f"t{i:04d}": {"apps": {f"a{j}": {"workers": []} for j in range(5)}} for i in range(3000)}},
])
async def test_a_status_is_encoded_in_slices_as_json_dumps_would(value) -> None:
    assert await json_in_slices(value, "tenants") == json.dumps(value).encode()


async def test_json_in_slices_wants_its_mapping_last() -> None:
    with pytest.raises(ValueError, match="last key"):
        await json_in_slices({"tenants": {}, "pid": 1}, "tenants")
