"""SIMULATION: the Redfish side of the lab BMCs: resource URIs, Redfish message and collection
bodies, request errors, and multipart form data (DSP0266 "Multipart HTTP push updates")."""

from __future__ import annotations

import email.message
import email.parser
from dataclasses import dataclass
from typing import Any, Final

MAX_UPLOAD: Final = 64 << 20

SERVICE_ROOT: Final = "/redfish/v1"
SYSTEM_ID: Final = "System_0"
MANAGER_ID: Final = "BMC_0"
SYSTEM: Final = f"{SERVICE_ROOT}/Systems/{SYSTEM_ID}"
MANAGER: Final = f"{SERVICE_ROOT}/Managers/{MANAGER_ID}"
SYSTEM_RESET: Final = f"{SYSTEM}/Actions/ComputerSystem.Reset"
MANAGER_RESET: Final = f"{MANAGER}/Actions/Manager.Reset"
UPDATE_SERVICE: Final = f"{SERVICE_ROOT}/UpdateService"
INVENTORY: Final = f"{UPDATE_SERVICE}/FirmwareInventory"
MULTIPART_PUSH: Final = f"{UPDATE_SERVICE}/update-multipart"
TASK_SERVICE: Final = f"{SERVICE_ROOT}/TaskService"
TASKS: Final = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS: Final = f"{TASK_SERVICE}/TaskMonitors"
GPU_INVENTORY_PREFIX: Final = "HGX_FW_GPU_SXM_"
BMC_INVENTORY_ID: Final = "BMC_Firmware"
SYSTEM_RESET_TYPES: Final = (
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
)
MANAGER_RESET_TYPES: Final = ("GracefulRestart", "ForceRestart")
APPLY_TIMES: Final = ("Immediate", "OnReset")


# ------------------------------------------------------------------------------------------
# Multipart form data (DSP0266 "Multipart HTTP push updates")


class BadRequest(Exception):
    def __init__(self, message_id: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content_type: str
    data: bytes


def parse_multipart(body: bytes, content_type: str) -> dict[str, Part]:
    """The parts of a ``multipart/form-data`` body by name (RFC 7578; raises BadRequest)."""
    header = email.message.Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise BadRequest(
            "Base.1.18.UnrecognizedRequestBody",
            "expected Content-Type multipart/form-data with a boundary",
            415,
        )
    if not 1 <= len(boundary) <= 200:
        raise BadRequest("Base.1.18.UnrecognizedRequestBody", "bad multipart boundary")
    delim = b"--" + boundary.encode("latin-1")
    if body.startswith(delim):
        pos = len(delim)
    else:
        first = body.find(b"\r\n" + delim)
        if first < 0:
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "no multipart boundary found")
        pos = first + 2 + len(delim)
    parts: dict[str, Part] = {}
    while True:
        if body[pos : pos + 2] == b"--":
            return parts
        eol = body.find(b"\r\n", pos)
        if eol < 0 or body[pos:eol].strip(b" \t"):
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "malformed multipart body")
        start = eol + 2
        if body.startswith(b"\r\n", start):
            head, content_start = b"", start + 2
        else:
            end = body.find(b"\r\n\r\n", start)
            if end < 0:
                raise BadRequest("Base.1.18.UnrecognizedRequestBody", "malformed part headers")
            head, content_start = body[start:end], end + 4
        after = body.find(b"\r\n" + delim, content_start)
        if after < 0:
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "unterminated multipart body")
        message = email.parser.HeaderParser().parsestr(head.decode("latin-1"))
        name = message.get_param("name", header="content-disposition")
        if isinstance(name, str) and name not in parts:
            filename = message.get_param("filename", header="content-disposition")
            parts[name] = Part(
                name,
                filename if isinstance(filename, str) else None,
                message.get_content_type(),
                body[content_start:after],
            )
        pos = after + 2 + len(delim)


def message_info(message_id: str, message: str, severity: str, *args: str) -> dict[str, Any]:
    return {
        "@odata.type": "#Message.v1_1_2.Message",
        "MessageId": message_id,
        "Message": message,
        "MessageArgs": list(args),
        "MessageSeverity": severity,
        "Severity": severity,
    }


def link(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def collection(uri: str, odata_type: str, name: str, members: list[str]) -> dict[str, Any]:
    return {
        "@odata.type": f"#{odata_type}.{odata_type}",
        "@odata.id": uri,
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [link(m) for m in members],
    }
