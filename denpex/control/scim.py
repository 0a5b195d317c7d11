"""SCIM 2.0 provisioning in the store (RFC 7643/7644): scim2-server's protocol handler (filters,
PATCH, sorting, index pagination, ETags, bulk) over a storage that keeps one tenant's Users
and Groups in its tenant tables, and what provisioning means for denpex: a group's members
get the role the identity mappings give that group's name in the tenant; a user set inactive
or removed loses every session and token standing for them, at once. Both are audited.

It must never store a password (SCIM may send one; denpex signs no one in with it), never
reach another tenant's rows (every query names the tenant; PostgreSQL's row-level security
filters again) and never let a deprovisioned person's token outlive the request that ended it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.identity_audit import IdentityAudit
from denpex.control.store import Store
from denpex.enterprise.oidc import Mapping_

log = logging.getLogger("denpex.server")

try:  # the scim extra; the routes answer 503 without it
    from scim2_models import (
        Meta,
        NotFoundException,
        PreconditionFailedException,
        Resource,
        ResourceType,
        ResponseParameters,
        SearchRequest,
        UniquenessException,
    )
    from scim2_server.storage import ScimStorage, SearchPage
except ImportError:  # pragma: no cover - checked by scim_available()
    ScimStorage = object  # type: ignore[assignment,misc]

USER, GROUP = "User", "Group"


def scim_available() -> str:
    """'' when the SCIM libraries are installed, else what to install."""
    try:
        import scim2_models  # noqa: F401
        import scim2_server  # noqa: F401
    except ImportError:
        return "SCIM needs scim2-server and scim2-models: pip install 'denpex[scim]'"
    return ""


def owners_of(user_id: str, user_name: str) -> list[str]:
    """The token owners that stand for one SCIM user: its SSO sessions and its own tokens."""
    return [f"saml:{user_name}", f"scim:{user_id}", f"oidc:{user_name}"]


class TenantScimStorage(ScimStorage):  # type: ignore[misc,valid-type]
    """scim2-server's storage for one tenant, in the store."""

    def __init__(
        self,
        db: Database,
        store: Store,
        identity: IdentityAudit,
        tenant: str,
        rules: Callable[[str], Sequence[Mapping_]],
        model_of: Callable[[Any], type[Any]],
        actor: str,
    ) -> None:
        self.db = db
        self.store = store
        self.identity = identity
        self.tenant = tenant
        self.rules = rules
        self.model_of = model_of
        self.actor = actor

    # --- reads -------------------------------------------------------------------------------

    def _table(self, resource_type: ResourceType) -> sa.Table:
        return s.scim_users if resource_type.name == USER else s.scim_groups

    def _load(self, resource_type: ResourceType, row: Any) -> Resource[Any]:
        return self.model_of(resource_type).model_validate(orjson.loads(row.resource))

    def get(
        self,
        resource_type: ResourceType,
        resource_id: str,
        *,
        response_parameters: ResponseParameters[Any] | None = None,
    ) -> Resource[Any]:
        t = self._table(resource_type)
        with self.db.tenant_tx(self.tenant) as conn:
            row = conn.execute(
                sa.select(t.c.resource).where(t.c.tenant == self.tenant, t.c.id == resource_id)
            ).first()
        if row is None:
            raise NotFoundException(detail=f"{resource_type.name} {resource_id!r} not found")
        return self._load(resource_type, row)

    def search(
        self,
        resource_types: list[ResourceType],
        search_request: SearchRequest[Any],
        *,
        position: Any = None,
    ) -> SearchPage:
        found: list[Resource[Any]] = []
        with self.db.tenant_tx(self.tenant) as conn:
            for resource_type in {rt.name: rt for rt in resource_types}.values():
                t = self._table(resource_type)
                query = sa.select(t.c.resource).where(t.c.tenant == self.tenant)
                found += [self._load(resource_type, r) for r in conn.execute(query)]
        scim_filter = search_request.filter
        if scim_filter is not None:
            found = [r for r in found if _matches(scim_filter, r)]

        def key(resource: Resource[Any]) -> tuple[bool, Any, str]:
            value = search_request.sort_value(resource)
            return value is None, value if value is not None else "", str(resource.id)

        descending = search_request.sort_by is not None and (
            search_request.sort_order == SearchRequest.SortOrder.descending
        )
        found.sort(key=key, reverse=descending)
        start = search_request.start_index_0 or 0
        stop = None if search_request.count is None else start + search_request.count
        return SearchPage(len(found), found[start:stop])

    # --- writes ------------------------------------------------------------------------------

    def create(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        resource = self._clean(resource)
        resource.id = uuid.uuid4().hex
        now = datetime.now(UTC)
        resource.meta = Meta(
            resource_type=resource_type.name, created=now, last_modified=now, version='W/"1"'
        )
        self._write(resource_type, resource, 1, insert=True)
        return resource

    def update(
        self,
        resource_type: ResourceType,
        resource: Resource[Any],
        *,
        expected_version: str | None = None,
    ) -> Resource[Any]:
        stored = self.get(resource_type, str(resource.id))
        _check_version(stored, expected_version)
        meta = stored.meta
        assert meta is not None  # every stored resource carries one (create() wrote it)
        version = int(str(meta.version).strip('W/"')) + 1
        updated = self._clean(resource)
        updated.meta = meta.model_copy(
            update={
                "location": None,
                "last_modified": datetime.now(UTC),
                "version": f'W/"{version}"',
            }
        )
        self._write(resource_type, updated, version, insert=False, expected=version - 1)
        return updated

    def delete(
        self, resource_type: ResourceType, resource_id: str, *, expected_version: str | None = None
    ) -> None:
        stored = self.get(resource_type, resource_id)
        _check_version(stored, expected_version)
        t = self._table(resource_type)
        now_ns = time.time_ns()
        if resource_type.name == USER:  # first: the row still says what role it had
            self._deprovision(resource_id, str(getattr(stored, "user_name", "")), now_ns)
        with self.db.tenant_tx(self.tenant, write=True) as conn:
            conn.execute(t.delete().where(t.c.tenant == self.tenant, t.c.id == resource_id))
            m = s.scim_members
            column = m.c.user_id if resource_type.name == USER else m.c.group_id
            affected = self._members_of(conn, resource_id) if resource_type.name == GROUP else []
            conn.execute(m.delete().where(m.c.tenant == self.tenant, column == resource_id))
        if resource_type.name == GROUP:
            self._reassess(affected, now_ns)

    def _clean(self, resource: Resource[Any]) -> Resource[Any]:
        # a password is never stored: no one signs in to denpex with it
        return resource.model_copy(deep=True, update={"password": None} if
                                   getattr(resource, "password", None) is not None else None)  # fmt: skip

    def _write(
        self,
        resource_type: ResourceType,
        resource: Resource[Any],
        version: int,
        *,
        insert: bool,
        expected: int | None = None,
    ) -> None:
        t = self._table(resource_type)
        doc = resource.model_dump(mode="json")
        now_ns = time.time_ns()
        row: dict[str, Any] = {
            "resource": orjson.dumps(doc).decode(),
            "version": version,
            "updated_ns": now_ns,
            "external_id": doc.get("externalId"),
        }
        if resource_type.name == USER:
            row.update(user_name=doc.get("userName"), active=doc.get("active", True) is not False)
        else:
            row.update(display_name=doc.get("displayName") or "")
        rid = str(resource.id)
        try:
            with self.db.tenant_tx(self.tenant, write=True) as conn:
                if insert:
                    conn.execute(
                        t.insert().values(tenant=self.tenant, id=rid, created_ns=now_ns, **row)
                    )
                else:
                    done = conn.execute(
                        t.update()
                        .where(t.c.tenant == self.tenant, t.c.id == rid, t.c.version == expected)
                        .values(**row)
                    ).rowcount
                    if not done:  # another writer came first
                        raise PreconditionFailedException()
                affected: list[str] = []
                if resource_type.name == GROUP:
                    affected = self._set_members(conn, rid, doc.get("members") or [])
        except sa.exc.IntegrityError:
            raise UniquenessException(detail="userName is taken in this tenant") from None
        if resource_type.name == USER:
            if row["active"]:
                self._reassess([rid], now_ns)
            else:
                self._deprovision(rid, str(row["user_name"]), now_ns)
        else:
            self._reassess(affected, now_ns)

    # --- memberships, roles, deprovisioning --------------------------------------------------

    def _members_of(self, conn: Connection, group_id: str) -> list[str]:
        m = s.scim_members
        query = sa.select(m.c.user_id).where(m.c.tenant == self.tenant, m.c.group_id == group_id)
        return list(conn.execute(query).scalars())

    def _set_members(self, conn: Connection, group_id: str, members: list[Any]) -> list[str]:
        """Replace the group's member rows; returns every user whose membership changed."""
        m = s.scim_members
        before = set(self._members_of(conn, group_id))
        after = {str(x.get("value")) for x in members if isinstance(x, dict) and x.get("value")}
        conn.execute(m.delete().where(m.c.tenant == self.tenant, m.c.group_id == group_id))
        for user_id in sorted(after):
            conn.execute(m.insert().values(tenant=self.tenant, group_id=group_id, user_id=user_id))
        return sorted(before | after)  # a renamed group may change every member's role

    def role_of(self, conn: Connection, user_id: str) -> str | None:
        """The role the tenant's identity mappings give the user's groups (first rule wins)."""
        m, g = s.scim_members, s.scim_groups
        names = set(
            conn.execute(
                sa.select(g.c.display_name)
                .select_from(m.join(g, sa.and_(m.c.tenant == g.c.tenant, m.c.group_id == g.c.id)))
                .where(m.c.tenant == self.tenant, m.c.user_id == user_id)
            ).scalars()
        )
        for rule in self.rules(self.tenant):
            if rule.group is not None and rule.group in names:
                return rule.role
        return None

    def _reassess(self, user_ids: Sequence[str], now_ns: int) -> None:
        u = s.scim_users
        for user_id in user_ids:
            with self.db.tenant_tx(self.tenant, write=True) as conn:
                row = conn.execute(
                    sa.select(u.c.user_name, u.c.role, u.c.active).where(
                        u.c.tenant == self.tenant, u.c.id == user_id
                    )
                ).first()
                if row is None or not row.active:
                    continue
                new = self.role_of(conn, user_id)
                if new == row.role:
                    continue
                conn.execute(
                    u.update().where(u.c.tenant == self.tenant, u.c.id == user_id).values(role=new)
                )
            owners = owners_of(user_id, row.user_name)
            if new is None:
                self.store.revoke_owned(self.tenant, owners, now_ns, self.actor)
            else:
                self.store.set_owned_role(self.tenant, owners, new)
            self.identity.role_changed(
                self.tenant, f"scim:{row.user_name}", row.role, new, by=self.actor, now_ns=now_ns
            )

    def _deprovision(self, user_id: str, user_name: str, now_ns: int) -> None:
        revoked = self.store.revoke_owned(self.tenant, owners_of(user_id, user_name), now_ns,
                                          self.actor)  # fmt: skip
        u = s.scim_users
        with self.db.tenant_tx(self.tenant, write=True) as conn:
            old = conn.execute(
                sa.select(u.c.role).where(u.c.tenant == self.tenant, u.c.id == user_id)
            ).scalar()
            conn.execute(
                u.update().where(u.c.tenant == self.tenant, u.c.id == user_id).values(role=None)
            )
        self.identity.role_changed(
            self.tenant,
            f"scim:{user_name}",
            old,
            None,
            by=self.actor,
            now_ns=now_ns,
            why={"deprovisioned": True, "tokens_revoked": revoked},
        )


def _matches(scim_filter: Any, resource: Any) -> bool:
    from scim2_models import ScimFilter
    from scim2_server.utils import parametrize

    if not scim_filter.models:
        scim_filter = parametrize(ScimFilter, type(resource))(str(scim_filter))
    return bool(scim_filter.match(resource))


def _check_version(resource: Any, expected_version: str | None) -> None:
    if expected_version is not None and resource.meta.version != expected_version:
        raise PreconditionFailedException()


def user_role(db: Database, tenant: str, user_name: str) -> tuple[bool, str | None] | None:
    """(active, role) of the SCIM user `user_name` in `tenant`; None when SCIM does not know
    them (an SSO sign-in then takes the role its assertion's groups give)."""
    u = s.scim_users
    with db.tenant_tx(tenant) as conn:
        row = conn.execute(
            sa.select(u.c.active, u.c.role).where(u.c.tenant == tenant, u.c.user_name == user_name)
        ).first()
    return None if row is None else (bool(row.active), row.role)
