package spool

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// The offline tool: Verify (relay spool verify, and with a salvage
// function relay spool salvage) reads a spool directory that no process
// holds, without bbolt and without a mapping (pages.go), so that
// neither a damaged spool.db nor a damaged log can make them panic or
// fault. They read everything a replay would (spool.db's queues and dead
// letters, the WAL from the applied position on, acknowledgements
// applied) and check every checksum.

// SalvageRecord is one record Verify salvaged: one line of relay spool
// salvage's output, and of relay spool import's input.
type SalvageRecord struct {
	// Source is where the record was read: "db" (spool.db) or "wal".
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// Lane is the lane's label; APIKey and Options its key (APIKey is
	// empty when neither spool.db nor the log says whose the record is).
	Lane     string    `json:"lane,omitempty"`
	APIKey   string    `json:"api_key,omitempty"`
	Options  string    `json:"options,omitempty"`
	LaneID   uint64    `json:"lane_id,omitempty"`
	Seq      uint64    `json:"seq,omitempty"`
	Index    int       `json:"index"`
	Accepted time.Time `json:"accepted"`
	OrderKey string    `json:"order_key,omitempty"`
	UserID   string    `json:"user_id,omitempty"`
	// Data is the record as it would be sent; DataRaw holds it instead
	// when it is not JSON.
	Data    json.RawMessage `json:"data,omitempty"`
	DataRaw []byte          `json:"data_raw,omitempty"`
	// Damaged: the record's chunk failed its checksum; it may be altered.
	Damaged bool `json:"damaged,omitempty"`
	// Dead is set for a dead letter: what it adds to its record.
	Dead *struct {
		ID     uint64    `json:"id"`
		Reason string    `json:"reason"`
		Answer string    `json:"answer,omitempty"`
		Died   time.Time `json:"died"`
	} `json:"dead_letter,omitempty"`
}

// Record returns the record's spool form and its lane's key; an error when
// Kind names no kind (Kind.String).
func (r *SalvageRecord) Record() (storage.LaneKey, storage.Record, error) {
	kinds := []storage.Kind{storage.KindEvents, storage.KindGroupIdentify, storage.KindUserMap}
	i := slices.IndexFunc(kinds, func(k storage.Kind) bool { return k.String() == r.Kind })
	if i < 0 {
		return storage.LaneKey{}, storage.Record{}, fmt.Errorf("unknown record kind %q", r.Kind)
	}
	key := storage.LaneKey{Kind: kinds[i], APIKey: r.APIKey, Options: r.Options}
	data := []byte(r.Data)
	if len(data) == 0 {
		data = r.DataRaw
	}
	rec := storage.Record{Data: data}
	if r.OrderKey != "" {
		rec.OrderKey = []byte(r.OrderKey)
	}
	if r.UserID != "" {
		rec.UserID = []byte(r.UserID)
	}
	return key, rec, nil
}

// VerifyReport sums up what Verify read.
type VerifyReport struct {
	Lanes       int   // lanes known (spool.db or the log)
	Records     int64 // live records readable, spool.db and log
	Bytes       int64 // their chunks' bytes
	DeadLetters int64 // dead letters readable
	// Damaged counts what failed a checksum or could not be read: chunks'
	// records (or whole chunks, when their framing is lost), log records,
	// lanes, dead letters, pages.
	Damaged int64
	// Problems says what was damaged or does not fit, one line each;
	// Notes what is normal after a crash (a torn write at the log's end).
	Problems, Notes []string
}

// newOf allocates what a pointer of p's type points to (SalvageRecord.Dead's
// struct has no name).
func newOf[T any](_ *T) *T { return new(T) }

type offLane struct {
	key   storage.LaneKey
	label string
	known bool
}

// Verify reads every record and checksum of the spool in dir (which no
// process may hold). When salvage is not nil, every readable record is
// handed to it, one call per record: live records of spool.db and of the
// log not acknowledged, damaged ones flagged, and dead letters; after an
// error it is not called again, and Verify returns that error.
func Verify(dir string, salvage func(*SalvageRecord) error) (VerifyReport, error) {
	var rep VerifyReport
	if fi, err := os.Stat(dir); err != nil {
		return rep, fmt.Errorf("no spool in %s: %w", dir, err)
	} else if !fi.IsDir() {
		return rep, fmt.Errorf("%s is not a directory", dir)
	}
	problem := func(format string, a ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...)) }
	lanes := map[uint64]*offLane{}
	laneOf := func(id uint64) *offLane {
		l := lanes[id]
		if l == nil {
			l = &offLane{label: fmt.Sprintf("lane-%d", id)}
			lanes[id] = l
		}
		return l
	}
	var applied, synced walPos
	var id []byte
	queues := map[uint64][]byte{}
	var deads [][2][]byte
	var emitErr error
	out := func(r *SalvageRecord) {
		if salvage != nil && emitErr == nil {
			emitErr = salvage(r)
		}
	}

	// spool.db: meta, lanes, queues and dead letters.
	dbPath := filepath.Join(dir, "spool.db")
	var pf *pageFile
	dbMissing := false
	if fi, err := os.Stat(dbPath); errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0 {
		dbMissing = true
	} else if pf, err = openPageFile(dbPath); err != nil {
		rep.Damaged++
		problem("spool.db: %v: only the write-ahead log is read", err)
	} else {
		defer pf.close()
		if need := int64(pf.meta.hwm) * pf.ps; need > pf.size {
			problem("spool.db: the file holds %d bytes but its pages take %d (truncated): the pages past its end are lost", pf.size, need)
		}
		bad := func(err error) {
			rep.Damaged++
			problem("spool.db: %v", err)
		}
		pf.walkBucket(pf.rootHeader(), func(k, v []byte, bucket bool) {
			if !bucket {
				return
			}
			switch {
			case string(k) == string(bucketMeta):
				pf.walkBucket(v, func(k, v []byte, _ bool) {
					var err error
					switch string(k) {
					case string(keyWAL):
						applied, err = decodePos(v)
					case string(keySynced):
						synced, err = decodeSynced(v)
					case string(keyID):
						id = bytes.Clone(v)
					}
					if err != nil {
						bad(fmt.Errorf("meta %s: %w", k, err))
					}
				}, bad)
			case string(k) == string(bucketLanes):
				pf.walkBucket(v, func(k, v []byte, _ bool) {
					if len(k) != 8 {
						return
					}
					key, _, err := decodeLane(v)
					if err != nil {
						bad(fmt.Errorf("lane %x: %w", k, err))
						return
					}
					l := laneOf(binary.BigEndian.Uint64(k))
					l.key, l.known = key, true
				}, bad)
			case string(k) == string(bucketDead):
				pf.walkBucket(v, func(k, v []byte, _ bool) {
					deads = append(deads, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				}, bad)
			case len(k) == 9 && k[0] == 'q':
				queues[binary.BigEndian.Uint64(k[1:])] = bytes.Clone(v)
			}
		}, bad)
	}
	for _, l := range lanes {
		if l.known {
			l.label = l.key.Label()
		}
	}

	// The log, from the applied position on, with the replay's verdict
	// (readLog): lanes named by recLane records, acknowledgements, chunks.
	walLanes := map[uint64]*offLane{}
	lr, err := readLog(walPath(dir), id, applied, synced)
	if err != nil {
		problem("wal: %v", err)
		lr = &logRead{}
	}
	for _, m := range lr.unreached {
		rep.Damaged++
		problem("%s: records acknowledged there are lost", m)
	}
	for _, m := range lr.foreign {
		problem("wal: %s than spool.db", m)
	}
	// The log's own word on whose records it holds beats spool.db's
	// (which may be another spool's).
	for lid, key := range lr.lanes {
		walLanes[lid] = &offLane{key: key, known: true, label: key.Label()}
	}
	keyOf := func(lid uint64) (storage.LaneKey, bool) {
		l := lanes[lid]
		if l == nil || !l.known {
			return storage.LaneKey{}, false
		}
		return l.key, true
	}
	for _, d := range lr.damage {
		rep.Damaged += int64(d.lost())
		problem("wal: %s", d.summary(lr.laneLabels(d, keyOf)))
	}
	for _, d := range lr.harmless {
		rep.Notes = append(rep.Notes, fmt.Sprintf("wal: segment %s bytes %d-%d: %d %s", segName(d.seg), d.from, d.to, d.records, d.what))
	}
	for _, d := range lr.torn {
		rep.Notes = append(rep.Notes, fmt.Sprintf("wal: segment %s bytes %d-%d: %s", segName(d.seg), d.from, d.to, d.what))
	}
	walChunks, acked, _ := lr.pending()

	if dbMissing {
		if len(walChunks) > 0 || len(walLanes) > 0 {
			problem("spool.db is missing or empty but the write-ahead log holds records: only the log is read")
		} else {
			rep.Notes = append(rep.Notes, "no spool.db and no records in the write-ahead log: an empty spool")
		}
	}

	// Emit: each lane's chunks in spool.db, then the log's.
	fileName := map[string]string{"db": "spool.db", "wal": "wal"}
	emitChunk := func(src string, lid, seq uint64, v []byte) {
		l := laneOf(lid)
		if wl := walLanes[lid]; src == "wal" && wl != nil {
			l = wl
		}
		var c storage.Chunk
		base := SalvageRecord{Source: src, Kind: l.key.Kind.String(), Lane: l.label, APIKey: l.key.APIKey, Options: l.key.Options,
			LaneID: lid, Seq: seq}
		err := verifyChunk(v)
		if derr := decodeRecords(seq, v, &c, nil); err == nil {
			err = derr
		} else if derr == nil {
			base.Damaged = true // its framing still holds: its records, flagged
		}
		if err != nil {
			rep.Damaged++
			problem("%s: lane %s chunk %d: %v", fileName[src], l.label, seq, err)
		}
		if err != nil && !base.Damaged {
			acc, _, _ := chunkHeader(v)
			sr := base
			sr.Accepted, sr.DataRaw, sr.Damaged = fromMs(acc).UTC(), v, true
			out(&sr)
			return
		}
		if !base.Damaged {
			rep.Records += int64(len(c.Records))
			rep.Bytes += int64(len(v))
		}
		for i, r := range c.Records {
			sr := base
			sr.Index, sr.Accepted, sr.OrderKey, sr.UserID = i, c.Accepted.UTC(), string(r.OrderKey), string(r.UserID)
			setData(&sr, r.Data)
			out(&sr)
		}
	}
	for _, q := range slices.Sorted(maps.Keys(queues)) {
		laneOf(q)
		pf.walkBucket(queues[q], func(k, v []byte, bucket bool) {
			if len(k) != 8 {
				return
			}
			seq := binary.BigEndian.Uint64(k)
			if acked[laneSeq{q, seq}] {
				return
			}
			if !bucket {
				emitChunk("db", q, seq, v)
				return
			}
			pf.walkBucket(v, func(k2, v2 []byte, _ bool) {
				if len(k2) == 1 && k2[0] == 0 {
					emitChunk("db", q, seq, v2)
				}
			}, func(err error) {
				rep.Damaged++
				problem("spool.db: lane %s chunk %d: %v", laneOf(q).label, seq, err)
			})
		}, func(err error) {
			rep.Damaged++
			problem("spool.db: lane %s: %v", laneOf(q).label, err)
		})
	}
	for _, c := range walChunks {
		if !laneOf(c.lane).known && walLanes[c.lane] == nil {
			problem("wal: lane %d chunk %d: neither spool.db nor the log names the lane's api_key", c.lane, c.seq)
		}
		emitChunk("wal", c.lane, c.seq, c.payload)
	}
	for _, kv := range deads {
		if len(kv[0]) != 8 {
			continue
		}
		d, err := decodeDead(binary.BigEndian.Uint64(kv[0]), kv[1])
		if err != nil {
			rep.Damaged++
			problem("spool.db: dead letter %x: %v", kv[0], err)
			continue
		}
		rep.DeadLetters++
		sr := &SalvageRecord{Source: "db", Kind: d.Lane.Kind.String(), Lane: d.Lane.Label(), APIKey: d.Lane.APIKey, Options: d.Lane.Options,
			Accepted: d.Accepted.UTC(), OrderKey: string(d.Record.OrderKey), UserID: string(d.Record.UserID)}
		sr.Dead = newOf(sr.Dead)
		sr.Dead.ID, sr.Dead.Reason, sr.Dead.Answer, sr.Dead.Died = d.ID, d.Reason, string(d.Answer), d.Died.UTC()
		setData(sr, d.Record.Data)
		out(sr)
	}
	for id := range walLanes {
		laneOf(id)
	}
	rep.Lanes = len(lanes)
	return rep, emitErr
}

func setData(sr *SalvageRecord, data []byte) {
	if json.Valid(data) {
		sr.Data = json.RawMessage(data)
	} else {
		sr.DataRaw = data
	}
}
