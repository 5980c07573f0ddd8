-- The audit trail (pkg/audit, docs/audit.md) on the embedded store: the
-- same columns as on PostgreSQL, ts in Unix microseconds (UTC), args as JSON
-- text, no partitions (retention deletes rows).

CREATE TABLE audit_events (
    id              TEXT    NOT NULL PRIMARY KEY,
    ts              INTEGER NOT NULL,
    kind            TEXT    NOT NULL,
    tenant          TEXT    NOT NULL,
    principal       TEXT    NOT NULL DEFAULT '',
    principal_name  TEXT    NOT NULL DEFAULT '',
    role            TEXT    NOT NULL DEFAULT '',
    node            TEXT    NOT NULL DEFAULT '',
    device          TEXT    NOT NULL DEFAULT '',
    command         TEXT    NOT NULL DEFAULT '',
    tool            TEXT    NOT NULL DEFAULT '',
    args            TEXT,
    decision        TEXT    NOT NULL DEFAULT '',
    rule_id         TEXT    NOT NULL DEFAULT '',
    outcome         TEXT    NOT NULL DEFAULT '',
    error_code      TEXT    NOT NULL DEFAULT '',
    latency_us      INTEGER NOT NULL DEFAULT 0,
    trace_id        TEXT    NOT NULL DEFAULT '',
    span_id         TEXT    NOT NULL DEFAULT '',
    idempotency_key TEXT    NOT NULL DEFAULT '',
    replayed        BOOLEAN NOT NULL DEFAULT FALSE,
    request_id      TEXT    NOT NULL DEFAULT '',
    instance        TEXT    NOT NULL DEFAULT '',
    detail          TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX audit_events_tenant_ts ON audit_events (tenant, ts DESC, id DESC);
CREATE INDEX audit_events_tenant_node ON audit_events (tenant, node, ts DESC);
CREATE INDEX audit_events_tenant_principal ON audit_events (tenant, principal, ts DESC);
CREATE INDEX audit_events_tenant_tool ON audit_events (tenant, tool, ts DESC);
CREATE INDEX audit_events_ts ON audit_events (ts);

-- The views carry ts as ISO-8601 text (UTC) and ts_us as stored.
CREATE VIEW audit_invocations AS
SELECT id, strftime('%Y-%m-%dT%H:%M:%fZ', ts / 1000000.0, 'unixepoch') AS ts, ts AS ts_us, tenant, principal,
       principal_name, node, command, tool, args, decision, rule_id AS rule, outcome, error_code,
       latency_us / 1000.0 AS latency_ms, trace_id, span_id, idempotency_key, replayed, request_id, instance
FROM audit_events
WHERE kind = 'node.invoke';

CREATE VIEW audit_denials AS
SELECT id, strftime('%Y-%m-%dT%H:%M:%fZ', ts / 1000000.0, 'unixepoch') AS ts, ts AS ts_us, tenant, principal,
       principal_name, node, command, tool, args, rule_id AS rule, error_code, trace_id, instance
FROM audit_events
WHERE kind = 'node.invoke' AND decision = 'deny';

CREATE VIEW audit_sessions AS
SELECT id, strftime('%Y-%m-%dT%H:%M:%fZ', ts / 1000000.0, 'unixepoch') AS ts, ts AS ts_us, tenant, kind,
       principal, principal_name, role, node, device, outcome, error_code, detail, instance
FROM audit_events
WHERE kind IN ('operator.connect', 'operator.auth_failed', 'device.connect', 'device.disconnect', 'device.auth_failed');

CREATE VIEW audit_changes AS
SELECT id, strftime('%Y-%m-%dT%H:%M:%fZ', ts / 1000000.0, 'unixepoch') AS ts, ts AS ts_us, tenant, principal,
       principal_name, command AS change, detail, instance
FROM audit_events
WHERE kind = 'tenancy.change';
