DROP TABLE node_groups;
DROP TABLE policy_rules;
DROP TABLE device_allowlist;
DROP TABLE device_keys;
DROP TABLE operator_tokens;
DROP TABLE tenants;
