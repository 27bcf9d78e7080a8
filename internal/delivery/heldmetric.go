package delivery

import "github.com/prometheus/client_golang/prometheus"

// heldCollector exports relay_delivery_held_events{lane}: the events each
// lane holds for paused or paced keys, read at scrape time from the lanes'
// atomics (no series to delete when a lane goes: a lane no longer running
// is simply not reported; the series are bounded by the lanes held).
type heldCollector struct {
	p    *Pipeline
	desc *prometheus.Desc
}

func newHeldCollector(p *Pipeline) *heldCollector {
	return &heldCollector{p: p, desc: prometheus.NewDesc("relay_delivery_held_events",
		"Events a lane holds for devices and users that are paused (429, daily quota) or paced; they go when the pause ends or the pace allows.",
		[]string{"lane"}, nil)}
}

func (c *heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *heldCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.p.LaneStatus() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(st.HeldEvents), st.Label)
	}
}
