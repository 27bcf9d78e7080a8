package main

import (
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// registerOpsMetrics registers what alerts compare the spool against (its
// limits and the disk's free space) and the readiness /readyz reports:
//
//	relay_spool_max_bytes        --spool-max-bytes (0: no quota)
//	relay_spool_min_free_bytes   --spool-min-free-bytes (0: no reserve)
//	relay_spool_disk_free_bytes  free space of the data dir's filesystem (statfs at scrape)
//	relay_ready                  1 while /readyz answers 200, else 0
func registerOpsMetrics(reg prometheus.Registerer, maxBytes, minFree int64, dataDir string, ready func() error) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relay_spool_max_bytes",
			Help: "The spool quota (--spool-max-bytes); 0 means none. Compare relay_spool_live_bytes."},
			func() float64 { return float64(maxBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relay_spool_min_free_bytes",
			Help: "Free disk space kept in reserve (--spool-min-free-bytes); 0 means none. Compare relay_spool_disk_free_bytes."},
			func() float64 { return float64(minFree) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relay_spool_disk_free_bytes",
			Help: "Free space (for unprivileged users) of the data dir's filesystem; -1 when statfs fails."},
			func() float64 {
				var st syscall.Statfs_t
				if err := syscall.Statfs(dataDir, &st); err != nil {
					return -1
				}
				return float64(st.Bavail) * float64(st.Bsize)
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "relay_ready",
			Help: "1 while /readyz answers 200; 0 while ingest would refuse (quota, disk reserve, shutting down) or delivery is not running."},
			func() float64 {
				if ready() != nil {
					return 0
				}
				return 1
			}),
	)
}
