"""A small typed Redfish client on the standard library, for BMC and HGX firmware rollouts.

What it does, and the DMTF documents it follows (DSP0266 "Redfish Specification" 1.x; the
schemas in DSP8010, as published at https://redfish.dmtf.org/schemas/v1/):

* read the firmware inventory: ``GET /redfish/v1/UpdateService`` (UpdateService schema,
  ``FirmwareInventory``), the SoftwareInventoryCollection and each SoftwareInventory member
  (``Id``, ``Version``, ``Updateable``); collections are followed across ``Members@odata.nextLink``
  pages (DSP0266 "Collection resources" / "Paging");
* read a BMC's version: ``GET /redfish/v1/Managers/<id>`` ``FirmwareVersion`` (Manager schema);
* start an update: ``UpdateService.SimpleUpdate`` (UpdateService schema: ``ImageURI``,
  ``TransferProtocol``, ``Targets``) at the action ``target`` the service advertises under
  ``Actions`` (DSP0266 "Actions": clients use the advertised target; the DMTF mockup's is
  ``/redfish/v1/UpdateService/Actions/SimpleUpdate``), or a multipart HTTP push to
  ``MultipartHttpPushUri`` with the ``UpdateParameters`` and ``UpdateFile`` parts (DSP0266
  "Multipart HTTP push updates");
* follow the task: a 202 Accepted answer carries a ``Location`` header (a task monitor) and a
  Task resource body (DSP0266 "Asynchronous operations"); the Task's ``TaskState`` is polled until
  ``Completed``, ``Exception``, ``Killed`` or ``Cancelled`` (Task schema ``TaskState``), bounded
  by a deadline;
* reset: ``ComputerSystem.Reset`` and ``Manager.Reset`` with a ``ResetType`` among the action's
  ``ResetType@Redfish.AllowableValues`` (ComputerSystem / Manager schemas, Resource.ResetType).

Security: HTTPS with certificate verification is the default; a CA bundle can be given per BMC,
and skipping verification needs an explicit ``verify_tls=False`` on that BMC. Plain HTTP needs
``allow_plain_http=True`` (meant for tests). Credentials authenticate with HTTP Basic (DSP0266
"Authentication"); the password (and the Basic token) never appears in an exception, a repr, a
log or a return value, and is redacted from anything a BMC echoes back. Redirects are not
followed (the Authorization header must not go to another host), and absolute URIs a BMC returns
(a task monitor) are only used when they point at the same BMC.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.validation.numbers import json_loads, to_float

SERVICE_ROOT: Final = "/redfish/v1"
_MAX_BODY = 16 << 20  # no Redfish resource gpuctl reads is anywhere near this
_CHUNK = 1 << 20
_NOT_JSON = object()
# longest Retry-After honoured: a BMC that asks for more (or for inf) is polled at this interval
MAX_RETRY_AFTER_S = 300.0
TERMINAL_TASK_STATES: Final = frozenset({"Completed", "Exception", "Killed", "Cancelled"})
FAILED_TASK_STATES: Final = frozenset({"Exception", "Killed", "Cancelled"})


# ------------------------------------------------------------------------------------------
# Errors (messages are built redacted; nothing that could hold a secret is attached)


class RedfishError(BackendError):
    """A Redfish request failed or answered something gpuctl cannot use."""


class RedfishTLSError(RedfishError):
    """The BMC's certificate could not be verified (or TLS failed)."""


class RedfishHTTPError(RedfishError):
    """The BMC answered with an HTTP error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class RedfishProtocolError(RedfishError):
    """The BMC answered, but not with the resource or property gpuctl needs."""


class RedfishTaskFailed(RedfishError):
    """A Redfish task ended in Exception, Killed or Cancelled, or Completed with a Critical
    status."""

    def __init__(self, message: str, state: str, status: str | None) -> None:
        super().__init__(message)
        self.state = state
        self.status = status


class RedfishTimeout(RedfishError):
    """A task did not end before the deadline (its last state is in the message)."""


# ------------------------------------------------------------------------------------------
# Credentials and endpoints


class Credentials:
    """A BMC user name and password, handed in by the caller (environment, vault).

    ``repr``/``str`` show the user name only; the password is read by the client to build the
    Authorization header and is otherwise never exposed.
    """

    __slots__ = ("_password", "username")

    def __init__(self, username: str, password: str) -> None:
        if not username:
            raise ValueError("a BMC user name is required")
        self.username = username
        self._password = password

    @classmethod
    def from_env(cls, user_var: str, password_var: str) -> Credentials:
        """Read both from the environment; a missing variable is named, its value never shown."""
        missing = [v for v in (user_var, password_var) if not os.environ.get(v)]
        if missing:
            raise RedfishError(
                f"BMC credentials: environment variable(s) not set: {', '.join(missing)}"
            )
        return cls(os.environ[user_var], os.environ[password_var])

    def secret(self) -> str:
        """The password (for the Authorization header and for redaction only)."""
        return self._password

    def authorization(self) -> str:
        raw = f"{self.username}:{self._password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("Credentials are not picklable")


@dataclass(frozen=True, slots=True)
class BmcEndpoint:
    """Where a BMC's Redfish service is and how to trust it.

    ``url``: ``https://host[:port]`` (no path). ``ca_bundle``: a PEM file of CAs to trust for this
    BMC instead of the system store. ``verify_tls=False`` turns certificate checks off for this BMC
    only and must be set explicitly. ``allow_plain_http``: accept ``http://`` (tests only).
    """

    url: str
    verify_tls: bool = True
    ca_bundle: str | None = None
    allow_plain_http: bool = False

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.username or parts.password:  # checked first: the URL is never echoed then
            raise ValueError("BMC URL: no user or password in it (they go in Credentials)")
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"BMC URL must be https://host[:port], got {self.url!r}")
        if parts.scheme == "http" and not self.allow_plain_http:
            raise ValueError(f"plain HTTP to a BMC needs allow_plain_http=True: {self.url!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"BMC URL: scheme, host and port only, got {self.url!r}")
        object.__setattr__(self, "url", f"{parts.scheme}://{parts.netloc}")

    def ssl_context(self) -> ssl.SSLContext | None:
        if urllib.parse.urlsplit(self.url).scheme != "https":
            return None
        context = ssl.create_default_context(cafile=self.ca_bundle)
        if not self.verify_tls:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


# ------------------------------------------------------------------------------------------
# The client


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    location: str | None
    body: Any  # decoded JSON, or None for an empty body
    retry_after: float | None = None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx becomes an HTTPError: credentials never follow a redirect


class RedfishClient:
    """Requests to one BMC. ``timeout_s`` bounds each HTTP request."""

    def __init__(
        self,
        endpoint: BmcEndpoint,
        credentials: Credentials,
        *,
        timeout_s: float = 30.0,
        extra_secrets: Sequence[str] = (),
    ) -> None:
        self.endpoint = endpoint
        self._credentials = credentials
        self.timeout_s = timeout_s
        token = credentials.authorization().split(" ", 1)[1]  # base64(user:password)
        self._secrets = tuple(s for s in (credentials.secret(), token, *extra_secrets) if s)
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        context = endpoint.ssl_context()
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        return f"RedfishClient({self.endpoint.url!r}, user={self._credentials.username!r})"

    # -- helpers --------------------------------------------------------------------------

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def add_secret(self, secret: str) -> None:
        if secret:
            self._secrets = (*self._secrets, secret)

    def url_for(self, path: str) -> str:
        """Absolute URL of ``path`` (``/redfish/v1/...`` or an absolute URI on this BMC)."""
        parts = urllib.parse.urlsplit(path)
        if parts.scheme or parts.netloc:
            base = urllib.parse.urlsplit(self.endpoint.url)
            if (parts.scheme, parts.netloc) != (base.scheme, base.netloc):
                raise RedfishProtocolError(
                    f"{self.endpoint.url}: refusing to follow a URI on another host "
                    f"({parts.scheme}://{parts.hostname})"
                )
            return path
        if not path.startswith("/"):
            raise RedfishProtocolError(f"{self.endpoint.url}: not an absolute path: {path[:100]!r}")
        return self.endpoint.url + path

    def _error(self, cls: type[RedfishError], message: str) -> RedfishError:
        return cls(self.redact(f"{self.endpoint.url}: {message}"))

    # -- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One request; JSON ``body`` or raw ``data`` (an iterator needs a Content-Length)."""
        url = self.url_for(path)
        what = f"{method} {urllib.parse.urlsplit(url).path}"
        all_headers = {
            "Accept": "application/json",
            "OData-Version": "4.0",
            "Authorization": self._credentials.authorization(),
        }
        payload: bytes | Iterator[bytes] | None = data
        if body is not None:
            payload = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        req = urllib.request.Request(url, data=payload, headers=all_headers, method=method)  # noqa: S310 - scheme checked by BmcEndpoint/url_for
        raw, status, location, retry_after, failure = self._send(req, what)
        if failure is not None:
            raise failure  # raised outside the except blocks: no exception context to leak
        if len(raw) > _MAX_BODY:
            raise self._error(
                RedfishProtocolError, f"{what}: response larger than {_MAX_BODY} bytes"
            )
        decoded: Any = None
        if raw.strip():
            try:
                decoded = json_loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
            except (ValueError, RecursionError):
                decoded = _NOT_JSON
            if decoded is _NOT_JSON:
                raise self._error(RedfishProtocolError, f"{what}: answer is not JSON")
        return Response(status, location, decoded, _seconds(retry_after))

    def _send(
        self, req: urllib.request.Request, what: str
    ) -> tuple[bytes, int, str | None, str | None, RedfishError | None]:
        """(body, status, Location, Retry-After, None) or the error to raise (redacted)."""
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw: bytes = resp.read(_MAX_BODY + 1)
                return (
                    raw,
                    resp.status,
                    resp.headers.get("Location"),
                    resp.headers.get("Retry-After"),
                    None,
                )
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            exc.close()
            message = self.redact(f"{self.endpoint.url}: {what}: HTTP {exc.code}{detail}")
            return b"", exc.code, None, None, RedfishHTTPError(message, exc.code)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                error = self._error(RedfishTLSError, f"{what}: TLS failed ({_ssl_reason(reason)})")
            else:
                error = self._error(RedfishError, f"{what}: {reason}")
        except ssl.SSLError as exc:
            error = self._error(RedfishTLSError, f"{what}: TLS failed ({_ssl_reason(exc)})")
        except (OSError, http.client.HTTPException) as exc:
            error = self._error(RedfishError, f"{what}: {type(exc).__name__}: {exc}")
        return b"", 0, None, None, error

    def get(self, path: str) -> dict[str, Any]:
        """GET a resource; it must be a JSON object."""
        resp = self.request("GET", path)
        if not isinstance(resp.body, dict):
            raise self._error(RedfishProtocolError, f"GET {path}: not a JSON object")
        return resp.body

    def post(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    seconds = to_float(value.strip())
    if seconds is None:
        return None  # an HTTP date (or nan, inf, 1e400): ignored, the caller's interval applies
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


def _ssl_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    return exc.reason or type(exc).__name__


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """``: <message>`` from a Redfish error body (``error.@Message.ExtendedInfo[].Message`` or
    ``error.message``, DSP0266 "Error responses"), empty when there is none."""
    try:
        raw = exc.read(1 << 16)
        data = json_loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw) if raw else None
    except (OSError, ValueError, RecursionError):
        return ""
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        return ""
    error = data["error"]
    messages = [
        str(info.get("Message"))
        for info in error.get("@Message.ExtendedInfo") or []
        if isinstance(info, dict) and info.get("Message")
    ]
    if not messages and error.get("message"):
        messages = [str(error["message"])]
    return (": " + "; ".join(messages))[:500] if messages else ""


def _odata_id(client: RedfishClient, resource: Mapping[str, Any], key: str) -> str:
    link = resource.get(key)
    if isinstance(link, dict) and isinstance(link.get("@odata.id"), str):
        return str(link["@odata.id"])
    raise client._error(RedfishProtocolError, f"{resource.get('@odata.id', '?')}: no {key} link")


def _action(client: RedfishClient, resource: Mapping[str, Any], name: str) -> dict[str, Any]:
    actions = resource.get("Actions")
    action = actions.get(name) if isinstance(actions, dict) else None
    if not isinstance(action, dict) or not isinstance(action.get("target"), str):
        raise client._error(
            RedfishProtocolError, f"{resource.get('@odata.id', '?')}: no {name} action"
        )
    return action


def collection_members(client: RedfishClient, path: str) -> list[str]:
    """The ``@odata.id`` of every member of a collection, across ``Members@odata.nextLink``
    pages. ``Members@odata.count`` is not trusted (the DMTF mockup's disagrees with its list)."""
    members: list[str] = []
    page: str | None = path
    seen: set[str] = set()
    while page is not None:
        if page in seen:
            raise client._error(RedfishProtocolError, f"{path}: nextLink loop at {page}")
        seen.add(page)
        data = client.get(page)
        items = data.get("Members")
        if not isinstance(items, list):
            raise client._error(RedfishProtocolError, f"{page}: no Members list")
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("@odata.id"), str):
                raise client._error(RedfishProtocolError, f"{page}: member without @odata.id")
            members.append(item["@odata.id"])
        next_link = data.get("Members@odata.nextLink")
        page = next_link if isinstance(next_link, str) else None
    return members


# ------------------------------------------------------------------------------------------
# Firmware inventory and versions


@dataclass(frozen=True, slots=True)
class SoftwareInventory:
    """One FirmwareInventory member (SoftwareInventory schema)."""

    odata_id: str
    id: str
    name: str | None
    version: str | None
    updateable: bool | None
    state: str | None
    related: tuple[str, ...] = ()


def update_service(client: RedfishClient) -> dict[str, Any]:
    return client.get(f"{SERVICE_ROOT}/UpdateService")


def firmware_inventory(client: RedfishClient) -> tuple[SoftwareInventory, ...]:
    """Every member of ``UpdateService.FirmwareInventory``, as the BMC reports it."""
    service = update_service(client)
    collection = _odata_id(client, service, "FirmwareInventory")
    items = []
    for member in collection_members(client, collection):
        data = client.get(member)
        status = data.get("Status") if isinstance(data.get("Status"), dict) else {}
        related = tuple(
            str(r["@odata.id"])
            for r in data.get("RelatedItem") or []
            if isinstance(r, dict) and isinstance(r.get("@odata.id"), str)
        )
        version = data.get("Version")
        updateable = data.get("Updateable")
        items.append(
            SoftwareInventory(
                odata_id=member,
                id=str(data.get("Id") or member.rstrip("/").rsplit("/", 1)[-1]),
                name=data.get("Name") if isinstance(data.get("Name"), str) else None,
                version=version if isinstance(version, str) and version.strip() else None,
                updateable=updateable if isinstance(updateable, bool) else None,
                state=status.get("State") if isinstance(status, dict) else None,
                related=related,
            )
        )
    return tuple(items)


def inventory_version(items: Sequence[SoftwareInventory], inventory_id: str) -> str:
    """The ``Version`` of the member with ``Id`` ``inventory_id``; raises when absent/empty."""
    for item in items:
        if item.id == inventory_id:
            if item.version is None:
                raise RedfishProtocolError(f"FirmwareInventory/{inventory_id}: no Version")
            return item.version
    have = ", ".join(i.id for i in items) or "none"
    raise RedfishProtocolError(f"FirmwareInventory has no {inventory_id} (members: {have})")


def manager_id(client: RedfishClient) -> str:
    """The Id of the service's only Manager; raises when there are none or several."""
    members = collection_members(client, f"{SERVICE_ROOT}/Managers")
    if len(members) != 1:
        raise client._error(
            RedfishProtocolError,
            f"{len(members)} managers ({', '.join(members) or 'none'}): name the one to use",
        )
    return members[0].rstrip("/").rsplit("/", 1)[-1]


def manager_firmware_version(client: RedfishClient, manager: str | None = None) -> str:
    """``GET /redfish/v1/Managers/<id>`` ``FirmwareVersion`` (the running BMC firmware)."""
    ident = manager or manager_id(client)
    data = client.get(f"{SERVICE_ROOT}/Managers/{urllib.parse.quote(ident)}")
    version = data.get("FirmwareVersion")
    if not isinstance(version, str) or not version.strip():
        raise client._error(RedfishProtocolError, f"Managers/{ident}: no FirmwareVersion")
    return version.strip()


def bmc_versions(client: RedfishClient, manager: str | None = None) -> Versions:
    """``bmc-firmware``: the Manager's FirmwareVersion runs; nothing is reported as pending (a
    BMC activates its new image when it resets itself after the update)."""
    return Versions(running=manager_firmware_version(client, manager), pending=None)


# ------------------------------------------------------------------------------------------
# Updates and tasks


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Where to follow an asynchronous operation: the Task resource, the task monitor, or both."""

    task_uri: str | None
    monitor_uri: str | None


@dataclass(frozen=True, slots=True)
class TaskResult:
    state: str
    status: str | None
    percent: int | None = None
    messages: tuple[str, ...] = ()


def _task_ref(client: RedfishClient, resp: Response, what: str) -> TaskRef | None:
    """The task of an accepted request; None when the service answered 200/204 (done)."""
    if resp.status in (200, 201, 204) and resp.location is None:
        body = resp.body if isinstance(resp.body, dict) else {}
        if "TaskState" not in body:
            return None
    body = resp.body if isinstance(resp.body, dict) else {}
    task_uri = body.get("@odata.id") if "TaskState" in body else None
    monitor = resp.location or body.get("TaskMonitor")
    if not isinstance(task_uri, str):
        task_uri = None
    if not isinstance(monitor, str):
        monitor = None
    if task_uri is None and monitor is None:
        raise client._error(
            RedfishProtocolError, f"{what}: HTTP {resp.status} without a task or task monitor"
        )
    for uri in (task_uri, monitor):
        if uri is not None:
            client.url_for(uri)  # same BMC, or refuse now
    return TaskRef(task_uri, monitor)


def _allowable(action: Mapping[str, Any], parameter: str) -> list[str] | None:
    values = action.get(f"{parameter}@Redfish.AllowableValues")
    return [str(v) for v in values] if isinstance(values, list) else None


def simple_update(
    client: RedfishClient,
    image_uri: str,
    *,
    transfer_protocol: str | None = None,
    targets: Sequence[str] = (),
    image_credentials: Credentials | None = None,
) -> TaskRef | None:
    """POST ``UpdateService.SimpleUpdate`` at its advertised target. ``image_uri`` is where the
    BMC fetches the image (an HTTPS URL of the site's image server); ``targets`` are
    FirmwareInventory URIs (empty: the service picks). ``TransferProtocol`` is checked against
    the ActionInfo's ``AllowableValues`` when the service publishes them."""
    service = update_service(client)
    action = _action(client, service, "#UpdateService.SimpleUpdate")
    allowed = _allowable(action, "TransferProtocol")
    info = action.get("@Redfish.ActionInfo")
    if allowed is None and isinstance(info, str):
        for parameter in client.get(info).get("Parameters") or []:
            if isinstance(parameter, dict) and parameter.get("Name") == "TransferProtocol":
                values = parameter.get("AllowableValues")
                allowed = [str(v) for v in values] if isinstance(values, list) else None
    if transfer_protocol is not None and allowed is not None and transfer_protocol not in allowed:
        raise client._error(
            RedfishProtocolError,
            f"SimpleUpdate: TransferProtocol {transfer_protocol} not allowed "
            f"(allowed: {', '.join(allowed)})",
        )
    body: dict[str, Any] = {"ImageURI": image_uri}
    if transfer_protocol is not None:
        body["TransferProtocol"] = transfer_protocol
    if targets:
        body["Targets"] = list(targets)
    if image_credentials is not None:
        client.add_secret(image_credentials.secret())
        body["Username"] = image_credentials.username
        body["Password"] = image_credentials.secret()
    userinfo = urllib.parse.urlsplit(image_uri).password
    if userinfo:
        client.add_secret(userinfo)
    resp = client.post(str(action["target"]), body)
    return _task_ref(client, resp, "SimpleUpdate")


def multipart_update(
    client: RedfishClient,
    image: str | os.PathLike[str],
    *,
    targets: Sequence[str] = (),
    apply_time: str | None = None,
) -> TaskRef | None:
    """Push ``image`` to the service's ``MultipartHttpPushUri`` (DSP0266 "Multipart HTTP push
    updates": a ``multipart/form-data`` body with an ``UpdateParameters`` JSON part, holding
    ``Targets`` and ``@Redfish.OperationApplyTime``, and an ``UpdateFile`` part). The file is
    streamed, not read into memory."""
    service = update_service(client)
    push_uri = service.get("MultipartHttpPushUri")
    if not isinstance(push_uri, str):
        raise client._error(RedfishProtocolError, "UpdateService has no MultipartHttpPushUri")
    path = Path(image)
    parameters: dict[str, Any] = {"Targets": list(targets)}
    if apply_time is not None:
        parameters["@Redfish.OperationApplyTime"] = apply_time
    boundary = uuid.uuid4().hex
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="UpdateParameters"\r\n'
        "Content-Type: application/json\r\n\r\n"
        f"{json.dumps(parameters)}\r\n"
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="UpdateFile"; filename="{path.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = path.stat().st_size

    def chunks() -> Iterator[bytes]:
        yield head
        with path.open("rb") as handle:
            yield from _read_chunks(handle)
        yield tail

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(head) + size + len(tail)),
    }
    resp = client.request("POST", push_uri, data=chunks(), headers=headers)
    return _task_ref(client, resp, "multipart update")


def _read_chunks(handle: BinaryIO) -> Iterator[bytes]:
    while True:
        chunk = handle.read(_CHUNK)
        if not chunk:
            return
        yield chunk


def _task_result(body: Mapping[str, Any]) -> TaskResult | None:
    state = body.get("TaskState")
    if not isinstance(state, str):
        return None
    status = body.get("TaskStatus")
    percent = body.get("PercentComplete")
    messages = tuple(
        str(m.get("Message"))
        for m in body.get("Messages") or []
        if isinstance(m, dict) and m.get("Message")
    )
    return TaskResult(
        state=state,
        status=status if isinstance(status, str) else None,
        percent=percent if isinstance(percent, int) and not isinstance(percent, bool) else None,
        messages=messages,
    )


def poll_task(client: RedfishClient, task: TaskRef) -> tuple[TaskResult | None, float | None]:
    """One look at a task: its state (None while a task monitor says only "still running"),
    and the Retry-After the service asked for."""
    if task.task_uri is not None:
        resp = client.request("GET", task.task_uri)
        body = resp.body if isinstance(resp.body, dict) else {}
        result = _task_result(body)
        if result is None:
            raise client._error(RedfishProtocolError, f"{task.task_uri}: no TaskState")
        return result, resp.retry_after
    if task.monitor_uri is None:
        raise client._error(RedfishProtocolError, "a task without a task or monitor URI")
    resp = client.request("GET", task.monitor_uri)
    body = resp.body if isinstance(resp.body, dict) else {}
    result = _task_result(body)
    if resp.status == 202:  # still running (DSP0266: the monitor answers 202 until done)
        return result, resp.retry_after
    if result is not None:
        return result, resp.retry_after
    # done: the monitor now answers with the operation's own response (2xx, no Task body)
    return TaskResult(state="Completed", status="OK"), None


def wait_for_task(
    client: RedfishClient,
    task: TaskRef,
    *,
    timeout_s: float,
    poll_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TaskResult:
    """Poll ``task`` until it ends; raise :class:`RedfishTaskFailed` unless it Completed with
    TaskStatus OK or Warning (or no status), :class:`RedfishTimeout` after ``timeout_s``."""
    deadline = clock() + timeout_s
    last: TaskResult | None = None
    while True:
        result, retry_after = poll_task(client, task)
        last = result or last
        if result is not None and result.state in TERMINAL_TASK_STATES:
            return _judge_task(client, task, result)
        now = clock()
        if now >= deadline:
            state = (
                f"{last.state} ({last.percent}%)"
                if last and last.percent is not None
                else (last.state if last else "unknown")
            )
            raise client._error(
                RedfishTimeout,
                f"task {task.task_uri or task.monitor_uri} still {state} after {timeout_s:g} s",
            )
        wait = poll_s if retry_after is None else min(max(retry_after, 0.0), 60.0)
        sleep(min(wait, max(0.0, deadline - now)))


def _judge_task(client: RedfishClient, task: TaskRef, result: TaskResult) -> TaskResult:
    where = task.task_uri or task.monitor_uri
    if result.state in FAILED_TASK_STATES or result.status == "Critical":
        detail = "; ".join(result.messages)[:500]
        raise RedfishTaskFailed(
            client.redact(
                f"{client.endpoint.url}: task {where} ended {result.state}"
                f" (TaskStatus {result.status or 'none'})" + (f": {detail}" if detail else "")
            ),
            result.state,
            result.status,
        )
    return result


# ------------------------------------------------------------------------------------------
# Resets


def _reset(
    client: RedfishClient, resource_path: str, action_name: str, reset_type: str
) -> TaskRef | None:
    resource = client.get(resource_path)
    action = _action(client, resource, action_name)
    allowed = _allowable(action, "ResetType")
    if allowed is not None and reset_type not in allowed:
        raise client._error(
            RedfishProtocolError,
            f"{resource_path}: ResetType {reset_type} not allowed (allowed: {', '.join(allowed)})",
        )
    resp = client.post(str(action["target"]), {"ResetType": reset_type})
    return _task_ref(client, resp, action_name.lstrip("#"))


def reset_system(client: RedfishClient, system_id: str, reset_type: str) -> TaskRef | None:
    """``ComputerSystem.Reset`` with ``reset_type`` (``ForceRestart``, ``PowerCycle``, ...)."""
    path = f"{SERVICE_ROOT}/Systems/{urllib.parse.quote(system_id)}"
    return _reset(client, path, "#ComputerSystem.Reset", reset_type)


def reset_manager(client: RedfishClient, manager: str, reset_type: str) -> TaskRef | None:
    """``Manager.Reset`` with ``reset_type`` (``GracefulRestart``, ``ForceRestart``)."""
    path = f"{SERVICE_ROOT}/Managers/{urllib.parse.quote(manager)}"
    return _reset(client, path, "#Manager.Reset", reset_type)


__all__ = [
    "BmcEndpoint",
    "Credentials",
    "RedfishClient",
    "RedfishError",
    "RedfishHTTPError",
    "RedfishProtocolError",
    "RedfishTLSError",
    "RedfishTaskFailed",
    "RedfishTimeout",
    "Response",
    "SoftwareInventory",
    "TaskRef",
    "TaskResult",
    "bmc_versions",
    "collection_members",
    "firmware_inventory",
    "inventory_version",
    "manager_firmware_version",
    "manager_id",
    "multipart_update",
    "poll_task",
    "reset_manager",
    "reset_system",
    "simple_update",
    "update_service",
    "wait_for_task",
]
