"""The RMA hand-off to Jira (REST API v2, as Jira Data Center serves it): one issue per
incident with the host, the failing parts' serial numbers and the evidence files attached
(the incident JSON, logs, `nvidia-smi -q` / DCGM output where collected, and the incident's
evidence bundle, read from the control plane's object store when the ticket is sent: the
notice names the object, never carries its bytes). The generic signed
JSON RMA (channel type `rma_webhook`) goes through notify.generic_payload.

It must never open a second ticket for the same incident: the incident's label is searched
(JQL) first, so a retry or a new leader finds the ticket already opened and only completes
its attachments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from denpex.remediation import delivery

# (tenant, "kind/name") → the object's bytes: the control plane's object store, injected
AttachmentReader = Callable[[str, str], bytes]


class Channel(Protocol):
    """What of a notify.Channel the hand-off reads."""

    url: str
    secret: bytes | None
    options: Mapping[str, Any]


class Notice(Protocol):
    """What of a notify.Notice (frozen) the hand-off reads."""

    @property
    def summary(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def category(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def incident_id(self) -> int | None: ...

    @property
    def plan_id(self) -> int | None: ...

    @property
    def link(self) -> str | None: ...

    @property
    def serials(self) -> Sequence[str]: ...

    @property
    def evidence(self) -> Mapping[str, str]: ...

    @property
    def attachments(self) -> Mapping[str, str]: ...

    def dedup_key(self) -> str: ...


def issue_fields(notice: Notice, project: str, issue_type: str) -> dict[str, Any]:
    """The `fields` of POST /rest/api/2/issue (Jira wiki markup in the description)."""
    serials = "\n".join(f"* {s}" for s in notice.serials) or "* (none reported)"
    names = [*notice.evidence, *notice.attachments]
    files = "\n".join(f"* [^{name}]" for name in names) or "* (none collected)"
    description = (
        f"h3. {notice.summary}\n"
        f"*Host:* {notice.host}\n*Category:* {notice.category}\n*Tenant:* {notice.tenant}\n"
        f"*Incident:* {notice.incident_id}  *Plan:* {notice.plan_id}\n\n"
        f"h4. Serial numbers\n{serials}\n\nh4. Evidence (attached)\n{files}\n"
    )
    if notice.link:
        description += f"\n[The plan in denpex|{notice.link}]\n"
    return {
        "project": {"key": project},
        "issuetype": {"name": issue_type},
        "summary": f"RMA {notice.host}: {notice.category}"[:255],
        "description": description,
        "labels": ["denpex", "denpex-rma", notice.dedup_key()],
    }


def _request(
    http: Any,
    method: str,
    url: str,
    sleep: Callable[[float], None],
    attempts: list[Any],
    **kwargs: Any,
) -> Any:
    """One Jira request, retried on the retryable answers (webhook.yaml)."""
    import httpx

    conf = delivery.settings()["delivery"]
    retryable = {int(s) for s in conf["retry_statuses"]}
    wait = float(conf["backoff_s"])
    for attempt in range(1, int(conf["attempts"]) + 1):
        try:
            response = http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            attempts.append({"url": url, "attempt": attempt, "error": str(exc)})
        else:
            attempts.append({"url": url, "attempt": attempt, "status": response.status_code})
            if response.status_code not in retryable:
                return response
        if attempt < int(conf["attempts"]):
            sleep(min(wait, float(conf["backoff_max_s"])))
            wait *= 2
    return None


def _content_type(name: str) -> str:
    if name.endswith((".tar.gz", ".tgz", ".gz")):
        return "application/gzip"
    return "application/json" if name.endswith(".json") else "text/plain"


def _files(notice: Notice, read: AttachmentReader | None) -> list[tuple[str, Callable[[], bytes]]]:
    """(name, how to get its bytes) of every file the ticket carries; a stored object is read
    only when it still has to be attached."""

    def stored(ref: str) -> Callable[[], bytes]:
        def load() -> bytes:
            if read is None:
                raise LookupError(f"no object store to read {ref} from")
            return read(notice.tenant, ref)

        return load

    def inline(text: str) -> Callable[[], bytes]:
        return lambda: text.encode()

    out = [(name, inline(text)) for name, text in notice.evidence.items()]
    out.extend((name, stored(ref)) for name, ref in notice.attachments.items())
    return out


def open_jira_ticket(
    channel: Channel,
    notice: Notice,
    *,
    sleep: Callable[[float], None] = time.sleep,
    read: AttachmentReader | None = None,
) -> dict[str, Any]:
    """Find or open the incident's RMA issue and attach its evidence and stored objects
    (`read` fetches those); the record of it."""
    import httpx

    base = channel.url.rstrip("/")
    headers = {"Accept": "application/json"}
    if channel.secret:  # a Jira Data Center personal access token
        headers["Authorization"] = f"Bearer {channel.secret.decode()}"
    project = str(channel.options.get("project", "OPS"))
    issue_type = str(channel.options.get("issue_type", "Task"))
    attempts: list[Any] = []
    out: dict[str, Any] = {"ok": False, "key": None, "created": False, "attached": []}
    out["attempts"] = attempts
    with httpx.Client(timeout=float(delivery.settings()["delivery"]["timeout_s"])) as http:
        jql = f'labels = "{notice.dedup_key()}"'
        found = _request(
            http,
            "GET",
            f"{base}/rest/api/2/search",
            sleep,
            attempts,
            params={"jql": jql, "fields": "attachment"},
            headers=headers,
        )
        if found is None or found.status_code != 200:
            out["error"] = f"search: {found.status_code if found else 'no answer'}"
            return out
        issues = found.json().get("issues") or []
        present: set[str] = set()
        if issues:
            out["key"] = issues[0]["key"]
            for att in (issues[0].get("fields") or {}).get("attachment") or []:
                present.add(att.get("filename"))
        else:
            created = _request(
                http,
                "POST",
                f"{base}/rest/api/2/issue",
                sleep,
                attempts,
                json={"fields": issue_fields(notice, project, issue_type)},
                headers=headers,
            )
            if created is None or created.status_code != 201:
                answer = created.text[:500] if created is not None else "no answer"
                out["error"] = f"create: {created.status_code if created else '-'} {answer}"
                return out
            out["key"], out["created"] = created.json()["key"], True
        for name, load in _files(notice, read):
            if name in present:
                continue
            try:
                data = load()
            except Exception as exc:  # the object store's errors say what to do
                out["error"] = f"attach {name}: {exc}"
                return out
            sent = _request(
                http,
                "POST",
                f"{base}/rest/api/2/issue/{out['key']}/attachments",
                sleep,
                attempts,
                files={"file": (name, data, _content_type(name))},
                headers={**headers, "X-Atlassian-Token": "no-check"},
            )
            if sent is None or sent.status_code != 200:
                out["error"] = f"attach {name}: {sent.status_code if sent else 'no answer'}"
                return out
            out["attached"].append(name)
    out["ok"] = True
    return out
