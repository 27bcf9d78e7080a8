package storage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// Kind is what a lane carries.
type Kind uint8

const (
	KindEvents        Kind = iota // /2/httpapi events
	KindGroupIdentify             // /groupidentify identifications
	KindUserMap                   // /usermap mappings
)

var kindNames = [...]string{KindEvents: "events", KindGroupIdentify: "groupidentify", KindUserMap: "usermap"}

// String is the kind's name as used in lane labels.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

// LaneKey identifies a lane: records with equal keys share one ordered queue.
type LaneKey struct {
	Kind   Kind
	APIKey string
	// Options is the raw JSON of the envelope's options, "" when absent.
	Options string
}

// Label is a short, non-secret name of the lane of key k for metrics, logs
// and the admin API: the kind and a truncated hash of the api_key and
// options (never the key itself), e.g. "events-1a2b3c4d". A retired lane's
// dead letters keep it, and a lane made again for the key gets it again.
func (k LaneKey) Label() string {
	h := sha256.Sum256([]byte(k.APIKey + "\x00" + k.Options))
	return k.Kind.String() + "-" + hex.EncodeToString(h[:4])
}

// Record is one item of a request.
type Record struct {
	// OrderKey orders and throttles the record (event.Event.OrderKey).
	OrderKey []byte
	// UserID is the user id, when the record has one (for 429s naming users).
	UserID []byte
	// Data is the payload exactly as it is sent upstream.
	Data []byte
	// Verdict, when not zero, says the ingest found Data clean against a
	// tracking plan (internal/plan names which plan and mode): delivery
	// checks the record again unless that is the plan and mode in force.
	// Only the local spool keeps it; zero means "not checked".
	Verdict uint64
}

// DeadLetter is a record that will not be delivered, with why.
type DeadLetter struct {
	ID       uint64 // assigned by PutDead
	Lane     LaneKey
	Reason   string // short machine-readable reason, e.g. "invalid_fields"
	Answer   []byte // the upstream's answer that caused it, truncated
	Accepted time.Time
	Died     time.Time
	Record   Record
}

// DeadFilter selects dead letters; zero fields match everything.
type DeadFilter struct {
	Lane   *LaneKey
	Reason string
	// Label selects the dead letters of the lane with that label (LaneKey.Label),
	// also once the lane was retired.
	Label string
}
