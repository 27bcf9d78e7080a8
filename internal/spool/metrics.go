package spool

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the spool's Prometheus metrics; the gauges are computed at
// scrape time (Collect).
type metrics struct {
	s             *Spool
	reg           prometheus.Registerer
	commitSeconds prometheus.Histogram
	commitRecords prometheus.Histogram
	commits       prometheus.Counter
	compactions   prometheus.Counter

	checkpoints       prometheus.Counter
	checkpointSeconds prometheus.Histogram
	checkpointBytes   prometheus.Counter
	rejectedFull      prometheus.Counter
	rejectedDisk      prometheus.Counter
	damagedWAL        prometheus.Counter
	damagedDB         prometheus.Counter
	registered        []prometheus.Collector

	bytes, records, oldest               *prometheus.Desc // per lane
	fileBytes, dead, liveBytes, hotBytes *prometheus.Desc
}

func newMetrics(s *Spool, reg prometheus.Registerer) (*metrics, error) {
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_spool_append_rejected_total",
		Help: "Appends refused, by reason (full: quota; disk_low: free disk under the reserve).",
	}, []string{"reason"})
	damaged := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_spool_damaged_records_total",
		Help: "Records (events) lost to a failed checksum, by file: wal (skipped by the replay at start, bytes kept in the data dir's quarantine/; 1 for a damaged log record whose events are unknown), db (chunks of spool.db, moved to dead letters with reason damaged).",
	}, []string{"file"})
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	lane := []string{"lane"}
	m := &metrics{
		s:   s,
		reg: reg,
		commitSeconds: histogram("relay_spool_commit_seconds",
			"Duration of the write-ahead log writes that appended records (fsync included under sync=always).",
			prometheus.ExponentialBuckets(0.0001, 2, 16)),
		commitRecords: histogram("relay_spool_commit_records",
			"Records (events) appended per write-ahead log write (group commit).",
			prometheus.ExponentialBuckets(1, 4, 10)),
		commits: counter("relay_spool_commits_total", "Write-ahead log writes that appended records."),
		checkpoints: counter("relay_spool_checkpoints_total",
			"bbolt transactions of the spool (checkpoints of the write-ahead log, lanes, dead letters)."),
		checkpointSeconds: histogram("relay_spool_checkpoint_seconds",
			"Duration of the spool's bbolt transactions (fsync included under sync=always).",
			prometheus.ExponentialBuckets(0.0005, 2, 14)),
		checkpointBytes: counter("relay_spool_checkpoint_bytes_total",
			"Chunk bytes moved from the write-ahead log into bbolt (not acknowledged within the flush age, or past the memory bound)."),
		compactions:  counter("relay_spool_compactions_total", "Spool file compactions."),
		rejectedFull: rejected.WithLabelValues("full"),
		rejectedDisk: rejected.WithLabelValues("disk_low"),
		damagedWAL:   damaged.WithLabelValues("wal"),
		damagedDB:    damaged.WithLabelValues("db"),
		bytes:        prometheus.NewDesc("relay_spool_bytes", "Live encoded bytes queued in a lane.", lane, nil),
		records:      prometheus.NewDesc("relay_spool_records", "Live records (events) queued in a lane.", lane, nil),
		oldest:       prometheus.NewDesc("relay_spool_oldest_record_age_seconds", "Age of a lane's oldest queued record; 0 when empty.", lane, nil),
		fileBytes:    prometheus.NewDesc("relay_spool_file_bytes", "Disk space taken by the spool's bbolt file and write-ahead log (allocated blocks).", nil, nil),
		hotBytes:     prometheus.NewDesc("relay_spool_hot_bytes", "Memory of chunks held between the write-ahead log and bbolt.", nil, nil),
		dead:         prometheus.NewDesc("relay_spool_dead_letters", "Dead letters stored.", nil, nil),
		liveBytes:    prometheus.NewDesc("relay_spool_live_bytes", "Live bytes counted against the spool quota.", nil, nil),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.commitSeconds, m.commitRecords, m.commits, m.compactions,
		m.checkpoints, m.checkpointSeconds, m.checkpointBytes, rejected, damaged, m} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			return nil, err
		}
		m.registered = append(m.registered, c)
	}
	return m, nil
}

// unregister lets a spool reopened later register on the same registry.
func (m *metrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.bytes, m.records, m.oldest, m.fileBytes, m.dead, m.liveBytes, m.hotBytes} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, label ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, label...)
	}
	now := time.Now()
	for _, l := range m.s.Lanes() {
		st := l.Stats()
		age := 0.0
		if !st.Oldest.IsZero() {
			age = max(now.Sub(st.Oldest).Seconds(), 0)
		}
		gauge(m.bytes, float64(st.Bytes), l.label)
		gauge(m.records, float64(st.Records), l.label)
		gauge(m.oldest, age, l.label)
	}
	st := m.s.Stats()
	gauge(m.fileBytes, float64(st.FileBytes))
	gauge(m.dead, float64(st.Dead))
	gauge(m.liveBytes, float64(st.LiveBytes))
	gauge(m.hotBytes, float64(m.s.hotHeld.Load()))
}
