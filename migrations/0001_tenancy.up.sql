-- Tenants, operator tokens, device keys, device allowlists, policy rules and
-- node groups. Portable SQL: the same file runs on PostgreSQL and SQLite.
-- Times are Unix milliseconds. Every table carries the tenant.

CREATE TABLE tenants (
    id               TEXT PRIMARY KEY,
    display_name     TEXT    NOT NULL DEFAULT '',
    status           TEXT    NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    default_effect   TEXT    NOT NULL DEFAULT 'allow' CHECK (default_effect IN ('allow', 'deny')),
    device_allowlist BOOLEAN NOT NULL DEFAULT FALSE,
    -- bumped by every change of the tenant or anything it owns; replicas poll
    -- it to catch change notifications they missed
    version          BIGINT  NOT NULL DEFAULT 1,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

CREATE TABLE operator_tokens (
    id          TEXT PRIMARY KEY,
    tenant      TEXT   NOT NULL REFERENCES tenants (id),
    name        TEXT   NOT NULL DEFAULT '',
    role        TEXT   NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
    secret_hash TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
);
CREATE INDEX operator_tokens_tenant ON operator_tokens (tenant);

CREATE TABLE device_keys (
    id         TEXT PRIMARY KEY,
    tenant     TEXT   NOT NULL REFERENCES tenants (id),
    secret     TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    retire_at  BIGINT
);
CREATE INDEX device_keys_tenant ON device_keys (tenant);

CREATE TABLE device_allowlist (
    tenant TEXT NOT NULL REFERENCES tenants (id),
    device TEXT NOT NULL,
    PRIMARY KEY (tenant, device)
);

CREATE TABLE policy_rules (
    id          TEXT PRIMARY KEY,
    tenant      TEXT   NOT NULL REFERENCES tenants (id),
    effect      TEXT   NOT NULL CHECK (effect IN ('allow', 'deny')),
    subject     TEXT   NOT NULL,
    object      TEXT   NOT NULL,
    action      TEXT   NOT NULL,
    cond        TEXT   NOT NULL DEFAULT '',
    description TEXT   NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL
);
CREATE INDEX policy_rules_tenant ON policy_rules (tenant, created_at);

CREATE TABLE node_groups (
    tenant TEXT NOT NULL REFERENCES tenants (id),
    grp    TEXT NOT NULL,
    node   TEXT NOT NULL,
    PRIMARY KEY (tenant, grp, node)
);
