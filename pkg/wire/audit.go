package wire

// The audit trail travels on a JetStream stream: a gateway publishes one
// audit.Event per node.invoke (and per connect, auth failure and tenancy
// change) and waits for the stream's acknowledgement before it answers; the
// audit writers consume the stream into the database.
const (
	// StreamAudit is the JetStream stream of audit events (file storage,
	// work-queue retention: an event leaves the stream once a writer has
	// committed it).
	StreamAudit = "XC_AUDIT"
	// SubjectAuditAll matches every tenant's audit subject.
	SubjectAuditAll = "xc.*.audit"
	// ConsumerAuditWriter is the durable pull consumer shared by all audit
	// writer replicas.
	ConsumerAuditWriter = "audit-writer"
	// QueueAudit is the queue group of the audit collectors, which turn
	// device state and tenancy change messages into audit events.
	QueueAudit = "audit"
)

// Audit is the subject a tenant's audit events are published on.
func Audit(tenant string) string { return "xc." + tenant + ".audit" }
