package wire

// SubjectHubHeartbeat carries a HubHeartbeat from every devicehub replica
// at a fixed interval. Shims mark the devices of a hub they stop hearing
// from disconnected: a hub that dies without a word (kill -9, a lost node,
// a partition) publishes no offline events.
const SubjectHubHeartbeat = "xc._sys.hub.heartbeat"

// HubHeartbeat is the payload of SubjectHubHeartbeat.
type HubHeartbeat struct {
	// Hub is the replica's instance name, as in DeviceEvent.Hub and
	// NodeRecord.Owner.
	Hub string `json:"hub"`
	// StartedMs is when this process started: a record owned by Hub whose
	// session started earlier belongs to a previous process of the same
	// name, which is gone.
	StartedMs int64 `json:"startedMs"`
	// IntervalMs is the time to the next heartbeat.
	IntervalMs int64 `json:"intervalMs"`
	// Sessions is the number of sessions the hub holds (informational).
	Sessions int `json:"sessions"`
}
