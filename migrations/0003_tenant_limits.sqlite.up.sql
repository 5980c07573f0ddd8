-- Per-tenant in-flight limits of node.invoke on each shim replica. NULL takes
-- the shim's default (--tenant-max-inflight, --device-max-inflight).
ALTER TABLE tenants ADD COLUMN max_inflight INTEGER CHECK (max_inflight > 0);
ALTER TABLE tenants ADD COLUMN max_inflight_per_device INTEGER CHECK (max_inflight_per_device > 0);
