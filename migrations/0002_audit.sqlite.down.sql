DROP VIEW IF EXISTS audit_changes;
DROP VIEW IF EXISTS audit_sessions;
DROP VIEW IF EXISTS audit_denials;
DROP VIEW IF EXISTS audit_invocations;
DROP TABLE IF EXISTS audit_events;
