"""The Redfish client against a local HTTP(S) server answering with the DMTF public-rackmount1
mockup's resources (tests/fixtures/rollout/redfish-*.out) and real BMC task bodies."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import pickle
import re
import ssl
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from gpuctl.rollout import redfish
from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.validation.capture import capture_output

FIX = ROOT / "tests" / "fixtures" / "rollout"
USER = "admin"
PASSWORD = "s3cr3t-Pa55w0rd"  # noqa: S105 - test value, checked never to leak
IMAGE_PASSWORD = "img-Pa55-9f3"  # noqa: S105 - test value
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()  # the Basic credential

Reply = tuple[int, dict[str, str], bytes]


def fixture_json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(capture_output(FIX / name))
    return data


UPDATE = "/redfish/v1/UpdateService"
MOCKUP = {  # path -> fixture name (redfish-<name>-rackmount1.out)
    UPDATE: "updateservice",
    f"{UPDATE}/FirmwareInventory": "firmwareinventory-collection",
    f"{UPDATE}/FirmwareInventory/BMC": "softwareinventory-bmc",
    f"{UPDATE}/FirmwareInventory/SS": "softwareinventory-ss",
    f"{UPDATE}/FirmwareInventory/BIOS": "softwareinventory-bios",
    f"{UPDATE}/SimpleUpdateActionInfo": "simpleupdate-actioninfo",
    "/redfish/v1/Managers": "managers-collection",
    "/redfish/v1/Managers/BMC": "manager-bmc",
    "/redfish/v1/Systems/437XR1138R2": "system-437xr1138r2",
    "/redfish/v1/TaskService/Tasks/545": "task-545-completed",
}


def json_reply(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return (
        status,
        {"Content-Type": "application/json", **(headers or {})},
        json.dumps(data).encode(),
    )


def redfish_error(status: int, message: str) -> Reply:
    body = {
        "error": {
            "code": "Base.1.8.GeneralError",
            "message": "See @Message.ExtendedInfo",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.GeneralError", "Message": message}],
        }
    }
    return json_reply(body, status)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Bmc:
    """A fake BMC: static mockup resources plus per-test handlers; every request is recorded."""

    url: str = ""
    routes: dict[tuple[str, str], Callable[[Seen], Reply]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def static(self, path: str, data: Any) -> None:
        self.routes[("GET", path)] = lambda _req: json_reply(data)

    def sequence(self, method: str, path: str, replies: list[Reply]) -> None:
        """Answer ``replies`` in order, repeating the last one."""
        queue = list(replies)

        def answer(_req: Seen) -> Reply:
            return queue.pop(0) if len(queue) > 1 else queue[0]

        self.routes[(method, path)] = answer


def _handler(bmc: Bmc) -> type[BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            req = Seen(self.command, self.path, headers, body)
            bmc.seen.append(req)
            sent = self.headers.get("Authorization", "Basic ")
            if sent != expected:  # echo what was sent, as a careless BMC might
                echoed = base64.b64decode(sent[6:]).decode(errors="replace")
                status, headers, data = redfish_error(401, f"Invalid credentials: {echoed}")
            elif (self.command, self.path) in bmc.routes:
                status, headers, data = bmc.routes[(self.command, self.path)](req)
            else:
                status, headers, data = redfish_error(404, f"no resource {self.path}")
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _serve
        do_POST = _serve

    return Handler


def _serve(bmc: Bmc, tls: ssl.SSLContext | None = None) -> Iterator[Bmc]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(bmc))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    bmc.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield bmc
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def bmc() -> Iterator[Bmc]:
    fake = Bmc()
    for path, name in MOCKUP.items():
        fake.static(path, fixture_json(f"redfish-{name}-rackmount1.out"))
    yield from _serve(fake)


def client_for(bmc: Bmc, password: str = PASSWORD) -> redfish.RedfishClient:
    endpoint = redfish.BmcEndpoint(bmc.url, allow_plain_http=True)  # test-only plain HTTP
    return redfish.RedfishClient(endpoint, redfish.Credentials(USER, password), timeout_s=10)


def assert_no_secret(*objects: object) -> None:
    for obj in objects:
        texts = [str(obj), repr(obj)]
        if isinstance(obj, BaseException):
            texts.append("".join(traceback.format_exception(obj)))
            texts.append(repr(vars(obj)) if hasattr(obj, "__dict__") else "")
            assert obj.__context__ is None
            assert obj.__cause__ is None
        for text in texts:
            assert PASSWORD not in text, text
            assert IMAGE_PASSWORD not in text, text
            assert TOKEN not in text, text


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# ------------------------------------------------------------------------------------------
# credentials and endpoints


def test_credentials_never_show_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    creds = redfish.Credentials(USER, PASSWORD)
    assert repr(creds) == str(creds) == "Credentials(username='admin', password=<hidden>)"
    assert f"{creds}" == str(creds)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(creds)
    monkeypatch.delenv("BMC_USER", raising=False)
    monkeypatch.setenv("BMC_PASS", PASSWORD)
    with pytest.raises(redfish.RedfishError, match=r"not set: BMC_USER$") as info:
        redfish.Credentials.from_env("BMC_USER", "BMC_PASS")
    assert_no_secret(info.value)
    monkeypatch.setenv("BMC_USER", USER)
    loaded = redfish.Credentials.from_env("BMC_USER", "BMC_PASS")
    assert (loaded.username, loaded.secret()) == (USER, PASSWORD)
    client = redfish.RedfishClient(redfish.BmcEndpoint("https://bmc.example:8443"), loaded)
    assert repr(client) == "RedfishClient('https://bmc.example:8443', user='admin')"
    assert_no_secret(client, loaded)


def test_endpoint_rules() -> None:
    with pytest.raises(ValueError, match="allow_plain_http"):
        redfish.BmcEndpoint("http://10.0.0.9")
    for url in (f"https://admin:{PASSWORD}@10.0.0.9", f"ftp://admin:{PASSWORD}@10.0.0.9/x"):
        with pytest.raises(ValueError, match="they go in Credentials") as info:
            redfish.BmcEndpoint(url)
        assert_no_secret(info.value)
    with pytest.raises(ValueError, match="host and port only"):
        redfish.BmcEndpoint("https://10.0.0.9/redfish/v1")
    with pytest.raises(ValueError, match="https://host"):
        redfish.BmcEndpoint("ftp://10.0.0.9")
    endpoint = redfish.BmcEndpoint("https://10.0.0.9/")
    assert endpoint.url == "https://10.0.0.9"
    assert endpoint.verify_tls is True
    context = endpoint.ssl_context()
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    unverified = redfish.BmcEndpoint("https://10.0.0.9", verify_tls=False).ssl_context()
    assert unverified is not None
    assert unverified.verify_mode == ssl.CERT_NONE


# ------------------------------------------------------------------------------------------
# inventory and versions


def test_firmware_inventory_from_the_dmtf_mockup(bmc: Bmc) -> None:
    client = client_for(bmc)
    items = redfish.firmware_inventory(client)
    assert [(i.id, i.version, i.updateable, i.state) for i in items] == [
        ("BMC", "1.45.455b66-rev4", True, "Enabled"),
        ("SS", "2.50", True, "Enabled"),
        ("BIOS", "P79 v1.45", True, "Enabled"),
    ]  # the collection's Members@odata.count says 2: the list is what counts
    assert items[0].related == ("/redfish/v1/Managers/BMC",)
    assert redfish.inventory_version(items, "BIOS") == "P79 v1.45"
    with pytest.raises(redfish.RedfishProtocolError, match="no GPU_0 \\(members: BMC, SS, BIOS\\)"):
        redfish.inventory_version(items, "GPU_0")
    assert redfish.manager_id(client) == "BMC"
    assert redfish.manager_firmware_version(client) == "1.45.455b66-rev4"
    assert redfish.bmc_versions(client, "BMC") == Versions("1.45.455b66-rev4", None)
    first = bmc.seen[0]
    assert first.headers["odata-version"] == "4.0"
    assert first.headers["accept"] == "application/json"


def test_collection_paging_and_loops(bmc: Bmc) -> None:
    bmc.static(
        "/redfish/v1/Things",
        {"Members": [{"@odata.id": "/a"}], "Members@odata.nextLink": "/redfish/v1/Things?$skip=1"},
    )
    bmc.static("/redfish/v1/Things?$skip=1", {"Members": [{"@odata.id": "/b"}]})
    client = client_for(bmc)
    assert redfish.collection_members(client, "/redfish/v1/Things") == ["/a", "/b"]
    bmc.static("/redfish/v1/Loop", {"Members": [], "Members@odata.nextLink": "/redfish/v1/Loop"})
    with pytest.raises(redfish.RedfishProtocolError, match="nextLink loop"):
        redfish.collection_members(client, "/redfish/v1/Loop")


def test_missing_version_and_bad_answers(bmc: Bmc) -> None:
    manager = fixture_json("redfish-manager-bmc-rackmount1.out")
    del manager["FirmwareVersion"]
    bmc.static("/redfish/v1/Managers/Other", manager)
    client = client_for(bmc)
    with pytest.raises(redfish.RedfishProtocolError, match="Managers/Other: no FirmwareVersion"):
        redfish.manager_firmware_version(client, "Other")
    bmc.routes[("GET", "/redfish/v1/Html")] = lambda _r: (200, {}, b"<html>login</html>")
    with pytest.raises(
        redfish.RedfishProtocolError, match="GET /redfish/v1/Html: answer is not JSON"
    ):
        client.get("/redfish/v1/Html")
    with pytest.raises(
        redfish.RedfishHTTPError, match="HTTP 404: no resource /redfish/v1/Nope"
    ) as info:
        client.get("/redfish/v1/Nope")
    assert info.value.status == 404
    assert isinstance(info.value, BackendError)


# ------------------------------------------------------------------------------------------
# updates and tasks

HGX_TASK = "redfish-task-running-hgx-update-fw-202-body.out"


def test_simple_update_and_task_to_completed(bmc: Bmc) -> None:
    running = capture_output(FIX / HGX_TASK).encode()
    bmc.routes[("POST", "/redfish/v1/UpdateService/Actions/SimpleUpdate")] = lambda _r: (
        202,
        {
            "Location": "/redfish/v1/TaskService/TaskMonitors/HGX_9",
            "Content-Type": "application/json",
        },
        running,
    )
    completed = fixture_json("redfish-task-545-completed-rackmount1.out")
    bmc.sequence(
        "GET",
        "/redfish/v1/TaskService/Tasks/HGX_9",
        [
            (200, {"Retry-After": "7"}, running),
            (200, {}, running),
            json_reply(completed),
        ],
    )
    client = client_for(bmc)
    task = redfish.simple_update(
        client,
        "https://images.example/bmc-1.46.bin",
        transfer_protocol="HTTPS",
        targets=["/redfish/v1/UpdateService/FirmwareInventory/BMC"],
    )
    assert task == redfish.TaskRef(
        "/redfish/v1/TaskService/Tasks/HGX_9", "/redfish/v1/TaskService/TaskMonitors/HGX_9"
    )
    post = next(r for r in bmc.seen if r.method == "POST")
    assert json.loads(post.body) == {
        "ImageURI": "https://images.example/bmc-1.46.bin",
        "TransferProtocol": "HTTPS",
        "Targets": ["/redfish/v1/UpdateService/FirmwareInventory/BMC"],
    }
    assert post.headers["content-type"] == "application/json"
    time = FakeClock()
    result = redfish.wait_for_task(
        client, task, timeout_s=600, poll_s=5, clock=time.clock, sleep=time.sleep
    )
    assert result == redfish.TaskResult(
        "Completed",
        "OK",
        None,
        ("The property SKU is a read only property and cannot be assigned a value",),
    )
    assert time.sleeps == [7.0, 5.0]  # Retry-After first, then the caller's interval


def test_simple_update_checks_action_info(bmc: Bmc) -> None:
    client = client_for(bmc)
    with pytest.raises(
        redfish.RedfishProtocolError,
        match="TransferProtocol NFS not allowed \\(allowed: FTP, SFTP, HTTP, HTTPS, SCP, TFTP\\)",
    ):
        redfish.simple_update(client, "nfs://x/y.bin", transfer_protocol="NFS")
    assert not any(r.method == "POST" for r in bmc.seen)
    service = fixture_json("redfish-updateservice-rackmount1.out")
    del service["Actions"]["#UpdateService.SimpleUpdate"]
    bmc.static("/redfish/v1/UpdateService", service)
    with pytest.raises(
        redfish.RedfishProtocolError, match=r"no #UpdateService\.SimpleUpdate action"
    ):
        redfish.simple_update(client, "https://images.example/x.bin")


def test_task_exception_is_a_failure_and_redacted(bmc: Bmc) -> None:
    bmc.routes[("POST", "/redfish/v1/UpdateService/Actions/SimpleUpdate")] = lambda _r: json_reply(
        {"@odata.id": "/redfish/v1/TaskService/Tasks/7", "TaskState": "Running"}, 202
    )
    bmc.static(
        "/redfish/v1/TaskService/Tasks/7",
        {
            "@odata.id": "/redfish/v1/TaskService/Tasks/7",
            "TaskState": "Exception",
            "TaskStatus": "Critical",
            "PercentComplete": 40,
            "Messages": [
                {"Message": f"Transfer of sftp://fw:{IMAGE_PASSWORD}@images/x.bin failed"}
            ],
        },
    )
    client = client_for(bmc)
    task = redfish.simple_update(
        client,
        "sftp://images/x.bin",
        transfer_protocol="SFTP",
        image_credentials=redfish.Credentials("fw", IMAGE_PASSWORD),
    )
    post = next(r for r in bmc.seen if r.method == "POST")
    assert json.loads(post.body)["Password"] == IMAGE_PASSWORD  # sent to the BMC, nowhere else
    assert task == redfish.TaskRef("/redfish/v1/TaskService/Tasks/7", None)
    with pytest.raises(
        redfish.RedfishTaskFailed,
        match=re.escape(
            "ended Exception (TaskStatus Critical): Transfer of sftp://fw:***@images/x.bin failed"
        ),
    ) as info:
        redfish.wait_for_task(client, task, timeout_s=60, sleep=lambda _s: None)
    assert (info.value.state, info.value.status) == ("Exception", "Critical")
    assert_no_secret(info.value, task, client)


def test_task_timeout_is_bounded(bmc: Bmc) -> None:
    running = json.loads(capture_output(FIX / HGX_TASK))
    bmc.static("/redfish/v1/TaskService/Tasks/HGX_9", {**running, "PercentComplete": 35})
    time = FakeClock()
    task = redfish.TaskRef("/redfish/v1/TaskService/Tasks/HGX_9", None)
    with pytest.raises(redfish.RedfishTimeout, match="still Running \\(35%\\) after 30 s"):
        redfish.wait_for_task(
            client_for(bmc), task, timeout_s=30, poll_s=10, clock=time.clock, sleep=time.sleep
        )
    assert time.sleeps == [10.0, 10.0, 10.0]
    gets = [r for r in bmc.seen if r.path.endswith("HGX_9")]
    assert len(gets) == 4


def test_task_monitor_only(bmc: Bmc) -> None:
    """A monitor that answers 202 while running, then the operation's own 204 (DSP0266)."""
    bmc.routes[("POST", "/redfish/v1/Managers/BMC/Actions/Manager.Reset")] = lambda _r: (
        202,
        {"Location": "/redfish/v1/TaskService/TaskMonitors/3"},
        b"",
    )
    bmc.sequence(
        "GET",
        "/redfish/v1/TaskService/TaskMonitors/3",
        [(202, {}, b""), (202, {}, b""), (204, {}, b"")],
    )
    client = client_for(bmc)
    task = redfish.reset_manager(client, "BMC", "GracefulRestart")
    assert task == redfish.TaskRef(None, "/redfish/v1/TaskService/TaskMonitors/3")
    post = next(r for r in bmc.seen if r.method == "POST")
    assert json.loads(post.body) == {"ResetType": "GracefulRestart"}
    result = redfish.wait_for_task(client, task, timeout_s=60, sleep=lambda _s: None)
    assert result == redfish.TaskResult("Completed", "OK")


def test_resets_check_allowable_values(bmc: Bmc) -> None:
    bmc.routes[("POST", "/redfish/v1/Systems/437XR1138R2/Actions/ComputerSystem.Reset")] = (
        lambda _r: (204, {}, b"")
    )
    client = client_for(bmc)
    assert redfish.reset_system(client, "437XR1138R2", "ForceRestart") is None
    with pytest.raises(redfish.RedfishProtocolError, match="ResetType PowerCycle not allowed"):
        redfish.reset_system(client, "437XR1138R2", "PowerCycle")
    with pytest.raises(
        redfish.RedfishProtocolError,
        match="ResetType On not allowed \\(allowed: ForceRestart, GracefulRestart\\)",
    ):
        redfish.reset_manager(client, "BMC", "On")
    posts = [json.loads(r.body) for r in bmc.seen if r.method == "POST"]
    assert posts == [{"ResetType": "ForceRestart"}]


def test_multipart_push(bmc: Bmc, tmp_path: Path) -> None:
    client = client_for(bmc)
    image = tmp_path / "bmc-fw.bin"
    image.write_bytes(b"\x00\x01firmware\xff" * 1000)
    with pytest.raises(redfish.RedfishProtocolError, match="no MultipartHttpPushUri"):
        redfish.multipart_update(client, image)
    service = fixture_json("redfish-updateservice-rackmount1.out")
    # the URI nvfwupd's config.yaml names as the usual MultipartHttpPushUri
    service["MultipartHttpPushUri"] = "/redfish/v1/UpdateService/update-multipart"
    bmc.static("/redfish/v1/UpdateService", service)
    bmc.routes[("POST", "/redfish/v1/UpdateService/update-multipart")] = lambda _r: json_reply(
        {"@odata.id": "/redfish/v1/TaskService/Tasks/0", "TaskState": "New"},
        202,
        {"Location": "/redfish/v1/TaskService/Tasks/0/Monitor"},
    )
    task = redfish.multipart_update(
        client,
        image,
        targets=["/redfish/v1/UpdateService/FirmwareInventory/BMC"],
        apply_time="Immediate",
    )
    assert task == redfish.TaskRef(
        "/redfish/v1/TaskService/Tasks/0", "/redfish/v1/TaskService/Tasks/0/Monitor"
    )
    post = next(r for r in bmc.seen if r.method == "POST")
    boundary = post.headers["content-type"].split("boundary=", 1)[1]
    assert int(post.headers["content-length"]) == len(post.body)
    parts = post.body.split(f"--{boundary}".encode())
    assert parts[-1] == b"--\r\n"
    assert len(parts) == 4
    params_head, params = parts[1].split(b"\r\n\r\n", 1)
    assert b'name="UpdateParameters"' in params_head
    assert json.loads(params) == {
        "Targets": ["/redfish/v1/UpdateService/FirmwareInventory/BMC"],
        "@Redfish.OperationApplyTime": "Immediate",
    }
    file_head, content = parts[2].split(b"\r\n\r\n", 1)
    assert b'name="UpdateFile"; filename="bmc-fw.bin"' in file_head
    assert content == image.read_bytes() + b"\r\n"


def test_other_hosts_and_redirects_are_refused(bmc: Bmc) -> None:
    bmc.routes[("POST", "/redfish/v1/UpdateService/Actions/SimpleUpdate")] = lambda _r: (
        202,
        {"Location": "http://evil.example/redfish/v1/TaskService/TaskMonitors/1"},
        b"",
    )
    bmc.routes[("GET", "/redfish/v1/Moved")] = lambda _r: (
        302,
        {"Location": "http://evil.example/redfish/v1/Moved"},
        b"",
    )
    client = client_for(bmc)
    with pytest.raises(redfish.RedfishProtocolError, match=r"URI on another host .*evil\.example"):
        redfish.simple_update(client, "https://images.example/x.bin")
    with pytest.raises(redfish.RedfishHTTPError, match="HTTP 302") as info:
        client.get("/redfish/v1/Moved")
    assert_no_secret(info.value)


def test_wrong_password_error_is_redacted(bmc: Bmc) -> None:
    wrong = PASSWORD + "-old"
    client = client_for(bmc, password=wrong)
    with pytest.raises(
        redfish.RedfishHTTPError, match="HTTP 401: Invalid credentials: admin:\\*\\*\\*"
    ) as info:
        redfish.manager_firmware_version(client, "BMC")
    assert wrong not in str(info.value)
    assert wrong not in repr(info.value)
    assert info.value.status == 401
    assert_no_secret(info.value)
    # the fake BMC echoes whatever it is sent: the right password, redacted too
    bmc.routes[("POST", "/redfish/v1/UpdateService/Actions/SimpleUpdate")] = lambda req: (
        redfish_error(
            400, f"Bad request body {req.body.decode()} from {req.headers['authorization']}"
        )
    )
    good = client_for(bmc)
    with pytest.raises(redfish.RedfishHTTPError, match="HTTP 400") as info2:
        redfish.simple_update(
            good,
            "https://images.example/x.bin",
            image_credentials=redfish.Credentials("fw", IMAGE_PASSWORD),
        )
    assert_no_secret(info2.value)
    assert "***" in str(info2.value)


def test_unreachable_bmc() -> None:
    endpoint = redfish.BmcEndpoint("http://127.0.0.1:9", allow_plain_http=True)
    client = redfish.RedfishClient(endpoint, redfish.Credentials(USER, PASSWORD), timeout_s=2)
    with pytest.raises(redfish.RedfishError, match="GET /redfish/v1/Managers/BMC") as info:
        redfish.manager_firmware_version(client, "BMC")
    assert_no_secret(info.value)


# ------------------------------------------------------------------------------------------
# TLS: verification on by default, a CA bundle per BMC, an explicit opt-out


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    crypto = pytest.importorskip("cryptography")
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-bmc")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "bmc.pem", tmp_path / "bmc.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_verification(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    fake = Bmc()
    fake.static("/redfish/v1/Managers/BMC", fixture_json("redfish-manager-bmc-rackmount1.out"))
    for served in _serve(fake, tls=context):
        creds = redfish.Credentials(USER, PASSWORD)
        default = redfish.RedfishClient(redfish.BmcEndpoint(served.url), creds, timeout_s=5)
        with pytest.raises(redfish.RedfishTLSError, match="certificate verify failed") as info:
            redfish.manager_firmware_version(default, "BMC")
        assert_no_secret(info.value)
        assert served.seen == []  # nothing (no Authorization header) reached the server
        pinned = redfish.RedfishClient(
            redfish.BmcEndpoint(served.url, ca_bundle=str(cert)), creds, timeout_s=5
        )
        assert redfish.manager_firmware_version(pinned, "BMC") == "1.45.455b66-rev4"
        opted_out = redfish.RedfishClient(
            redfish.BmcEndpoint(served.url, verify_tls=False), creds, timeout_s=5
        )
        assert redfish.manager_firmware_version(opted_out, "BMC") == "1.45.455b66-rev4"
        assert len(served.seen) == 2
