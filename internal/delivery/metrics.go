package delivery

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the pipeline's; the package doc says which locks they avoid.
type metrics struct {
	delivered prometheus.Counter
	retried   prometheus.Counter
	dead      *prometheus.CounterVec
	// A form kind's only (nil for events): answers by class, requests
	// retried, lanes running.
	requests *prometheus.CounterVec
	retries  prometheus.Counter
	lanes    prometheus.Gauge
}

// newMetrics are the events' metrics, registered on reg (nil: none).
func newMetrics(reg prometheus.Registerer, p *Pipeline) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		delivered: f.NewCounter(prometheus.CounterOpts{
			Name: "relay_delivery_events_delivered_total",
			Help: "Events the upstream answered 200 for.",
		}),
		retried: f.NewCounter(prometheus.CounterOpts{
			Name: "relay_delivery_events_retried_total",
			Help: "Events put back for another request after a non-200 answer.",
		}),
		dead: f.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_delivery_events_dead_lettered_total",
			Help: "Events moved to the dead-letter store, by reason.",
		}, []string{"reason"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_delivery_paused_devices",
		Help: "Devices and users whose events are held now (429 pause, daily quota, pacing).",
	}, func() float64 {
		var n int64
		for _, lr := range p.runnerList() {
			n += lr.heldKeys.Load()
		}
		return float64(n)
	})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_delivery_read_ahead_bytes",
		Help: "Memory held by events read from the spool and not yet delivered, all lanes (bounded by the read-ahead budget).",
	}, func() float64 { return float64(p.budget.Used()) })
	for _, r := range []string{"silenced", "invalid_fields", "missing_fields", "bad_request", "too_large", "expired"} {
		m.dead.WithLabelValues(r)
	}
	registerLanes(reg, p, &laneCollector{p: p, checked: true, value: func(s LaneStatus) float64 { return float64(s.HeldEvents) },
		desc: prometheus.NewDesc("relay_delivery_held_events",
			"Events a lane holds for devices and users that are paused (429, daily quota) or paced; they go when the pause ends or the pace allows.",
			[]string{"lane"}, nil)})
	return m
}

// registerLanes registers more and relay_lane_stopped{lane} of p on reg
// (nil: none). Every kind's lanes are in that one family, so that one
// alert covers them: only the events' collector is checked (describes it),
// the form kinds' share the family unchecked.
func registerLanes(reg prometheus.Registerer, p *Pipeline, more ...prometheus.Collector) {
	if reg != nil {
		reg.MustRegister(append(more, &laneCollector{p: p, checked: p.form == nil, value: stopped, desc: prometheus.NewDesc("relay_lane_stopped",
			"1 while a lane sends nothing (invalid API key, fatal upstream answer, operator stop): alert on it.",
			[]string{"lane"}, nil)})...)
	}
}

// stopped is 1 for a stopped lane, else 0.
func stopped(s LaneStatus) float64 {
	if s.Stopped {
		return 1
	}
	return 0
}

// laneCollector exports a gauge per lane read at scrape time from a
// snapshot of p's lanes (a lane gone is simply not reported).
type laneCollector struct {
	p       *Pipeline
	desc    *prometheus.Desc
	checked bool
	value   func(LaneStatus) float64
}

func (c *laneCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.checked {
		ch <- c.desc
	}
}

func (c *laneCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.p.LaneStatus() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, c.value(s), s.Label)
	}
}
