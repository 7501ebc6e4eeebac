"""Side effects: a timed-out call is verified before any retry and never duplicated.

A ``side_effect=True`` tool gets an idempotency key (argument fields, a function, or the
fingerprint), a ledger entry written *before* dispatch (so a crash mid-call leaves "effect
unknown" behind), and, whenever the outcome is uncertain, a postcondition check before the
guard or the model may call it again.  The ledger keeps what the model was told (response
channel) apart from what happened (effect channel); a mismatch is an incident.

Claim, then verify: the key is taken atomically before the ledger is read or a check runs,
only its holder writes a verdict (compare-and-set on the entry), and it stays held until
the attempt's thread ends, even when the caller timed out or was cancelled.  Whatever
races, the action runs once.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

from toolfault._budget import Budgets
from toolfault._call import VERIFY, Step, _Call, resolve_fp
from toolfault._classify import Failure, from_entry
from toolfault._degrading import DegradingStore
from toolfault._emission import Emitter
from toolfault._errors import Outcome, StateUnavailableError
from toolfault._failing import Failures
from toolfault._records import IncidentKind, LedgerEntry
from toolfault._redact import Redactor
from toolfault._result import ToolResult
from toolfault._settings import Scope, Settings

log = logging.getLogger("toolfault")

#: Added to the recorded answer an explicit idempotency key replays.
REPLAY_NOTE = ("Replayed: an earlier {tool} call with this idempotency key already ran and "
               "succeeded (Effect: applied); this call did not run it again.")


class Effects:
    """One scope's side-effect handling: claim, verify, ledger.  Refusals are worded by
    ``failures``; a refused call's spend is given back through ``budgets``."""

    def __init__(self, settings: Settings, scope: Scope, store: DegradingStore,
                 redactor: Redactor, *, budgets: Budgets, failures: Failures,
                 emitter: Emitter) -> None:
        self._settings = settings
        self._catalog = settings.catalog
        self._scope = scope
        self._store = store
        self._redactor = redactor
        self._budgets = budgets
        self._failures = failures
        self._emitter = emitter

    def idempotency_key(self, call: _Call) -> str:
        """A stable hash of the key material: ledgers and stores never hold argument values.

        ``tool:`` plus 32 hex digits of SHA-256 over the material (the key fields' values,
        the user's key function's result, or the fingerprint), the same in every process.
        """
        spec = call.spec
        assert spec is not None
        material = f"{spec.name}:{call.fp}"
        if spec.idempotency_key is not None:
            try:
                material = str(spec.idempotency_key(call.kwargs or call.args))
            except Exception:
                pass
        digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{spec.name}:{digest[:32]}"

    def _pending_effect(self, call: _Call) -> LedgerEntry | None:
        """The key's latest entry, when its effect may stand in the way of a new dispatch.

        One indexed read: under the claim, entries of a key are written one after another,
        so the latest is the only one that can still be pending.  An explicit key's recorded
        success (or a use with other arguments) is returned too: :meth:`_keyed` answers it.
        """
        if call.idem is None:
            call.idem = self.idempotency_key(call)
        entry = self._store.ledger_entry(self._scope.task_id, call.idem)
        if entry is None:
            return None
        if self._answered_by_key(call, entry):
            return entry
        if entry.effect is Outcome.NO_EFFECT or _succeeded(entry):
            return None  # a confirmed success: a new identical call is a new action
        return entry

    def _answered_by_key(self, call: _Call, entry: LedgerEntry) -> bool:
        """An explicit key's retained entry that :meth:`_keyed` answers: the key used with
        other arguments (a conflict), or its success (replayed, never run again)."""
        if not self._explicit(call) or not self._retained(entry):
            return False
        return self._conflicts(call, entry) or _succeeded(entry)

    def _retained(self, entry: LedgerEntry) -> bool:
        """Whether an explicit key's entry is recent enough to answer for it."""
        return entry.at + self._settings.idempotency_retention > time.time()

    def _explicit(self, call: _Call) -> bool:
        """The tool declared its idempotency key (fields or a function): Stripe's meaning."""
        spec = call.spec
        if spec is None or spec.idempotency_key is None:
            return False
        if not call.fp:
            resolve_fp(call, self._scope)
        return True

    @staticmethod
    def _conflicts(call: _Call, entry: LedgerEntry) -> bool:
        """The key's entry is of other arguments, and did or may have taken effect.  While
        that call still runs (for all its holder knows) a non-holder is told ``in_progress``
        instead; a holder finding it in flight knows its caller is gone."""
        return (entry.effect is not Outcome.NO_EFFECT and entry.fingerprint != call.fp
                and (call.held or not entry.in_flight))

    def _keyed(self, call: _Call, entry: LedgerEntry) -> ToolResult | None:
        """An explicit key's answer from its retained entry: a conflict when it was used with
        other arguments, the recorded result (a replay) after a success; ``None`` otherwise."""
        retained = self._retained(entry)
        if not self._explicit(call) or not retained:
            return None
        if self._conflicts(call, entry):
            self._budgets.refund(call)
            return self._failures.fail(call, from_entry(
                self._catalog.get("idempotency_conflict"),
                f"this idempotency key was already used for a {call.name} call with other "
                "arguments; nothing was run"), count=False)
        if _succeeded(entry):
            return self._replay(call, entry)
        return None

    def _replay(self, call: _Call, entry: LedgerEntry) -> ToolResult:
        """The recorded answer of an explicit key's success, marked as a replay."""
        self._budgets.refund(call)
        if entry.told_text is None:  # too large to keep: say it happened, not what it said
            return self._failures.fail(call, from_entry(
                self._catalog.get("already_applied"),
                f"an earlier {call.name} call with this idempotency key already succeeded",
                outcome=Outcome.APPLIED), count=False)
        try:
            data = json.loads(entry.told_text)
        except ValueError:
            data = entry.told_text
        assert call.spec is not None
        text = (f"{entry.told_text}\n{REPLAY_NOTE.format(tool=call.spec.name)}")
        return ToolResult(call.spec.name, True, text, data, 0, call.call_id, None, call.fp,
                          replayed=True)

    def precheck(self, call: _Call) -> Generator[Step, Any, ToolResult | None]:
        """Claim the key, then (as its only holder) verify what an earlier attempt left.

        Yields :data:`VERIFY` when a postcondition must decide; ``None`` means "dispatch".
        """
        if self._scope.mode != "enforce":
            self.record_dispatch(call)
            return None
        early = self._claim(call)
        if early is not None:
            return early
        if not call.held:
            return (yield from self._not_holding(call))
        return (yield from self._holding(call))

    def _not_holding(self, call: _Call) -> Generator[Step, Any, ToolResult]:
        """Someone else holds the key: answer from what it left; never dispatch."""
        pending = self._peek(call)
        if pending is None:
            return self._busy(call)
        keyed = self._keyed(call, pending)
        if keyed is not None:
            return keyed
        if (yield from self._check(call, pending)) is Outcome.APPLIED:
            return self._applied_meanwhile(call, pending)
        return self._busy(call)

    def _holding(self, call: _Call) -> Generator[Step, Any, ToolResult | None]:
        """The key is ours: verify what an earlier attempt left (reading again when a late
        answer changed the entry meanwhile), then write the ledger entry and dispatch."""
        early = self._replayed(call)
        if early is not None:
            return early
        for _ in range(3):
            try:
                pending = self._pending_effect(call)
            except StateUnavailableError as exc:
                return self._unreachable(call, exc)
            if pending is None:
                break
            keyed = self._keyed(call, pending)
            if keyed is not None:
                return keyed
            verdict = self._after_precheck(call, pending, (yield from self._check(call, pending)))
            if not isinstance(verdict, _Swapped):
                if verdict is not None:
                    return verdict
                break
        else:
            return self._unverified(call)
        self.record_dispatch(call)
        return None

    def _replayed(self, call: _Call) -> ToolResult | None:
        """A call id that already succeeded (an agent resumed and replayed its history) gets
        the answer it was given, and is not dispatched again."""
        if not call.replayable:
            return None
        try:
            entry = self._store.ledger_call(self._scope.task_id,
                                            self._redactor.secrets(call.call_id))
        except StateUnavailableError:
            return None
        if entry is None or entry.told != "ok" or entry.idempotency_key != call.idem:
            return None  # not this call, or not a success: the ledger checks below decide
        self._budgets.refund(call)
        if entry.told_text is None:  # too large to keep: say it happened, not what it said
            return self._failures.fail(call, from_entry(
                self._catalog.get("already_applied"),
                f"this {call.name} call already ran and succeeded", outcome=Outcome.APPLIED),
                count=False)
        try:
            data = json.loads(entry.told_text)
        except ValueError:
            data = entry.told_text
        assert call.spec is not None
        return ToolResult(call.spec.name, True, entry.told_text, data, 0, call.call_id, None,
                          call.fp)

    def _peek(self, call: _Call) -> LedgerEntry | None:
        """Someone else holds the key: what it left, to be read (never written) by us."""
        if call.held or call.idem is None:
            return None
        try:
            return self._pending_effect(call)
        except StateUnavailableError:
            return None

    def _applied_meanwhile(self, call: _Call, entry: LedgerEntry) -> ToolResult:
        """"Landed" holds whoever asks; only the holder records it (the verdict is its)."""
        result = self._after_precheck(call, entry, Outcome.APPLIED)
        return result if isinstance(result, ToolResult) else self._busy(call)

    def _busy(self, call: _Call) -> ToolResult:
        self._budgets.refund(call)
        return self._failures.fail(call, from_entry(
            self._catalog.get("in_progress"),
            f"an identical {call.name} call is still running"), count=False)

    def _unreachable(self, call: _Call, exc: StateUnavailableError | None = None
                     ) -> ToolResult:
        """Refused, nothing run: the shared store cannot vouch for the key (unreachable, or
        restarted and reconciling); when to ask again, if known."""
        self._budgets.refund(call)
        wait = exc.retry_after if exc is not None else None
        reason = ("the agent's shared safety state is reconciling after a restart"
                  if wait is not None and exc is not None and "restarted" in str(exc)
                  else "the agent's shared safety state is unreachable")
        return self._failures.fail(call, from_entry(self._catalog.get("state_unavailable"),
                                                 f"{reason}; {call.name} was not run",
                                                 retry_after=wait), count=False)

    def _unverified(self, call: _Call) -> ToolResult:
        self._budgets.refund(call)
        return self._failures.fail(call, from_entry(
            self._catalog.get("effect_unknown"),
            f"an earlier identical {call.name} call may have taken effect and could not be "
            "verified"))

    def _check(self, call: _Call, entry: LedgerEntry) -> Generator[Step, Any, Outcome | None]:
        if entry.effect is Outcome.APPLIED or call.spec is None or call.spec.postcondition is None:
            return entry.effect if entry.effect is Outcome.APPLIED else None
        verdict: Outcome | None = yield VERIFY
        return verdict

    def _after_precheck(self, call: _Call, entry: LedgerEntry, verdict: Outcome | None
                        ) -> ToolResult | _Swapped | None:
        """Act on a verdict about a pending entry; only the key's holder gets here.

        Every write is a compare-and-set on the entry as it was read: when it changed
        meanwhile (a late answer landed), ``_SWAPPED_AWAY`` asks the caller to read again,
        so a stale "not landed" never overwrites what another writer recorded.
        """
        if verdict is Outcome.APPLIED:
            if call.held:
                self._swap_ledger(replace(entry, effect=Outcome.APPLIED,
                                          confirmed_by="postcondition"), entry)
            if entry.told not in (None, "ok") and entry.told_effect is not Outcome.APPLIED:
                self._emitter.incident(IncidentKind.EFFECT_MISMATCH, call.name, entry.told or "",
                               f"model was told {entry.told} (effect "
                               f"{(entry.told_effect or Outcome.UNKNOWN).value}) but the effect "
                               "landed")
            self._budgets.refund(call)
            return self._failures.fail(call, from_entry(
                self._catalog.get("already_applied"),
                f"an earlier identical {call.name} call took effect, confirmed by a check",
                outcome=Outcome.APPLIED), count=False)
        if verdict is Outcome.NO_EFFECT:
            # The key is ours, so no earlier attempt still runs: "not landed" is final.
            if not self._swap_ledger(replace(entry, effect=Outcome.NO_EFFECT,
                                             confirmed_by="postcondition"), entry):
                return _SWAPPED_AWAY
            return None
        return self._unverified(call)

    def _swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        try:
            return self._store.swap_ledger(entry, expected)
        except StateUnavailableError:
            return False

    def _claim(self, call: _Call) -> ToolResult | None:
        """Take the idempotency key atomically, before anything is read or checked.

        Sets ``call.held``; a result only when the store cannot be reached.
        """
        spec = call.spec
        assert spec is not None
        if call.idem is None:
            call.idem = self.idempotency_key(call)
        ttl = max(30.0, 4 * (spec.timeout or 30.0))
        if not call.holder:
            call.holder = secrets.token_hex(8)
        try:
            call.held = self._store.acquire(self._scope.task_id, call.idem, ttl, call.holder,
                                         local=self._store.local_ok(spec.name))
        except StateUnavailableError as exc:
            return self._unreachable(call, exc)
        return None

    def record_dispatch(self, call: _Call) -> None:
        """Write the ledger entry before dispatch, so a crash mid-call leaves a trace."""
        assert call.spec is not None
        if call.idem is None:
            call.idem = self.idempotency_key(call)
        call.entry = LedgerEntry(
            # The ledger and the store are channels too: a call id carrying a secret is
            # kept redacted (and looked up the same way, see _replayed).
            call_id=self._redactor.secrets(call.call_id), task=self._scope.task_id,
            tool=call.spec.name,
            fingerprint=call.fp,
            idempotency_key=call.idem, args=self._redactor.value(call.args),
            effect=Outcome.UNKNOWN,
        )
        self.put_ledger(call.entry)

    def put_ledger(self, entry: LedgerEntry) -> None:
        try:
            self._store.put_ledger(entry)
        except StateUnavailableError:
            self._store.fallback.put_ledger(entry)

    def release(self, call: _Call) -> None:
        """Settle the call's reservation and let go of its idempotency key.

        A timed-out or cancelled attempt keeps the key until it ends, and its answer is
        recorded as a late return first.
        """
        request = call.request
        if request is not None:
            call.request = None
            try:
                self._store.settle(request)
            except Exception:  # noqa: BLE001 - the reservation expires with its lease
                pass
        if call.held and call.idem is not None:
            orphan = call.orphan
            if orphan is not None:
                # The timed-out (or cancelled) attempt may still run: keep refusing
                # duplicates until it stops, then record in the effect channel what its late
                # answer says happened, before anyone else may claim the key (at once when it
                # already ended: a cancel can meet the answer, which its caller never saw).
                task, idem, store, entry = self._scope.task_id, call.idem, self._store, call.entry
                holder = call.holder

                def settled(done: concurrent.futures.Future[Any]) -> None:
                    if entry is not None and not done.cancelled() and done.exception() is None:
                        _quietly(store.swap_ledger, replace(
                            entry, effect=Outcome.APPLIED, confirmed_by="late return"), entry)
                    _quietly(store.release, task, idem, holder)

                orphan.add_done_callback(lambda done: _quietly(settled, done))
            else:
                try:
                    self._store.release(self._scope.task_id, call.idem, call.holder)
                except Exception:
                    pass
            call.held = False

    def verified(self, failure: Failure, verdict: Outcome | None, call: _Call,
                 running: bool = True) -> Failure:
        """Apply a postcondition's verdict to an uncertain failure.

        "Not landed" is only believed when the timed-out attempt had stopped before the check
        began (``running`` is taken then): while it runs, "not yet" is not "no", and an
        attempt that ends during the check may have landed after the check looked.
        """
        if verdict is Outcome.NO_EFFECT and (running or (call.orphan is not None
                                                         and not call.orphan.done())):
            verdict = None
        if verdict is Outcome.APPLIED:
            applied = from_entry(
                self._catalog.get("already_applied"),
                f"{call.name} did not answer in time, but a check confirmed it took effect",
                outcome=Outcome.APPLIED, cause=failure.cause,
            )
            applied.values["confirmed"] = True
            return applied
        if verdict is Outcome.NO_EFFECT:
            failure.outcome = Outcome.NO_EFFECT
            failure.values["confirmed"] = False
            return failure
        self._emitter.incident(IncidentKind.POSTCONDITION_FAILED, call.name, failure.code,
                       "the effect of a timed-out call could not be verified")
        return from_entry(
            self._catalog.get("effect_unknown"),
            f"{call.name} did not answer in time and a check could not tell whether it "
            "took effect",
            cause=failure.cause,
        )


def _succeeded(entry: LedgerEntry) -> bool:
    """The entry's effect landed and the model was told so."""
    return entry.effect is Outcome.APPLIED and entry.told == "ok"


class _Swapped:
    """The entry changed while it was being verified: read it again."""


_SWAPPED_AWAY = _Swapped()


def _quietly(op: Callable[..., Any], *args: Any) -> None:
    try:
        op(*args)
    except Exception:  # noqa: BLE001 - a background release; the key's TTL is the backstop
        pass


