"""SIMULATION: Redfish over HTTPS for the lab BMCs: one ThreadingHTTPServer per BMC address,
all in one process (:class:`BmcService`)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from gpuctl.lab.sim.bmc.node import BmcSpec, LabBmc, Timing
from gpuctl.lab.sim.bmc.power import PowerControl
from gpuctl.lab.sim.bmc.protocol import (
    APPLY_TIMES,
    MANAGER_RESET,
    MANAGER_RESET_TYPES,
    MAX_UPLOAD,
    MULTIPART_PUSH,
    SERVICE_ROOT,
    SYSTEM_RESET,
    SYSTEM_RESET_TYPES,
    TASK_MONITORS,
    TASKS,
    BadRequest,
    message_info,
    parse_multipart,
)
from gpuctl.lab.system import LabError

LOG = logging.getLogger("gpuctl.lab.sim.bmc")

PORT: Final = 443
ALLOWED_NETWORK: Final = ipaddress.ip_network("198.18.0.0/15")
TEST_ADDRESS: Final = "127.0.0.1"


# ------------------------------------------------------------------------------------------
# HTTP


def _normalise(raw_path: str) -> str:
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    path = re.sub("/+", "/", path)
    return path.rstrip("/") or "/"


class _Handler(BaseHTTPRequestHandler):
    """Redfish over HTTP/1.1 for one BMC (the server's ``bmc``)."""

    server: _BmcServer
    protocol_version = "HTTP/1.1"
    server_version = "gpuctl-lab-bmc/1"
    sys_version = ""
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        # http.server's line: client, request line, status (never a header)
        LOG.info("%s %s %s", self.server.bmc.spec.address, self.address_string(), format % args)

    # -- answers ------------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: dict[str, Any] | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = b"" if body is None else json.dumps(body, indent=1).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("OData-Version", "4.0")
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _error(
        self, status: int, message_id: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        body = {
            "error": {
                "code": message_id,
                "message": message,
                "@Message.ExtendedInfo": [
                    message_info(message_id, message, "Critical" if status >= 500 else "Warning")
                ],
            }
        }
        self._send(status, body, headers)

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        ok = False
        if scheme.lower() == "basic":
            try:
                user, sep, password = (
                    base64.b64decode(token.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError, ValueError):
                user, sep, password = "", "", ""
            service = self.server.service
            ok = bool(sep) and (
                hmac.compare_digest(user.encode(), service.username.encode())
                & hmac.compare_digest(password.encode(), service.password.encode())
            )
        if not ok:
            self._drain()
            self._error(
                401,
                "Base.1.18.NoValidSession",
                "There is no valid session established with the implementation "
                "(HTTP Basic authentication required).",
                {"WWW-Authenticate": 'Basic realm="Redfish"'},
            )
        return ok

    def _drain(self, limit: int = 1 << 20) -> None:
        """Read and drop a request body not used (closing with it unread would reset the
        connection before the client reads the answer); a larger one closes the connection."""
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") or not 0 <= length <= limit:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "chunked bodies are not supported", 411)
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "bad Content-Length")
        if length > MAX_UPLOAD:
            self.close_connection = True
            raise BadRequest(
                "Base.1.18.PayloadTooLarge",
                f"the body is larger than {MAX_UPLOAD} bytes",
                413,
            )
        data = self.rfile.read(length) if length else b""
        if len(data) != length:
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "the body ended early")
        return data

    def _json_body(self) -> dict[str, Any]:
        data = self._body()
        try:
            body = json.loads(data) if data.strip() else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise BadRequest("Base.1.18.MalformedJSON", "The request body is not a JSON object.")
        return body

    # -- methods ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(self._get)

    def do_HEAD(self) -> None:
        self._dispatch(self._get)

    def do_POST(self) -> None:
        self._dispatch(self._post)

    def do_PATCH(self) -> None:
        self._dispatch(self._not_allowed)

    def do_PUT(self) -> None:
        self._dispatch(self._not_allowed)

    def do_DELETE(self) -> None:
        self._dispatch(self._not_allowed)

    def _dispatch(self, method: Callable[[str], None]) -> None:
        path = _normalise(self.path)
        try:
            if path in ("/redfish", SERVICE_ROOT) and self.command in ("GET", "HEAD"):
                method(path)  # the service root needs no authentication (DSP0266)
            elif self._authorised():
                method(path)
        except BadRequest as exc:
            self._error(exc.status, exc.message_id, exc.message)

    def _not_allowed(self, path: str) -> None:
        self._drain()
        self._error(405, "Base.1.18.OperationNotAllowed", f"{self.command} is not allowed here.")

    def _get(self, path: str) -> None:
        bmc = self.server.bmc
        if path == "/redfish":
            self._send(200, {"v1": f"{SERVICE_ROOT}/"})
            return
        if path.startswith(f"{TASKS}/") or path.startswith(f"{TASK_MONITORS}/"):
            task = bmc.task(path.rsplit("/", 1)[-1])
            if task is None:
                self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")
                return
            body = bmc.task_body(task)
            running = body["TaskState"] == "Running"
            headers = {"Retry-After": "1"} if running else {}
            if path.startswith(TASK_MONITORS):
                if running:
                    headers["Location"] = f"{TASK_MONITORS}/{task.id}"
                self._send(202 if running else 200, body, headers)
            else:
                self._send(200, body, headers)
            return
        resource = bmc.resource(path)
        if resource is None:
            self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")
            return
        self._send(200, resource)

    def _post(self, path: str) -> None:
        bmc = self.server.bmc
        if path == SYSTEM_RESET:
            reset_type = self._reset_type(SYSTEM_RESET_TYPES)
            self._send(204, None)
            bmc.reset_system(reset_type)
            return
        if path == MANAGER_RESET:
            self._reset_type(MANAGER_RESET_TYPES)
            self._send(204, None)
            bmc.reset_self()
            return
        if path == MULTIPART_PUSH:
            self._update()
            return
        if bmc.resource(path) is not None or path.startswith((TASKS, TASK_MONITORS)):
            self._not_allowed(path)
            return
        self._drain()
        self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")

    def _reset_type(self, allowed: Sequence[str]) -> str:
        body = self._json_body()
        value = body.get("ResetType")
        if value is None:
            raise BadRequest(
                "Base.1.18.ActionParameterMissing",
                "The action requires the parameter ResetType.",
            )
        if value not in allowed:
            raise BadRequest(
                "Base.1.18.ActionParameterNotSupported",
                f"ResetType {str(value)[:40]!r} is not supported (allowed: {', '.join(allowed)}).",
            )
        return str(value)

    def _update(self) -> None:
        data = self._body()
        parts = parse_multipart(data, self.headers.get("Content-Type") or "")
        if "UpdateParameters" not in parts or "UpdateFile" not in parts:
            raise BadRequest(
                "Base.1.18.ActionParameterMissing",
                "A multipart update needs the parts UpdateParameters and UpdateFile.",
            )
        try:
            parameters = json.loads(parts["UpdateParameters"].data or b"{}")
        except ValueError:
            parameters = None
        if not isinstance(parameters, dict):
            raise BadRequest("Base.1.18.MalformedJSON", "UpdateParameters is not a JSON object.")
        targets = parameters.get("Targets", [])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise BadRequest(
                "Base.1.18.PropertyValueTypeError",
                "UpdateParameters: Targets must be a list of URIs.",
            )
        apply_time = parameters.get("@Redfish.OperationApplyTime", "Immediate")
        if apply_time not in APPLY_TIMES:
            raise BadRequest(
                "Base.1.18.PropertyValueNotInList",
                f"@Redfish.OperationApplyTime {str(apply_time)[:40]!r} is not supported "
                f"(supported: {', '.join(APPLY_TIMES)}).",
            )
        if not isinstance(parameters.get("ForceUpdate", False), bool):
            raise BadRequest(
                "Base.1.18.PropertyValueTypeError", "UpdateParameters: ForceUpdate is a boolean."
            )
        task = self.server.bmc.start_update(parameters, parts["UpdateFile"])
        monitor = f"{TASK_MONITORS}/{task.id}"
        self._send(202, self.server.bmc.task_body(task), {"Location": monitor, "Retry-After": "1"})


class _BmcServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], bmc: LabBmc, service: BmcService, context: ssl.SSLContext
    ) -> None:
        self.bmc = bmc
        self.service = service
        self.context = context
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS in the request's own thread (a slow handshake holds up no other client)."""
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            # a client that connects and goes (a port probe) is not worth a line
            level = logging.DEBUG if isinstance(exc, ssl.SSLEOFError) else logging.INFO
            LOG.log(
                level,
                "%s %s TLS handshake failed: %s",
                self.bmc.spec.address,
                client_address[0],
                reason,
            )
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        LOG.exception("%s: error serving %s", self.bmc.spec.address, client_address[0])


def check_bind_address(address: str) -> None:
    """Only the lab's range (198.18.0.0/15) and 127.0.0.1 (unit tests) are ever bound."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise LabError(f"lab BMC: {address!r} is not an IP address") from None
    if ip not in ALLOWED_NETWORK and str(ip) != TEST_ADDRESS:
        raise LabError(f"lab BMC: refusing to bind {address} (only {ALLOWED_NETWORK})")


class _Listener:
    """One BMC's HTTPS server; stopped and started again when the BMC resets."""

    def __init__(
        self, bmc: LabBmc, service: BmcService, port: int, context: ssl.SSLContext
    ) -> None:
        check_bind_address(bmc.spec.address)
        self.bmc = bmc
        self.service = service
        self.port = port
        self.context = context
        self._server: _BmcServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._server is not None:
                return
            deadline = time.monotonic() + 10
            while True:
                try:
                    server = _BmcServer(
                        (self.bmc.spec.address, self.port), self.bmc, self.service, self.context
                    )
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self.port = server.server_address[1]
            self._server = server
            threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=f"bmc-{self.bmc.spec.node}",
                daemon=True,
            ).start()

    def stop(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class BmcService:
    """SIMULATION: every lab node's BMC, each on its own address, in one process."""

    def __init__(
        self,
        specs: Sequence[BmcSpec],
        *,
        username: str,
        password: str,
        context: ssl.SSLContext,
        state_directory: Path,
        power: Callable[[BmcSpec], PowerControl],
        timing: Timing | None = None,
        port: int = PORT,
    ) -> None:
        self.username = username
        self.password = password
        self.timing = timing or Timing.from_env()
        state_directory.mkdir(parents=True, exist_ok=True)
        self.bmcs = {s.node: LabBmc(s, power(s), state_directory, self.timing) for s in specs}
        self._listeners = {
            node: _Listener(bmc, self, port, context) for node, bmc in self.bmcs.items()
        }
        for node, bmc in self.bmcs.items():
            bmc.listener = self._listeners[node]

    def start(self) -> None:
        for listener in self._listeners.values():
            listener.start()

    def stop(self) -> None:
        for listener in self._listeners.values():
            listener.stop()

    def url(self, node: str) -> str:
        listener = self._listeners[node]
        return f"https://{listener.bmc.spec.address}:{listener.port}"
