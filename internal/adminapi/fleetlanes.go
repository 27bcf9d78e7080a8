package adminapi

import (
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/storage"
)

// Lanes in fleet mode: the events lanes this relay delivers are its lane
// runners, one per lane and owned partition (label "<lane label>-events-<n>"),
// reported by the events deliverer. Their records and bytes are the
// lane's read from the partition and not delivered yet (a stopped lane's
// are read on and held); the partition's messages not read yet are only
// counted as a whole (relay_fleet_partition_backlog). Chunks is 0.

// fleetLanes returns the events runners' statuses in fleet mode.
func (a *Relay) fleetLanes() []delivery.LaneStatus {
	if !a.cfg.Fleet || a.cfg.Lanes[storage.KindEvents] == nil {
		return nil
	}
	return a.cfg.Lanes[storage.KindEvents].LaneStatus()
}

func (a *Relay) fleetLane(label string) (delivery.LaneStatus, bool) {
	for _, st := range a.fleetLanes() {
		if st.Label == label {
			return st, true
		}
	}
	return delivery.LaneStatus{}, false
}

func fleetLaneJSON(st delivery.LaneStatus) laneJSON {
	return laneJSON{Label: st.Label, Kind: storage.KindEvents.String(), Records: st.Records, Bytes: st.Bytes, Controllable: true, Running: true,
		Stopped: st.Stopped, StopReason: st.StopReason, PausedKeys: st.PausedKeys, HeldEvents: st.HeldEvents,
		ReadAheadBytes: st.ReadAheadBytes}
}
