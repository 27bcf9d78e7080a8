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
	"sort"
	"strconv"
	"strings"
	"syscall"
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
// The payload's checksum is the chunk's own (encode.go: for a version 2
// chunk, the CRC-32C of its bytes from 5 on, which the chunk carries at
// [1:5]; for a version 1 chunk, of the whole payload); it is computed by
// Append's caller, while the chunk is in its CPU's cache, and not by the
// WAL writer, which every append waits for.
//
// Every segment written by this version starts with a recStart record (a
// segment of an older version has none). Records are written at increasing
// offsets and never span segments. A reader (scanSegment) takes a
// segment's records in order; at a record that is not valid (short, wrong
// number, wrong checksum, unknown type) it looks for the next valid record
// of the same segment further on:
//
//   - there is one: the bytes between are damage, skipped exactly (a record
//     whose header is intact but whose payload is not is skipped by its
//     length), and the reading goes on after them;
//   - there is none, and the bytes there are zeros or a record of another
//     segment (old bytes of a reused file): the segment's clean end;
//   - there is none, and the bytes there are anything else: a bad tail. In
//     the newest segment, at or past the end that spool.db last recorded as
//     acknowledged (meta key "walsync", unless NoSync), it is a write cut
//     by a crash, which was never acknowledged (see replay.go); anywhere
//     else it is damage.
//
// A valid record can not start inside another's payload by chance: it needs
// a header checksum and the segment's number, and record payloads are JSON
// text (no zero bytes) except for the chunk headers. Files are reused: a segment whose records are all in bbolt (or
// acknowledged) becomes a spare, which the writer renames to its next
// segment number; a reused file's blocks are allocated and written, so
// fdatasync has no metadata to write (about half the time of a fresh file's
// here).

const (
	recHeaderLen = 37
	recChunk     = 1
	recAcks      = 2
	recStart     = 3
	recLane      = 4
	ackEntryLen  = 16
	startLen     = 32 // recStart payload

	// defaultSegmentBytes is the size of a WAL segment file. A write
	// (group commit) never spans two, and holds at most a quarter of one
	// unless a single chunk is larger (that chunk gets a segment of its own).
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

// putRecHeader writes the header of a record whose payload has length n and
// checksum crc into h (recHeaderLen bytes).
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
// at or after from, -1 when there is none.
func findRecord(data []byte, seg uint64, from int64) int64 {
	// Candidates are where the segment's number sits at its header
	// offset: bytes.Index finds them at memory speed (a replay calls
	// this at every segment's end).
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
		if _, st := readRecord(data, seg, o); st == recOK {
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
	zero := true
	for _, b := range h {
		if b != 0 {
			zero = false
			break
		}
	}
	if zero {
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
	records  int // damaged records in it: at least 1
}

// segScan is what scanSegment read of a segment.
type segScan struct {
	items []scanItem
	// end is just past the last valid record (the offset the scan
	// started at when there is none).
	end int64
	// tail, when tail.to > tail.from, is a bad tail: bytes after the
	// last valid record that are not a clean end.
	tail walDamage
	// start is the segment's recStart payload, nil when it has none.
	start []byte
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
		if st == recNone && cleanEnd(data, seg, off) && findRecord(data, seg, off+1) < 0 {
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
		nx := findRecord(data, seg, off+1)
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

// walFiles lists the WAL directory: segment numbers (ascending) and spare
// file names.
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
	sort.Slice(segs, func(i, j int) bool { return segs[i] < segs[j] })
	return segs, spares, nil
}

// allocFile gives f size bytes of allocated blocks (fallocate; a filesystem
// that cannot is left to grow the file as it is written).
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

// walDirBytes is the disk space of the regular files in dir (allocated
// blocks, or the length when unknown).
func walDirBytes(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fileBytes(fi)
		}
	}
	return n
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
