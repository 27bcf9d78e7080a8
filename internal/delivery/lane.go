package delivery

import "errors"

// ErrUnknownLane is returned (wrapped) by StopLane and ResumeLane for a
// lane id not delivered (no such lane, another kind's, or not started).
var ErrUnknownLane = errors.New("delivery: unknown lane")

// LaneStatus is a snapshot of one lane's delivery.
type LaneStatus struct {
	ID    uint64
	Label string
	// Stopped is true while the lane sends nothing (Invalid API key, a
	// fatal upstream answer, or StopLane); StopReason says why.
	Stopped    bool
	StopReason string
	// PausedKeys is the number of devices/users whose events are held (429
	// pause, daily quota, pacing); HeldEvents the events they hold. Always
	// 0 for kinds without per-key pauses (group identify, user mappings).
	PausedKeys, HeldEvents int64
	// ReadAheadBytes is the memory the lane's read-ahead holds.
	ReadAheadBytes int64
	// Records and Bytes are a fleet partition's lane's Feed.Waiting; 0
	// for a spool lane.
	Records, Bytes int64
}

// LaneControl is what an operator (internal/adminapi) needs of the
// deliverer of one lane kind: a *Pipeline.
type LaneControl interface {
	// LaneStatus returns a snapshot of the lanes it delivers, by lane id.
	LaneStatus() []LaneStatus
	// StopLane stops sending a lane's records (they stay in the spool); it
	// wraps ErrUnknownLane for a lane it does not deliver.
	StopLane(laneID uint64) error
	// ResumeLane resumes a lane stopped by StopLane or by an upstream that
	// refused its api_key.
	ResumeLane(laneID uint64) error
}
