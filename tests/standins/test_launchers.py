"""The executable launchers start each stand-in as its own process (as the dev stack does)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.standins.support import launch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(sys.platform == "win32", reason="bash launchers")
def test_graph_standin_launcher(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, url = launch("graph_standin", "--token", "tok")
    processes.append(proc)
    path = url + "/v23.0/106500000000001/messages"
    body = {"messaging_product": "whatsapp", "to": "5491155550001", "text": {"body": "hi"}}
    headers = {"Authorization": "Bearer tok"}
    assert httpx.post(path, json=body, headers=headers).status_code == 200
    control = httpx.post(url + "/_control", json={"op": "fail", "code": 131056})
    assert control.json()["ok"]
    response = httpx.post(path, json=body, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == 131056
    requests = httpx.get(url + "/_requests").json()["requests"]
    assert [r["status"] for r in requests] == [200, 400]


@pytest.mark.skipif(sys.platform == "win32", reason="bash launchers")
def test_anthropic_standin_launcher(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, url = launch("anthropic_standin", "--api-key", "k", "--reply", "scripted")
    processes.append(proc)
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        first = client.messages.create(
            model="m", max_tokens=9, messages=[{"role": "user", "content": "hola"}]
        )
        assert first.content[0].type == "text" and first.content[0].text == "scripted"
        httpx.post(url + "/_control", json={"op": "fail", "error": "overloaded"})
        with pytest.raises(anthropic.OverloadedError):
            client.messages.create(
                model="m", max_tokens=9, messages=[{"role": "user", "content": "hola"}]
            )


@pytest.mark.skipif(sys.platform == "win32", reason="bash launchers")
def test_transcribe_standin_launcher(processes: list[subprocess.Popen[bytes]]) -> None:
    proc, url = launch("transcribe_standin", "--key", "k", "--text", "hola")
    processes.append(proc)
    path = url + "/v1/audio/transcriptions"
    files = {"file": ("voice.ogg", b"OggS...", "audio/ogg")}
    ok = httpx.post(
        path, files=files, data={"model": "whisper-1"}, headers={"Authorization": "Bearer k"}
    )
    assert ok.status_code == 200 and ok.json() == {"text": "hola"}
    # No key: 401; no model: 400; a fault from /_control: its status.
    assert httpx.post(path, files=files, data={"model": "whisper-1"}).status_code == 401
    assert httpx.post(path, files=files, headers={"Authorization": "Bearer k"}).status_code == 400
    assert httpx.post(url + "/_control", json={"op": "fail", "status": 503}).json()["ok"]
    failed = httpx.post(
        path, files=files, data={"model": "m"}, headers={"Authorization": "Bearer k"}
    )
    assert failed.status_code == 503


@pytest.mark.skipif(sys.platform == "win32", reason="bash launchers")
def test_graph_standin_serves_media_registered_over_http(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    proc, url = launch("graph_standin", "--token", "tok")
    processes.append(proc)
    data = b"\x89PNG\r\n\x1a\nfoto"
    media = {
        "op": "media",
        "media_id": "777",
        "data_b64": "iVBORw0KGgpmb3Rv",
        "mime_type": "image/png",
    }
    assert httpx.post(url + "/_control", json=media).json()["ok"]
    auth = {"Authorization": "Bearer tok"}
    info = httpx.get(url + "/v23.0/777", headers=auth).json()
    assert (info["mime_type"], info["file_size"], info["id"]) == ("image/png", len(data), "777")
    assert httpx.get(info["url"]).status_code == 401  # the url wants the token too
    download = httpx.get(info["url"], headers=auth)
    assert download.content == data and download.headers["content-type"] == "image/png"
    unknown = httpx.get(url + "/v23.0/778", headers=auth)
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == 100
