package spool

import (
	"bytes"
	"cmp"
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

// Verify (relay spool verify; with a salvage function, relay spool salvage)
// reads what a replay would, without bbolt or a mapping (pages.go), so that
// no damage can make it panic or fault, and checks every checksum.

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
	Dead *salvageDead `json:"dead_letter,omitempty"`
}

type salvageDead struct {
	ID     uint64    `json:"id"`
	Reason string    `json:"reason"`
	Answer string    `json:"answer,omitempty"`
	Died   time.Time `json:"died"`
}

// Record returns the record's spool form and its lane's key.
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
	return key, storage.Record{OrderKey: []byte(r.OrderKey), UserID: []byte(r.UserID), Data: data}, nil
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
	bad := func(format string, a ...any) { rep.Damaged++; problem(format, a...) }
	dbLanes := map[uint64]storage.LaneKey{} // spool.db's lane records
	ids := map[uint64]bool{}                // every lane named anywhere
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
		bad("spool.db: %v: only the write-ahead log is read", err)
	} else {
		defer pf.f.Close()
		if need := int64(pf.meta.hwm) * pf.ps; need > pf.size {
			problem("spool.db: the file holds %d bytes but its pages take %d (truncated): the pages past its end are lost", pf.size, need)
		}
		badPage := func(err error) { bad("spool.db: %v", err) }
		pf.walkBucket(pf.rootHeader(), func(k, v []byte, bucket bool) {
			switch {
			case !bucket:
			case string(k) == string(bucketMeta):
				meta := map[string][]byte{}
				pf.walkBucket(v, func(k, v []byte, _ bool) { meta[string(k)] = bytes.Clone(v) }, badPage)
				id = meta[string(keyID)]
				var err error
				if applied, synced, err = walPositions(func(k []byte) []byte { return meta[string(k)] }); err != nil {
					bad("spool.db: meta: %v", err)
				}
			case string(k) == string(bucketLanes):
				pf.walkBucket(v, func(k, v []byte, _ bool) {
					if len(k) != 8 {
						return
					}
					if key, _, err := decodeLane(v); err != nil {
						bad("spool.db: lane %x: %v", k, err)
					} else {
						dbLanes[binary.BigEndian.Uint64(k)] = key
						ids[binary.BigEndian.Uint64(k)] = true
					}
				}, badPage)
			case string(k) == string(bucketDead):
				pf.walkBucket(v, func(k, v []byte, _ bool) {
					deads = append(deads, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				}, badPage)
			case len(k) == 9 && k[0] == 'q':
				queues[binary.BigEndian.Uint64(k[1:])] = bytes.Clone(v)
			}
		}, badPage)
	}

	// The log, from the applied position on, with the replay's verdict
	// (readLog): lanes named by recLane records, acknowledgements, chunks.
	lr, err := readLog(walPath(dir), id, applied, synced)
	if err != nil {
		problem("wal: %v", err)
		lr = &logRead{}
	}
	for _, m := range lr.unreached {
		bad("%s: records acknowledged there are lost", m)
	}
	for _, m := range lr.foreign {
		problem("wal: %s than spool.db", m)
	}
	for _, d := range lr.damage {
		rep.Damaged += int64(d.lost())
		problem("wal: %s", d.summary(lr.laneLabels(d, dbLanes)))
	}
	for _, d := range lr.harmless {
		rep.Notes = append(rep.Notes, fmt.Sprintf("wal: segment %s bytes %d-%d: %d %s", segName(d.seg), d.from, d.to, d.records, d.what))
	}
	for _, d := range lr.torn {
		rep.Notes = append(rep.Notes, fmt.Sprintf("wal: segment %s bytes %d-%d: %s", segName(d.seg), d.from, d.to, d.what))
	}
	walChunks, acked, _ := lr.pending()
	for lid := range lr.lanes {
		ids[lid] = true
	}

	if dbMissing {
		if len(walChunks) > 0 || len(lr.lanes) > 0 {
			problem("spool.db is missing or empty but the write-ahead log holds records: only the log is read")
		} else {
			rep.Notes = append(rep.Notes, "no spool.db and no records in the write-ahead log: an empty spool")
		}
	}

	// Emit: each lane's chunks in spool.db, then the log's. The log's own
	// word on whose records it holds beats spool.db's (which may be another
	// spool's).
	laneKey := func(lid uint64, wal bool) (storage.LaneKey, string, bool) {
		ids[lid] = true
		if wal {
			return lr.laneKey(lid, dbLanes)
		}
		return (&logRead{}).laneKey(lid, dbLanes)
	}
	fileName := map[string]string{"db": "spool.db", "wal": "wal"}
	emitChunk := func(src string, lid, seq uint64, v []byte) {
		key, label, _ := laneKey(lid, src == "wal")
		base := SalvageRecord{Source: src, Kind: key.Kind.String(), Lane: label, APIKey: key.APIKey, Options: key.Options,
			LaneID: lid, Seq: seq}
		var c storage.Chunk
		verr, derr := verifyChunk(v), decodeRecords(seq, v, &c, nil)
		if err := cmp.Or(verr, derr); err != nil {
			bad("%s: lane %s chunk %d: %v", fileName[src], label, seq, err)
		}
		if derr != nil { // its framing is lost: the chunk's bytes, flagged
			acc, _, _ := chunkHeader(v)
			base.Accepted, base.DataRaw, base.Damaged = fromMs(acc).UTC(), v, true
			out(&base)
			return
		}
		if base.Damaged = verr != nil; !base.Damaged {
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
		_, label, _ := laneKey(q, false)
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
			}, func(err error) { bad("spool.db: lane %s chunk %d: %v", label, seq, err) })
		}, func(err error) { bad("spool.db: lane %s: %v", label, err) })
	}
	for _, c := range walChunks {
		if _, _, ok := laneKey(c.lane, true); !ok {
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
			bad("spool.db: dead letter %x: %v", kv[0], err)
			continue
		}
		rep.DeadLetters++
		sr := &SalvageRecord{Source: "db", Kind: d.Lane.Kind.String(), Lane: d.Lane.Label(), APIKey: d.Lane.APIKey, Options: d.Lane.Options,
			Accepted: d.Accepted.UTC(), OrderKey: string(d.Record.OrderKey), UserID: string(d.Record.UserID),
			Dead: &salvageDead{ID: d.ID, Reason: d.Reason, Answer: string(d.Answer), Died: d.Died.UTC()}}
		setData(sr, d.Record.Data)
		out(sr)
	}
	rep.Lanes = len(ids)
	return rep, emitErr
}

func setData(sr *SalvageRecord, data []byte) {
	if json.Valid(data) {
		sr.Data = json.RawMessage(data)
	} else {
		sr.DataRaw = data
	}
}
