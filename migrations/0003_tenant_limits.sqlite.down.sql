ALTER TABLE tenants DROP COLUMN max_inflight_per_device;
ALTER TABLE tenants DROP COLUMN max_inflight;
