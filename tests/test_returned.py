"""Existing tools, unmodified: returned error values are failures too."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pydantic
import pytest

from toolfault import Guard, Limits, Outcome, default_error_result


class FileSystem:
    """A toy file system in the style of existing agent tools: errors are returned, not raised."""

    def __init__(self) -> None:
        self.cwd = "/"
        self.files: dict[str, str] = {"/readme.txt": "hello", "/docs/a.md": "# A"}
        self.dirs = {"/", "/docs"}

    def _abs(self, path: str) -> str:
        if path.startswith("/"):
            return path.rstrip("/") or "/"
        return (self.cwd.rstrip("/") + "/" + path).rstrip("/") or "/"

    def cd(self, path: str) -> dict[str, Any]:
        """Change the working directory. Use it before relative reads."""
        target = self._abs(path)
        if target not in self.dirs:
            return {"error": f"cd: {path}: No such directory"}
        self.cwd = target
        return {"cwd": self.cwd}

    def cat(self, path: str) -> dict[str, Any]:
        """Read a file. Use it to show a file's content."""
        target = self._abs(path)
        if target not in self.files:
            return {"error": f"cat: {path}: No such file"}
        return {"content": self.files[target]}

    def mv(self, source: str, destination: str) -> dict[str, Any]:
        """Move a file. Use it to rename or relocate one file."""
        src, dst = self._abs(source), self._abs(destination)
        if src not in self.files:
            return {"error": f"mv: {source}: No such file"}
        if dst in self.files:
            return {"error": f"mv: {destination}: already exists"}
        self.files[dst] = self.files.pop(src)
        return {"moved": dst}

    def ls(self) -> list[str]:
        """List files in the working directory. Use it to see what exists."""
        prefix = self.cwd.rstrip("/") + "/"
        return sorted(p for p in self.files if p.startswith(prefix))


class BookingAPI:
    """A booking client whose methods return error strings and error envelopes."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.bookings: dict[str, str] = {}

    def login(self, user: str, password: str) -> dict[str, Any]:
        """Log in and get a token. Use it before booking."""
        if password != "hunter2":
            return {"error": "invalid credentials", "code": 401}
        token = f"tok-{user}"
        self.tokens.add(token)
        return {"token": token}

    def book(self, token: str, flight: str) -> str:
        """Book a flight. Use it after login with the returned token."""
        if token not in self.tokens:
            return "Error: invalid token"
        booking = f"BK{len(self.bookings) + 1}"
        self.bookings[booking] = flight
        return booking

    def cancel(self, token: str, booking: str) -> dict[str, Any]:
        """Cancel a booking. Use it when the user asks to cancel."""
        if token not in self.tokens:
            return {"errors": ["invalid token"]}
        if booking not in self.bookings:
            return {"error": "Booking not found", "status": 404}
        del self.bookings[booking]
        return {"cancelled": booking}


def test_default_detector_shapes() -> None:
    """Error envelopes and 'Error:' strings are errors; payloads with data are not."""
    assert default_error_result({"error": "Booking not found"}) == "Booking not found"
    assert default_error_result({"errors": ["a", "b"], "status": 400}) == "a; b"
    assert default_error_result("Error: order not found") == "order not found"
    assert default_error_result("error:  bad") == "bad"
    assert default_error_result({"error": None, "data": 1}) is None
    assert default_error_result({"error": "x", "results": [1]}) is None
    assert default_error_result({"ok": True, "error": "warn"}) is None
    assert default_error_result("Errors are fine in prose") is None

    class Envelope(pydantic.BaseModel):
        error: str | None = None

    @dataclasses.dataclass
    class Reply:
        error: str

    assert default_error_result(Envelope(error="quota exceeded")) == "quota exceeded"
    assert default_error_result(Envelope()) is None
    assert default_error_result(Reply("nope")) == "nope"


def test_returned_error_dict_becomes_four_part_with_mapped_code() -> None:
    """A returned {"error": "… not found"} is not_found with the text as reason, not raw."""
    fs = FileSystem()
    guard = Guard(scan_env_secrets=False)
    guard.register(fs)
    result = guard.call("cat", {"path": "missing.txt"})
    assert result.is_error and result.code == "not_found"
    assert result.text.startswith("cat failed (code: not_found).\nReason: cat: missing.txt: "
                                  "No such file.")
    assert "{'error'" not in result.text and '{"error"' not in result.text
    assert guard.call("cat", {"path": "readme.txt"}).data == {"content": "hello"}


def test_unmatched_returned_error_is_tool_error_and_strings_map_too() -> None:
    """Unmatched texts are tool_error; 'Error: invalid token' maps to unauthenticated."""
    api = BookingAPI()
    guard = Guard(scan_env_secrets=False)
    guard.register(api)
    assert guard.call("book", {"token": "nope", "flight": "UA1"}).code == "unauthenticated"
    guard.tool(name="weird")(lambda x: {"error": "the flux capacitor overheated"})
    assert guard.call("weird", {"x": 1}).code == "tool_error"


def test_returned_errors_count_towards_caps() -> None:
    """Repeating a call that returns an error hits the terminal message like a raised one."""
    fs = FileSystem()
    guard = Guard(limits=Limits(retry_limit=2), scan_env_secrets=False)
    guard.register(fs)
    first = guard.call("cd", {"path": "nowhere"})
    second = guard.call("cd", {"path": "nowhere"})
    third = guard.call("cd", {"path": "nowhere"})
    assert not first.terminal and second.terminal and third.blocked
    assert "cd failed 2 times with identical arguments (code: not_found)" in second.text


def test_error_result_can_be_customised_or_switched_off() -> None:
    """A per-tool detector replaces the default; None switches detection off."""
    guard = Guard(scan_env_secrets=False)

    def status_detector(value: Any) -> str | None:
        return value.get("message") if isinstance(value, dict) and value.get("status") == \
            "FAILED" else None

    @guard.tool(error_result=status_detector)
    def job(job_id: str) -> dict[str, str]:
        return {"status": "FAILED", "message": "job j1 does not exist"}

    @guard.tool(error_result=None)
    def raw(x: int) -> dict[str, str]:
        return {"error": "this is data, not a failure"}

    assert guard.call("job", {"job_id": "j1"}).code == "not_found"
    assert guard.call("raw", {"x": 1}).ok
    off = Guard(error_result=None, scan_env_secrets=False)
    off.tool(name="legacy")(lambda: "Error: still data")
    assert off.call("legacy", {}).ok


def _replay(tools: dict[str, Any], calls: list[tuple[str, dict[str, Any]]],
            guard: Guard | None) -> list[Any]:
    out = []
    for name, args in calls:
        if guard is None:
            out.append(tools[name](**args))
        else:
            out.append(guard.call(name, args).data)
    return out


@pytest.mark.parametrize("via", ["register", "loop"])
def test_replay_through_guard_ends_in_the_same_state(via: str) -> None:
    """A successful call sequence leaves the wrapped objects exactly as an unguarded replay does."""
    sequence: list[tuple[str, dict[str, Any]]] = [
        ("fs_cd", {"path": "docs"}), ("fs_cat", {"path": "a.md"}),
        ("fs_mv", {"source": "a.md", "destination": "b.md"}), ("fs_cd", {"path": "/"}),
        ("fs_mv", {"source": "readme.txt", "destination": "docs/readme.txt"}), ("fs_ls", {}),
        ("api_login", {"user": "ada", "password": "hunter2"}),
        ("api_book", {"token": "tok-ada", "flight": "UA1"}),
        ("api_book", {"token": "tok-ada", "flight": "LH2"}),
        ("api_cancel", {"token": "tok-ada", "booking": "BK1"}),
    ]
    plain_fs, plain_api = FileSystem(), BookingAPI()
    plain_tools = {f"fs_{n}": getattr(plain_fs, n) for n in ("cd", "cat", "mv", "ls")}
    plain_tools |= {f"api_{n}": getattr(plain_api, n) for n in ("login", "book", "cancel")}
    expected = _replay(plain_tools, sequence, None)

    fs, api = FileSystem(), BookingAPI()
    guard = Guard(scan_env_secrets=False)
    if via == "register":
        guard.register(fs, prefix="fs_")
        guard.register(api, prefix="api_")
    else:
        for obj, prefix in ((fs, "fs_"), (api, "api_")):
            for name in [m for m in dir(obj)
                         if not m.startswith("_") and callable(getattr(obj, m))]:
                guard.tool(name=prefix + name)(getattr(obj, name))
    got = _replay({}, sequence, guard)
    assert got == expected
    assert (fs.cwd, fs.files, fs.dirs) == (plain_fs.cwd, plain_fs.files, plain_fs.dirs)
    assert (api.tokens, api.bookings) == (plain_api.tokens, plain_api.bookings)
    snapshot = copy.deepcopy(fs.files)
    failed = guard.call("fs_mv", {"source": "nope", "destination": "x"})
    assert failed.code == "not_found" and fs.files == snapshot
    assert failed.outcome is Outcome.NO_EFFECT
    assert guard.call("api_cancel", {"token": "bad", "booking": "BK2"}).code == "unauthenticated"


@pytest.mark.parametrize(("value", "reason"), [
    ({"booking_status": False, "error": "Invalid access token"}, "Invalid access token"),
    ({"success": False, "message": "Card declined"}, "Card declined"),
    ({"ok": False, "error": "quota exceeded", "data": None}, "quota exceeded"),
    ({"ok": False}, "the tool reported ok: false"),
    ({"status": "error", "message": "upstream down"}, "upstream down"),
    ({"status": 503, "detail": "maintenance"}, "maintenance"),
    ({"payment_success": False, "reason": "expired card", "payment_id": "p1"}, "expired card"),
])
def test_status_fields_beside_an_error_are_errors(value: dict[str, Any], reason: str) -> None:
    """A status field that says the call failed, with its words, is a returned error."""
    assert default_error_result(value) == reason


@pytest.mark.parametrize("value", [
    {"ok": True},
    {"ok": True, "items": [1, 2]},
    {"success": True, "message": "Booked"},
    {"booking_status": True, "error": None, "booking": "BK1"},
    {"service": "db", "ok": False},  # a health check's data, not an error envelope
    {"job": 3, "status": "failed"},  # a job's state is data
    {"job": 3, "status": "failed", "message": "the job crashed"},
    {"status": 200, "data": [1]},
    {"status": "ok"},
    {"name": "Ada", "error_rate": 0.1},
])
def test_plain_data_with_status_fields_is_a_result(value: dict[str, Any]) -> None:
    """Success statuses and data that merely mentions a status stay results."""
    assert default_error_result(value) is None


def test_status_envelope_from_an_existing_tool_is_shaped() -> None:
    """An unmodified tool returning a status envelope gets the four-part message."""
    guard = Guard(scan_env_secrets=False)
    calls = {"n": 0}

    @guard.tool
    def book(flight: str) -> dict[str, Any]:
        calls["n"] += 1
        return {"booking_status": False, "error": "Invalid access token"}

    result = guard.call("book", {"flight": "UA1"})
    assert result.is_error and result.code == "unauthenticated"
    assert result.text.startswith("book failed (code: unauthenticated).\n"
                                  "Reason: Invalid access token.\n")
    assert guard.call("book", {"flight": "UA1"}).terminal and calls["n"] == 2
