-- Tenants that require an admin's approval of the tools a known node gains.
ALTER TABLE tenants ADD COLUMN require_tool_approval BOOLEAN NOT NULL DEFAULT FALSE;
