package adminapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Dead letters in fleet mode (issue 22): RelayConfig.Fleet holds them (every
// relay's), so any relay lists, purges and replays them. Group identify and
// user mapping dead letters stay in the local spool of the relay that made
// them (those kinds are delivered from the local spool in fleet mode) and
// are not listed here.

// fleetCallTimeout bounds one call to the fleet's store.
const fleetCallTimeout = 30 * time.Second

// deadPage is ListDead of the dead-letter store in force.
func (a *Relay) deadPage(f spool.DeadFilter, after uint64, limit int) ([]spool.DeadLetter, error) {
	if a.cfg.Fleet == nil {
		return a.sp.ListDead(f, after, limit)
	}
	ctx, cancel := context.WithTimeout(a.stopCtx, fleetCallTimeout)
	defer cancel()
	return a.cfg.Fleet.ListDead(ctx, f, after, limit)
}

// deleteDead is DeleteDead of the dead-letter store in force.
func (a *Relay) deleteDead(ctx context.Context, ids []uint64) error {
	if a.cfg.Fleet == nil {
		return a.sp.DeleteDead(ctx, ids)
	}
	return a.cfg.Fleet.DeleteDead(ctx, ids)
}

// deadTotal is the number of dead letters in the store in force; -1 when
// the fleet's store cannot say.
func (a *Relay) deadTotal() int64 {
	if a.cfg.Fleet == nil {
		return a.sp.Stats().Dead
	}
	c, ok := a.cfg.Fleet.(interface {
		DeadCount(ctx context.Context) (int64, error)
	})
	if !ok {
		return -1
	}
	ctx, cancel := context.WithTimeout(a.stopCtx, fleetCallTimeout)
	defer cancel()
	n, err := c.DeadCount(ctx)
	if err != nil {
		return -1
	}
	return n
}

// replayFleet appends dls's records to the fleet under lane k, in requests
// of at most replayChunkCount records, deleting each request's dead letters
// once it is stored. A request's id is made of its dead letters' ids, so a
// replay retried (or run by two relays at once) within the fleet's
// deduplication window is stored once.
func (a *Relay) replayFleet(ctx context.Context, k spool.LaneKey, dls []spool.DeadLetter, counts map[string]*laneCount, out *replayJSON) error {
	label := spool.LabelOf(k)
	for len(dls) > 0 {
		n, size := 0, 0
		for n < len(dls) && n < replayChunkCount && (n == 0 || size < replayChunkBytes) {
			size += len(dls[n].Record.Data)
			n++
		}
		recs := make([]spool.Record, n)
		ids := make([]uint64, n)
		for i := range n {
			r := dls[i].Record
			recs[i] = spool.Record{OrderKey: r.OrderKey, UserID: r.UserID, Data: r.Data}
			ids[i] = dls[i].ID
		}
		req := storage.Request{
			ID:   "replay-" + strconv.FormatUint(ids[0], 10) + "-" + strconv.FormatUint(ids[n-1], 10) + "-" + strconv.Itoa(n),
			Lane: k, Records: recs,
		}
		if err := a.cfg.Fleet.Append(ctx, req); err != nil {
			return fmt.Errorf("append to lane %s: %w", label, err)
		}
		// Stored: the dead letters must go, even if the call is being
		// stopped (as in local mode).
		dctx, dcancel := context.WithTimeout(context.Background(), fleetCallTimeout)
		err := a.deleteDead(dctx, ids)
		dcancel()
		if err != nil {
			return fmt.Errorf("delete replayed dead letters: %w", err)
		}
		c := counts[label]
		if c == nil {
			c = &laneCount{Lane: label, Kind: k.Kind.String()}
			counts[label] = c
		}
		c.Records += n
		out.Replayed += n
		a.replayed.Add(float64(n))
		dls = dls[n:]
	}
	return nil
}

// Lanes in fleet mode: the events lanes this relay delivers are its lane
// runners, one per lane and owned partition (label "<lane label>-events-<n>"),
// reported by the events deliverer; their backlog is the partition's (the
// relay_fleet_partition_backlog metric), so records/chunks/bytes are 0.

// fleetLanes returns the events runners' statuses in fleet mode.
func (a *Relay) fleetLanes() []delivery.LaneStatus {
	if a.cfg.Fleet == nil || a.cfg.Lanes[spool.KindEvents] == nil {
		return nil
	}
	return a.cfg.Lanes[spool.KindEvents].LaneStatus()
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
	return laneJSON{Label: st.Label, Kind: spool.KindEvents.String(), Controllable: true, Running: true,
		Stopped: st.Stopped, StopReason: st.StopReason, PausedKeys: st.PausedKeys, HeldEvents: st.HeldEvents,
		ReadAheadBytes: st.ReadAheadBytes}
}

// fleetLaneAction pauses or resumes one runner of this relay.
func (a *Relay) fleetLaneAction(w http.ResponseWriter, action string, st delivery.LaneStatus) {
	c := a.cfg.Lanes[spool.KindEvents]
	var err error
	if action == "pause" {
		err = c.StopLane(st.ID)
	} else {
		err = c.ResumeLane(st.ID)
	}
	if err != nil {
		jsonError(w, http.StatusConflict, "%s: the lane is no longer delivered by this relay", action)
		return
	}
	a.log.Info("lane "+action+"d by operator", zap.String("lane", st.Label))
	if st, ok := a.fleetLane(st.Label); ok {
		writeJSON(w, http.StatusOK, fleetLaneJSON(st))
		return
	}
	writeJSON(w, http.StatusOK, fleetLaneJSON(st))
}
