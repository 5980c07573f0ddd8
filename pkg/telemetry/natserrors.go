package telemetry

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// MetricNATSAsyncErrors counts the asynchronous errors NATS reported on a
// service's connection: slow consumers (a subscription's pending buffer
// was full and messages were dropped), permission violations, others.
const MetricNATSAsyncErrors = "xiaoclaw_nats_async_errors_total"

// Kinds of NATS asynchronous errors (the kind label).
const (
	NATSErrSlowConsumer = "slow_consumer"
	NATSErrPermission   = "permission"
	NATSErrOther        = "other"
)

// natsErrLogEvery spaces the log lines about one subscription's errors.
const natsErrLogEvery = 10 * time.Second

// NATSErrorHandler returns the handler of a connection's asynchronous
// errors (nats.ErrorHandler): it counts each in
// xiaoclaw_nats_async_errors_total{service,kind} and logs it, at most once
// per 10 s per subject, with the messages the subscription dropped so far.
// Without it nats.go reports a slow consumer nowhere.
func NATSErrorHandler(reg prometheus.Registerer, service string, log *slog.Logger) (nats.ErrHandler, error) {
	errs, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricNATSAsyncErrors,
		Help: "Asynchronous NATS errors on the service's connection, by kind (slow_consumer: messages dropped).",
	}, []string{LabelService, "kind"}))
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	logged := map[string]time.Time{}
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		kind := NATSErrOther
		switch {
		case errors.Is(err, nats.ErrSlowConsumer):
			kind = NATSErrSlowConsumer
		case errors.Is(err, nats.ErrPermissionViolation):
			kind = NATSErrPermission
		}
		errs.WithLabelValues(service, kind).Inc()
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		now := time.Now()
		mu.Lock()
		if last, ok := logged[kind+" "+subject]; ok && now.Sub(last) < natsErrLogEvery {
			mu.Unlock()
			return
		}
		logged[kind+" "+subject] = now
		mu.Unlock()
		attrs := []any{"kind", kind, "subject", subject, "err", err}
		if sub != nil && kind == NATSErrSlowConsumer {
			dropped, _ := sub.Dropped()
			msgs, bytes, _ := sub.Pending()
			attrs = append(attrs, "dropped_total", dropped, "pending_msgs", msgs, "pending_bytes", bytes)
		}
		log.Warn("NATS asynchronous error", attrs...)
	}, nil
}
