-- The OpenClaw gateways a tenant publishes its nodes to (upstream mode).
-- The secret (the gateway's token or password) is kept as it is given,
-- like a device key's secret: the shims need it to connect. The admin API
-- never returns it. Portable SQL: the same file runs on PostgreSQL and SQLite.

CREATE TABLE upstreams (
    tenant               TEXT    NOT NULL REFERENCES tenants (id),
    name                 TEXT    NOT NULL,
    url                  TEXT    NOT NULL,
    auth                 TEXT    NOT NULL CHECK (auth IN ('token', 'password')),
    secret               TEXT    NOT NULL,
    ca_cert              TEXT    NOT NULL DEFAULT '',
    insecure_skip_verify BOOLEAN NOT NULL DEFAULT FALSE,
    publish              TEXT    NOT NULL CHECK (publish IN ('all', 'group', 'nodes')),
    publish_group        TEXT    NOT NULL DEFAULT '',
    -- node ids, space separated (ids hold only [A-Za-z0-9_-])
    publish_nodes        TEXT    NOT NULL DEFAULT '',
    -- SHA-256 of the caller token the shim presents to xiaoclaw's gateway
    -- for the upstream's calls (principal upstream:<name>); shown once
    caller_hash          TEXT    NOT NULL,
    created_at           BIGINT  NOT NULL,
    PRIMARY KEY (tenant, name)
);
