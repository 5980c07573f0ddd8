ALTER TABLE tenants DROP COLUMN require_tool_approval;
