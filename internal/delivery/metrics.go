package delivery

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pipeline's. No lock of the relay is held while one is
// called, and the ones computed at scrape time read atomics of a snapshot
// of the lanes (Pipeline.runners, the engine's), so a scrape never waits for delivery and
// delivery never waits for a scrape.
type metrics struct {
	delivered   prometheus.Counter
	retried     prometheus.Counter
	dead        *prometheus.CounterVec
	laneStopped prometheus.Collector
	paused      prometheus.GaugeFunc
	readAhead   prometheus.GaugeFunc
	// A form kind's only (nil for events): answers by class, requests
	// retried, lanes running.
	requests *prometheus.CounterVec
	retries  prometheus.Counter
	lanes    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, p *Pipeline) (*metrics, error) {
	m := &metrics{
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_delivery_events_delivered_total",
			Help: "Events the upstream answered 200 for.",
		}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_delivery_events_retried_total",
			Help: "Events put back for another request after a non-200 answer.",
		}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_delivery_events_dead_lettered_total",
			Help: "Events moved to the dead-letter store, by reason.",
		}, []string{"reason"}),
		laneStopped: NewStoppedCollector(p.LaneStatus, true),
	}
	m.paused = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_delivery_paused_devices",
		Help: "Devices and users whose events are held now (429 pause, daily quota, pacing).",
	}, func() float64 {
		var n int64
		for _, lr := range p.runners() {
			n += lr.heldKeys.Load()
		}
		return float64(n)
	})
	m.readAhead = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_delivery_read_ahead_bytes",
		Help: "Memory held by events read from the spool and not yet delivered, all lanes (bounded by the read-ahead budget).",
	}, func() float64 { return float64(p.budget.Used()) })
	for _, r := range []string{"silenced", "invalid_fields", "missing_fields", "bad_request", "too_large", "expired"} {
		m.dead.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.delivered, m.retried, m.dead, m.laneStopped, m.paused, m.readAhead, newHeldCollector(p)} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("delivery: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
