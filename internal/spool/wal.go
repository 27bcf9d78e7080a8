package spool

import (
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
//	[20]    type: recChunk or recAcks
//	[21:29] lane id (recChunk; 0 otherwise)
//	[29:37] seq (recChunk; 0 otherwise)
//	[37:]   payload: the chunk's encoding (encode.go), or for recAcks
//	        16 bytes per acknowledged chunk: lane id, seq
//
// The payload's checksum is computed by Append's caller, while the chunk is
// in its CPU's cache, and not by the WAL writer, which every append waits
// for.
//
// Records are written at increasing offsets and never span segments. A
// reader takes a segment's records in order up to the first one that is not
// valid (short, wrong number, wrong checksum, unknown type): what follows
// was never acknowledged (a torn write at a crash, a group whose write
// failed, or old bytes of a reused file, whose records carry another
// number). Files are reused: a segment whose records are all in bbolt (or
// acknowledged) becomes a spare, which the writer renames to its next
// segment number; a reused file's blocks are allocated and written, so
// fdatasync has no metadata to write (about half the time of a fresh file's
// here).

const (
	recHeaderLen = 37
	recChunk     = 1
	recAcks      = 2
	ackEntryLen  = 16

	// DefaultSegmentBytes is the size of a WAL segment file. A write
	// (group commit) never spans two, and holds at most a quarter of one
	// unless a single chunk is larger (that chunk gets a segment of its own).
	DefaultSegmentBytes = 16 << 20

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

// nextRecord decodes the record of segment seg at data[off:], or returns
// false when there is no valid one.
func nextRecord(data []byte, seg uint64, off int64) (walRecord, bool) {
	if int64(len(data))-off < recHeaderLen {
		return walRecord{}, false
	}
	h := data[off : off+recHeaderLen]
	if crc32.Checksum(h[4:], crcTable) != binary.LittleEndian.Uint32(h) {
		return walRecord{}, false
	}
	n := int64(binary.LittleEndian.Uint32(h[8:]))
	if binary.LittleEndian.Uint64(h[12:]) != seg || n > int64(len(data))-off-recHeaderLen {
		return walRecord{}, false
	}
	p := data[off+recHeaderLen : off+recHeaderLen+n]
	if payloadCRC(p) != binary.LittleEndian.Uint32(h[4:]) {
		return walRecord{}, false
	}
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
	default:
		return walRecord{}, false
	}
	return r, true
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
