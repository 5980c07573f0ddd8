-- The audit trail (pkg/audit, docs/audit.md). One row per event, partitioned
-- by day on ts (UTC); the audit writer creates partitions ahead of time and
-- retention drops whole partitions. Rows are written with COPY into a
-- staging table and INSERT … ON CONFLICT DO NOTHING, so a re-delivered event
-- is stored once: its id fixes its ts, hence the key (ts, id).

CREATE TABLE audit_events (
    id              TEXT        NOT NULL,
    ts              TIMESTAMPTZ NOT NULL,
    kind            TEXT        NOT NULL,
    tenant          TEXT        NOT NULL,
    principal       TEXT        NOT NULL DEFAULT '',
    principal_name  TEXT        NOT NULL DEFAULT '',
    role            TEXT        NOT NULL DEFAULT '',
    node            TEXT        NOT NULL DEFAULT '',
    device          TEXT        NOT NULL DEFAULT '',
    command         TEXT        NOT NULL DEFAULT '',
    tool            TEXT        NOT NULL DEFAULT '',
    args            JSONB,
    decision        TEXT        NOT NULL DEFAULT '',
    rule_id         TEXT        NOT NULL DEFAULT '',
    outcome         TEXT        NOT NULL DEFAULT '',
    error_code      TEXT        NOT NULL DEFAULT '',
    latency_us      BIGINT      NOT NULL DEFAULT 0,
    trace_id        TEXT        NOT NULL DEFAULT '',
    span_id         TEXT        NOT NULL DEFAULT '',
    idempotency_key TEXT        NOT NULL DEFAULT '',
    replayed        BOOLEAN     NOT NULL DEFAULT FALSE,
    request_id      TEXT        NOT NULL DEFAULT '',
    instance        TEXT        NOT NULL DEFAULT '',
    detail          TEXT        NOT NULL DEFAULT '',
    PRIMARY KEY (ts, id)
) PARTITION BY RANGE (ts);

-- The API's queries: a tenant's newest events, optionally by node,
-- principal, tool or outcome.
CREATE INDEX audit_events_tenant_ts ON audit_events (tenant, ts DESC, id DESC);
CREATE INDEX audit_events_tenant_node ON audit_events (tenant, node, ts DESC);
CREATE INDEX audit_events_tenant_principal ON audit_events (tenant, principal, ts DESC);
CREATE INDEX audit_events_tenant_tool ON audit_events (tenant, tool, ts DESC) WHERE tool <> '';
CREATE INDEX audit_events_tenant_denied ON audit_events (tenant, ts DESC) WHERE decision = 'deny';
CREATE INDEX audit_events_trace ON audit_events (trace_id) WHERE trace_id <> '';

-- One row per node.invoke.
CREATE VIEW audit_invocations AS
SELECT id, ts, tenant, principal, principal_name, node, command, tool, args, decision,
       rule_id AS rule, outcome, error_code, latency_us / 1000.0 AS latency_ms,
       trace_id, span_id, idempotency_key, replayed, request_id, instance
FROM audit_events
WHERE kind = 'node.invoke';

-- Calls the policy refused.
CREATE VIEW audit_denials AS
SELECT id, ts, tenant, principal, principal_name, node, command, tool, args,
       rule_id AS rule, error_code, trace_id, instance
FROM audit_events
WHERE kind = 'node.invoke' AND decision = 'deny';

-- Connects, disconnects and authentication failures of operators, node
-- hosts and devices.
CREATE VIEW audit_sessions AS
SELECT id, ts, tenant, kind, principal, principal_name, role, node, device, outcome, error_code, detail, instance
FROM audit_events
WHERE kind IN ('operator.connect', 'operator.auth_failed', 'device.connect', 'device.disconnect', 'device.auth_failed');

-- Changes of tenants, credentials, allowlists, policy rules and groups.
CREATE VIEW audit_changes AS
SELECT id, ts, tenant, principal, principal_name, command AS change, detail, instance
FROM audit_events
WHERE kind = 'tenancy.change';
