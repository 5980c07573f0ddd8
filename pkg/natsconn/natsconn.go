// Package natsconn is how a service process connects to NATS: an
// ever-retrying connection whose disconnects, reconnects and asynchronous
// errors (slow consumers, permission violations) are logged and counted,
// and whose state is exported as the xiaoclaw_nats_connected gauge. The
// credentials come from natsauth as nats.Options.
package natsconn

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// Connect connects to NATS for ever-retrying use by a service, logs
// disconnects, reconnects and asynchronous errors such as slow consumers and
// permission violations (ErrorHandler) on log, and exports the connection
// state as the xiaoclaw_nats_connected gauge with the service label in reg.
// opts add the service's credentials (natsauth).
func Connect(reg prometheus.Registerer, url, name, label string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	onErr, err := ErrorHandler(reg, label, log)
	if err != nil {
		return nil, err
	}
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ErrorHandler(onErr),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect NATS %s: %w", url, err)
	}
	if err := telemetry.RegisterNATSConnected(reg, label, nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// MetricAsyncErrors counts the asynchronous errors NATS reported on a
// service's connection: slow consumers (a subscription's pending buffer
// was full and messages were dropped), permission violations, others.
const MetricAsyncErrors = "xiaoclaw_nats_async_errors_total"

// Kinds of NATS asynchronous errors (the kind label).
const (
	KindSlowConsumer = "slow_consumer"
	KindPermission   = "permission"
	KindOther        = "other"
)

// natsErrLogEvery spaces the log lines about one subscription's errors.
const natsErrLogEvery = 10 * time.Second

// ErrorHandler returns the handler of a connection's asynchronous
// errors (nats.ErrorHandler): it counts each in
// xiaoclaw_nats_async_errors_total{service,kind} and logs it, at most once
// per 10 s per subject, with the messages the subscription dropped so far.
// Without it nats.go reports a slow consumer nowhere.
func ErrorHandler(reg prometheus.Registerer, service string, log *slog.Logger) (nats.ErrHandler, error) {
	errs, err := telemetry.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAsyncErrors,
		Help: "Asynchronous NATS errors on the service's connection, by kind (slow_consumer: messages dropped).",
	}, []string{telemetry.LabelService, "kind"}))
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	logged := map[string]time.Time{}
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		kind := KindOther
		switch {
		case errors.Is(err, nats.ErrSlowConsumer):
			kind = KindSlowConsumer
		case errors.Is(err, nats.ErrPermissionViolation):
			kind = KindPermission
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
		if sub != nil && kind == KindSlowConsumer {
			dropped, _ := sub.Dropped()
			msgs, bytes, _ := sub.Pending()
			attrs = append(attrs, "dropped_total", dropped, "pending_msgs", msgs, "pending_bytes", bytes)
		}
		log.Warn("NATS asynchronous error", attrs...)
	}, nil
}
