package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/svcrelay/relay/internal/storage"
)

// The write-ahead log (WAL).
//
// Dir/wal/ holds segment files named by a 16-hex-digit number that increases
// by one per segment ("000000000000002a.wal"), and spare files ("spare-…")
// kept for reuse. A segment is a sequence of records, each
//
//	[0:4]   CRC-32C of bytes [4:37] (the rest of the header)
//	[4:8]   CRC-32C of the payload
//	[8:12]  payload length, uint32 little-endian
//	[12:20] the segment's number, uint64 little-endian
//	[20]    type: recChunk, recAcks, recStart or recLane
//	[21:29] lane id (recChunk, recLane; 0 otherwise)
//	[29:37] seq (recChunk; 0 otherwise)
//	[37:]   payload: the chunk's encoding (encode.go), or for recAcks
//	        16 bytes per acknowledged chunk: lane id, seq, or for recStart
//	        the spool's id (16 bytes, meta key "id"), the number and end
//	        offset of the segment written before this one (uint64
//	        little-endian each; 0 and 0 when none), or for recLane the
//	        lane's key (a lane value, encode.go, with zero counters),
//	        written before the lane's first chunk in each segment, so that
//	        a log whose spool.db is lost still says whose records it holds
//
// A chunk record's payload checksum is the chunk's own (encode.go; a
// version 1 chunk's is over the whole payload), computed by Append's
// caller while the chunk is in its CPU's cache, not by the WAL writer
// which every append waits for.
//
// Every segment written by this version starts with a recStart record, and
// every write ends with an end mark: zeros where the next record's header
// would go, overwritten by the next write. Records never span segments.
// scanSegment reads a segment's records in order; at one that is not valid
// it looks for the next valid record of the segment: the bytes between are
// damage, skipped exactly (by its length, when only the payload is bad);
// with none further, zeros or another segment's record are the clean end
// and anything else a bad tail. readLog judges what it found, for the
// replay and for Verify alike. A valid record cannot start inside another's
// payload by chance: it needs a header checksum and the segment's number.
//
// A segment whose records are all in bbolt or acknowledged becomes a spare
// file, renamed to a later segment's number when reused: its blocks are
// allocated and written, so fdatasync has no metadata to write (half the
// time of a fresh file's here).

const (
	recHeaderLen = 37
	recChunk     = 1
	recAcks      = 2
	recStart     = 3
	recLane      = 4
	ackEntryLen  = 16
	startLen     = 32 // recStart payload

	// defaultSegmentBytes is a segment file's size. A write holds at most a
	// quarter of one, unless a single chunk is larger (it gets a segment
	// of its own).
	defaultSegmentBytes = 16 << 20

	walDirName = "wal"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// walPos is a position in the WAL: a segment and an offset in it.
type walPos struct {
	seg uint64
	off int64
}

func (p walPos) less(q walPos) bool {
	return p.seg < q.seg || p.seg == q.seg && p.off < q.off
}

func (p walPos) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, p.seg)
	return binary.BigEndian.AppendUint64(b, uint64(p.off))
}

func decodePos(v []byte) (walPos, error) {
	if len(v) != 16 {
		return walPos{}, fmt.Errorf("wal position: %w", errCorrupt)
	}
	return walPos{binary.BigEndian.Uint64(v), int64(binary.BigEndian.Uint64(v[8:]))}, nil
}

func segName(no uint64) string { return fmt.Sprintf("%016x.wal", no) }

// parseSegName returns the number of a segment file name.
func parseSegName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ".wal")
	if !ok || len(hex) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	return n, err == nil
}

const sparePrefix = "spare-"

// putRecHeader writes into h the header of a record whose payload has
// length n and checksum crc.
func putRecHeader(h []byte, seg uint64, typ byte, lane, seq uint64, n int, crc uint32) {
	binary.LittleEndian.PutUint32(h[4:], crc)
	binary.LittleEndian.PutUint32(h[8:], uint32(n))
	binary.LittleEndian.PutUint64(h[12:], seg)
	h[20] = typ
	binary.LittleEndian.PutUint64(h[21:], lane)
	binary.LittleEndian.PutUint64(h[29:], seq)
	binary.LittleEndian.PutUint32(h[0:], crc32.Checksum(h[4:recHeaderLen], crcTable))
}

func payloadCRC(p []byte) uint32 { return crc32.Checksum(p, crcTable) }

// walRecord is a record read back from a segment.
type walRecord struct {
	typ       byte
	lane, seq uint64
	payload   []byte // aliases the segment's bytes
	pos       walPos // where the record starts
	end       int64  // offset just past it
}

// recStatus is what readRecord found at an offset.
type recStatus uint8

const (
	recNone       recStatus = iota // no record header of this segment
	recOK                          // a valid record
	recBadPayload                  // a valid header of this segment; the payload fails its checksum
)

// readRecord decodes the record of segment seg at data[off:]. With
// recBadPayload, the record's end is still right (its header is).
func readRecord(data []byte, seg uint64, off int64) (walRecord, recStatus) {
	if off < 0 || int64(len(data))-off < recHeaderLen {
		return walRecord{}, recNone
	}
	h := data[off : off+recHeaderLen]
	if binary.LittleEndian.Uint64(h[12:]) != seg || crc32.Checksum(h[4:], crcTable) != binary.LittleEndian.Uint32(h) {
		return walRecord{}, recNone
	}
	n := int64(binary.LittleEndian.Uint32(h[8:]))
	if n > int64(len(data))-off-recHeaderLen {
		return walRecord{}, recNone
	}
	p := data[off+recHeaderLen : off+recHeaderLen+n]
	r := walRecord{
		typ:     h[20],
		lane:    binary.LittleEndian.Uint64(h[21:]),
		seq:     binary.LittleEndian.Uint64(h[29:]),
		payload: p,
		pos:     walPos{seg, off},
		end:     off + recHeaderLen + n,
	}
	switch {
	case r.typ == recChunk:
	case r.typ == recAcks && n%ackEntryLen == 0:
	case r.typ == recStart && n == startLen:
	case r.typ == recLane:
	default:
		return walRecord{}, recNone
	}
	want := binary.LittleEndian.Uint32(h[4:])
	if r.typ == recChunk {
		stored, computed, ok := chunkSum(p)
		if !ok || stored != want || computed != want {
			return r, recBadPayload
		}
	} else if payloadCRC(p) != want {
		return r, recBadPayload
	}
	return r, recOK
}

// findRecord returns the offset of the first valid record of segment seg
// at or after from, -1 when there is none; with header, of the first
// record whose header is valid (its payload may fail its checksum).
func findRecord(data []byte, seg uint64, from int64, header bool) int64 {
	// Candidates hold the segment's number: bytes.Index finds them at
	// memory speed (a replay calls this at every segment's end).
	var pat [8]byte
	binary.LittleEndian.PutUint64(pat[:], seg)
	for o := max(from, 0); o+recHeaderLen <= int64(len(data)); o++ {
		i := bytes.Index(data[o+12:], pat[:])
		if i < 0 {
			return -1
		}
		o += int64(i)
		if o+recHeaderLen > int64(len(data)) {
			return -1
		}
		if _, st := readRecord(data, seg, o); st == recOK || header && st == recBadPayload {
			return o
		}
	}
	return -1
}

// cleanEnd reports whether data[off:] looks like what follows a segment's
// last record: zeros, or a record header of another segment (a reused
// file's old bytes).
func cleanEnd(data []byte, seg uint64, off int64) bool {
	if off >= int64(len(data)) {
		return true
	}
	h := data[off:min(off+recHeaderLen, int64(len(data)))]
	if !slices.ContainsFunc(h, func(b byte) bool { return b != 0 }) {
		return true
	}
	return len(h) == recHeaderLen && binary.LittleEndian.Uint64(h[12:]) != seg &&
		crc32.Checksum(h[4:], crcTable) == binary.LittleEndian.Uint32(h)
}

// walDamage is a run of bytes of a segment that holds no valid record but
// lies where records were written.
type walDamage struct {
	seg      uint64
	from, to int64
	records  int // damaged log records in it: at least 1
	what     string

	// What it cost (attribute): the chunk records the log does not
	// acknowledge later, their lanes and events; headless, the stretches
	// whose headers are gone (a record at least each, lane unknown);
	// unreadable, those and the chunks whose framing is lost (records
	// whose events are unknown, one at least each).
	chunks, events       int
	headless, unreadable int
	lanes                []uint64
}

// lost is what the damage lost, in events.
func (d *walDamage) lost() int { return d.events + d.unreadable }

// segScan is what scanSegment read of a segment.
type segScan struct {
	items []scanItem
	end   int64     // just past the last valid record (the scan's start when none)
	tail  walDamage // a bad tail when tail.to > tail.from
	start []byte    // the segment's recStart payload, nil when none
}

// scanItem is a valid record, or damage between valid records.
type scanItem struct {
	rec    walRecord
	damage *walDamage
}

// scanSegment reads the records of segment seg in data from off on (see
// the top of this file).
func scanSegment(data []byte, seg uint64, off int64) segScan {
	sc := segScan{end: off}
	size := int64(len(data))
	var cur *walDamage // the damage being gathered
	for off < size {
		r, st := readRecord(data, seg, off)
		if st == recOK {
			if cur != nil {
				cur.to = off
				sc.items = append(sc.items, scanItem{damage: cur})
				cur = nil
			}
			if r.typ == recStart && r.pos.off == 0 {
				sc.start = r.payload
			}
			sc.items = append(sc.items, scanItem{rec: r})
			off = r.end
			sc.end = off
			continue
		}
		if st == recNone && cleanEnd(data, seg, off) && findRecord(data, seg, off+1, false) < 0 {
			break // the end
		}
		if cur == nil {
			cur = &walDamage{seg: seg, from: off}
		}
		cur.records++
		if st == recBadPayload {
			off = r.end // skipped exactly: its header says where it ends
			cur.to = off
			continue
		}
		nx := findRecord(data, seg, off+1, false)
		if nx < 0 {
			cur.to = max(cur.to, min(off+recHeaderLen, size))
			break
		}
		cur.to, off = nx, nx
	}
	if cur != nil {
		if cur.to <= cur.from {
			cur.to = min(cur.from+recHeaderLen, size)
		}
		sc.tail = *cur
	}
	return sc
}

// logRead is what readLog read of a spool's log and its verdict, which the
// replay and Verify both go by: they never disagree on what was lost.
type logRead struct {
	files  []uint64 // every segment's number, ascending
	spares []string // spare files' names
	segs   []logSeg // the segments from the applied one on
	// lanes: the keys the log's recLane records name (those before the
	// applied position too).
	lanes map[uint64]storage.LaneKey
	// damage lost acknowledged records; harmless lost nothing (chunks
	// acknowledged later, acks, lane records); torn is a write cut short
	// at the log's end, never acknowledged.
	damage, harmless, torn []walDamage
	// Why the log does not belong with spool.db: segments of another
	// spool; positions spool.db recorded that the log does not reach.
	foreign, unreached []string
}

// mismatch is the first reason the log does not belong with spool.db, ""
// when it does.
func (lr *logRead) mismatch() string {
	if m := append(lr.unreached, lr.foreign...); len(m) > 0 {
		return m[0]
	}
	return ""
}

// logSeg is one segment as readLog read it.
type logSeg struct {
	no   uint64
	data []byte
	sc   segScan     // readLog's, while it judges
	recs []walRecord // the valid records from the applied position on
	end  int64       // where they end (the applied offset when none)
}

// data is segment no's bytes, nil when it was not read.
func (lr *logRead) data(no uint64) []byte {
	if i := slices.IndexFunc(lr.segs, func(sg logSeg) bool { return sg.no == no }); i >= 0 {
		return lr.segs[i].data
	}
	return nil
}

// readLog reads the segments of walDir from applied on and judges every
// byte that is not a valid record (id: spool.db's id, nil when unknown;
// synced: the end spool.db recorded as acknowledged).
//
// The next segment's recStart says where a segment's last completed write
// ended: bytes past it are not the log's, records missing before it are
// damage. In the log's last segment, a bad tail at or past synced is a
// write cut short, anything missing before synced is damage. Without a
// recStart in the next (an older version's), a bad tail is damage unless
// it is the log's end.
func readLog(walDir string, id []byte, applied, synced walPos) (*logRead, error) {
	lr := &logRead{lanes: map[uint64]storage.LaneKey{}}
	var err error
	if lr.files, lr.spares, err = walFiles(walDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	last := -1 // the last segment with a valid record
	for _, no := range lr.files {
		if no < applied.seg {
			continue
		}
		data, err := os.ReadFile(filepath.Join(walDir, segName(no)))
		if err != nil {
			return nil, err
		}
		sc := scanSegment(data, no, 0)
		// One before the applied position predates the spool's id.
		if sc.start != nil && id != nil && !(walPos{no, 0}).less(applied) && !bytes.Equal(sc.start[:16], id) {
			lr.foreign = append(lr.foreign, fmt.Sprintf("write-ahead log segment %s belongs to another spool", segName(no)))
		}
		if slices.ContainsFunc(sc.items, func(it scanItem) bool { return it.damage == nil }) {
			last = len(lr.segs)
		}
		lr.segs = append(lr.segs, logSeg{no: no, data: data, sc: sc})
	}
	for _, p := range []walPos{applied, synced} {
		if p.off > 0 && !p.less(applied) && int64(len(lr.data(p.seg))) < p.off {
			lr.unreached = append(lr.unreached, fmt.Sprintf("spool.db says the write-ahead log reaches segment %s offset %d, which wal/ does not hold", segName(p.seg), p.off))
		}
	}

	// Each segment's end, as the next one's recStart names it.
	ends := map[uint64]int64{}
	var cands []walDamage
	for _, r := range lr.segs {
		if r.sc.start == nil {
			continue
		}
		pno, pend := binary.LittleEndian.Uint64(r.sc.start[16:]), int64(binary.LittleEndian.Uint64(r.sc.start[24:]))
		if pno < applied.seg || pno >= r.no || pend <= 0 {
			continue
		}
		ends[pno] = pend
		if lr.data(pno) == nil {
			cands = append(cands, walDamage{seg: pno, to: pend, what: "the segment is missing; the next one says it held records"})
		}
	}
	for i := range lr.segs {
		ls := &lr.segs[i]
		from := int64(0)
		if ls.no == applied.seg {
			from = applied.off
		}
		end, hasEnd := ends[ls.no]
		ls.end = from
		for _, it := range ls.sc.items {
			at, to := it.rec.pos.off, it.rec.end
			if it.damage != nil {
				at, to = it.damage.from, it.damage.to
			}
			if hasEnd && at >= end {
				break // past the segment's end: not the log's
			}
			if it.damage == nil && it.rec.typ == recLane {
				if key, _, err := decodeLane(it.rec.payload); err == nil {
					lr.lanes[it.rec.lane] = key
				}
			}
			if at < from {
				continue // in spool.db already
			}
			if it.damage != nil {
				if hasEnd {
					to = min(to, end)
				}
				cands = append(cands, walDamage{seg: ls.no, from: at, to: to, what: "damaged records between valid ones"})
				continue
			}
			ls.recs = append(ls.recs, it.rec)
			ls.end = to
		}
		tail := ls.sc.tail
		tail.from = max(tail.from, ls.end)
		ls.sc = segScan{}
		switch {
		case hasEnd:
			if ls.end < end {
				cands = append(cands, walDamage{seg: ls.no, from: ls.end, to: end, what: "the segment ends before where the next one says its records end"})
			}
		case i >= last:
			// The log's end.
			if synced.seg == ls.no && synced.off > ls.end {
				cands = append(cands, walDamage{seg: ls.no, from: ls.end, to: synced.off, what: "the log ends before the end spool.db recorded as acknowledged"})
				tail.from = max(tail.from, synced.off)
			}
			if tail.to > tail.from {
				if (walPos{ls.no, tail.from}).less(synced) {
					cands = append(cands, walDamage{seg: ls.no, from: tail.from, to: tail.to, what: "damaged records at the end of a segment"})
				} else {
					tail.what = "a write cut short at the log's end (never acknowledged)"
					lr.torn = append(lr.torn, tail)
				}
			}
		case tail.to > tail.from:
			cands = append(cands, walDamage{seg: ls.no, from: tail.from, to: tail.to, what: "damaged records at the end of a segment"})
		}
	}
	// The chunks the log acknowledges, only when there is damage.
	delivered := map[laneSeq]bool{}
	for _, sg := range lr.segs {
		for _, rec := range sg.recs {
			if rec.typ == recAcks && len(cands) > 0 {
				acksOf(rec.payload, func(k laneSeq) { delivered[k] = true })
			}
		}
	}
	for _, d := range cands {
		d.attribute(lr.data(d.seg), delivered)
		if d.lost() > 0 {
			lr.damage = append(lr.damage, d)
		} else {
			d.what += "; nothing in them was lost (chunks delivered before the stop, acknowledgements, lane records)"
			lr.harmless = append(lr.harmless, d)
		}
	}
	return lr, nil
}

// acksOf calls f for each chunk an acks record's payload acknowledges.
func acksOf(p []byte, f func(laneSeq)) {
	for ; len(p) >= ackEntryLen; p = p[ackEntryLen:] {
		f(laneSeq{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])})
	}
}

// pending is what the log holds from the applied position on, its own acks
// applied: the chunk records it does not acknowledge later, in log order;
// the chunks it acknowledges but does not hold (spool.db's); its ack count.
func (lr *logRead) pending() (chunks []walRecord, acked map[laneSeq]bool, acks int) {
	at := map[laneSeq]int{}
	acked = map[laneSeq]bool{}
	for _, sg := range lr.segs {
		for _, r := range sg.recs {
			switch r.typ {
			case recChunk:
				at[laneSeq{r.lane, r.seq}] = len(chunks)
				chunks = append(chunks, r)
			case recAcks:
				acksOf(r.payload, func(k laneSeq) {
					acks++
					if i, ok := at[k]; ok {
						chunks[i].typ = 0 // acknowledged
						delete(at, k)
					} else {
						acked[k] = true
					}
				})
			}
		}
	}
	return slices.DeleteFunc(chunks, func(r walRecord) bool { return r.typ == 0 }), acked, acks
}

// attribute counts what d cost (a chunk record acknowledged later lost
// nothing).
func (d *walDamage) attribute(data []byte, delivered map[laneSeq]bool) {
	data = data[:min(d.to, int64(len(data)))]
	for off := d.from; off < d.to; {
		d.records++
		r, st := readRecord(data, d.seg, off)
		if st == recNone {
			d.unreadable++
			d.headless++
			if off = findRecord(data, d.seg, off+1, true); off < 0 {
				break
			}
			continue
		}
		off = r.end
		if r.typ != recChunk || delivered[laneSeq{r.lane, r.seq}] {
			continue
		}
		d.chunks++
		if !slices.Contains(d.lanes, r.lane) {
			d.lanes = append(d.lanes, r.lane)
		}
		var c storage.Chunk
		if decodeRecords(r.seq, r.payload, &c, nil) == nil {
			d.events += len(c.Records)
		} else {
			d.unreadable++ // its framing is lost too: how many events is unknown
		}
	}
}

// laneLabels names d's lanes: by the log's recLane records, else by keys
// (spool.db's); "unknown" for records whose headers are lost.
func (lr *logRead) laneLabels(d walDamage, keys map[uint64]storage.LaneKey) string {
	var ls []string
	for _, id := range d.lanes {
		_, label, _ := lr.laneKey(id, keys)
		ls = append(ls, label)
	}
	if d.headless > 0 {
		ls = append(ls, "unknown")
	}
	return strings.Join(ls, ",")
}

// laneKey is lane id's key by the log's recLane records, else by keys
// (spool.db's), and its label ("lane-<id>" when neither names it).
func (lr *logRead) laneKey(id uint64, keys map[uint64]storage.LaneKey) (storage.LaneKey, string, bool) {
	key, ok := lr.lanes[id]
	if !ok {
		key, ok = keys[id]
	}
	if !ok {
		return key, fmt.Sprintf("lane-%d", id), false
	}
	return key, key.Label(), true
}

// summary says what d lost, for relay spool verify.
func (d walDamage) summary(lanes string) string {
	s := fmt.Sprintf("segment %s bytes %d-%d: %s: lane %s: %d damaged records, %d events lost", segName(d.seg), d.from, d.to, d.what, lanes, d.records, d.events)
	if d.unreadable > 0 {
		s += fmt.Sprintf(" and %d records whose events are unknown", d.unreadable)
	}
	return s
}

// walFiles lists the WAL directory: segment numbers, ascending, and spares.
func walFiles(dir string) (segs []uint64, spares []string, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if no, ok := parseSegName(e.Name()); ok {
			segs = append(segs, no)
		} else if strings.HasPrefix(e.Name(), sparePrefix) {
			spares = append(spares, e.Name())
		}
	}
	slices.Sort(segs)
	return segs, spares, nil
}

// allocFile allocates f's blocks where the filesystem can.
func allocFile(f *os.File, size int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return nil
	}
	return err
}

// removeIfExists removes path; a missing file is not an error.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// fileBytes is the disk space of a file: its allocated blocks (a sparse
// tail is free), or its length when the blocks are unknown.
func fileBytes(fi fs.FileInfo) int64 {
	n := fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		n = min(n, st.Blocks*512)
	}
	return n
}

func walPath(dir string) string { return filepath.Join(dir, walDirName) }
