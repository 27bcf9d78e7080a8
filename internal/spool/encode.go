package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// On-disk encodings. Every value starts with a format version byte so that a
// later version can read (or refuse) an older file. Every value written by
// this version carries a CRC-32C (Castagnoli, crcTable), checked on every
// read: a value that fails it is damage, never data.
//
// Chunk (queue bucket value, key = 8-byte big-endian seq; also the payload
// of a WAL chunk record, whose header's payload checksum is the same CRC):
//
//	[0]      chunkVersion (2)
//	[1:5]    CRC-32C of bytes [5:], uint32 big-endian
//	[5:13]   accepted, unix milliseconds, int64 big-endian
//	[13:17]  record count, uint32 big-endian
//	[17]     flags: 0 or flagVerdict (any other is refused)
//	[18:26]  with flagVerdict only: the chunk's tracking-plan verdict,
//	         uint64 big-endian (storage.Batch.Vet)
//	then per record: uvarint len(OrderKey), OrderKey,
//	                 uvarint len(UserID), UserID,
//	                 uvarint len(Data), Data,
//	                 with flagVerdict only: one mark byte, 1 when the record
//	                 is clean against the verdict (Record.Verdict), else 0
//
// A chunk without flagVerdict (every chunk written before verdicts, and
// every one written with the plan off) is read as before, its records
// without a verdict: delivery checks them in full.
//
// Version 1 chunks (formats up to 3: [0] 1, [1:9] accepted, [9:13] count,
// then the records) carry no checksum of their own; they are read as they
// are (their WAL records were checked by the record's payload CRC) and
// leave the file as they are delivered.
//
// Lane (lanes bucket value, key = 8-byte big-endian lane id):
//
//	[0] laneVersion (2), [1] kind,
//	uvarint len(APIKey), APIKey, uvarint len(Options), Options,
//	then 4 x uint64 big-endian: next seq, live chunks, live records, live bytes,
//	then CRC-32C of everything before it, uint32 big-endian (not in version 1).
//
// Dead letter (dead bucket value, key = 8-byte big-endian id):
//
//	[0] deadVersion (2), [1] kind,
//	uvarint-length-prefixed APIKey, Options, Reason, Answer,
//	varint accepted unix ms, varint died unix ms,
//	uvarint-length-prefixed OrderKey, UserID, Data,
//	then CRC-32C of everything before it, uint32 big-endian (not in version 1).

const (
	chunkVersion = 2
	laneVersion  = 2
	deadVersion  = 2

	chunkHeaderLen   = storage.BatchHeaderLen
	chunkV1HeaderLen = 13

	// flagVerdict: the chunk carries a verdict and a mark per record.
	flagVerdict = 1
)

// errCorrupt is returned when a stored value cannot be decoded.
var errCorrupt = errors.New("spool: corrupt value")

// errChecksum is returned when a stored value fails its checksum.
var errChecksum = fmt.Errorf("checksum mismatch: %w", errCorrupt)

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// putChunkHeader writes the header of a chunk of n records whose records
// follow in buf (after the verdict, when verdict is set: storage.Batch
// wrote it and the marks), and its checksum over them, which it returns: one pass
// over the chunk, in Append's caller, while the chunk is in its CPU's
// cache; the WAL record's payload checksum is the same value.
func putChunkHeader(buf []byte, accepted int64, n int, verdict bool) uint32 {
	buf[0] = chunkVersion
	binary.BigEndian.PutUint64(buf[5:13], uint64(accepted))
	binary.BigEndian.PutUint32(buf[13:17], uint32(n))
	buf[17] = 0
	if verdict {
		buf[17] = flagVerdict
	}
	crc := crc32.Checksum(buf[5:], crcTable)
	binary.BigEndian.PutUint32(buf[1:5], crc)
	return crc
}

// chunkSum is the checksum a chunk carries (v2), or the CRC-32C of a whole
// v1 chunk; ok is false when v is too short to hold a header.
func chunkSum(v []byte) (stored, computed uint32, ok bool) {
	switch {
	case len(v) >= chunkHeaderLen && v[0] == chunkVersion:
		return binary.BigEndian.Uint32(v[1:5]), crc32.Checksum(v[5:], crcTable), true
	case len(v) >= chunkV1HeaderLen && v[0] == 1:
		c := crc32.Checksum(v, crcTable)
		return c, c, true
	}
	return 0, 0, false
}

// verifyChunk checks a chunk's checksum (a v1 chunk has none: only its
// header is checked).
func verifyChunk(v []byte) error {
	_, _, err := chunkHeader(v)
	if err == nil && v[0] == chunkVersion && binary.BigEndian.Uint32(v[1:5]) != crc32.Checksum(v[5:], crcTable) {
		return errChecksum
	}
	return err
}

// chunkHeader decodes a chunk's header (either version; the checksum is
// not checked).
func chunkHeader(v []byte) (acceptedMs int64, n int, err error) {
	switch {
	case len(v) >= chunkHeaderLen && v[0] == chunkVersion:
		return int64(binary.BigEndian.Uint64(v[5:13])), int(binary.BigEndian.Uint32(v[13:17])), nil
	case len(v) >= chunkV1HeaderLen && v[0] == 1:
		return int64(binary.BigEndian.Uint64(v[1:9])), int(binary.BigEndian.Uint32(v[9:13])), nil
	}
	return 0, 0, errCorrupt
}

// upgradeChunk returns v as a version 2 chunk: v itself when it is one, a
// new one with its checksum for a version 1 chunk.
func upgradeChunk(v []byte) []byte {
	if len(v) < chunkV1HeaderLen || v[0] != 1 {
		return v
	}
	acc, n, _ := chunkHeader(v)
	out := make([]byte, chunkHeaderLen, chunkHeaderLen+len(v)-chunkV1HeaderLen)
	out = append(out, v[chunkV1HeaderLen:]...)
	putChunkHeader(out, acc, n, false)
	return out
}

// decodeChunk checks v's checksum and decodes it into c; the records
// alias v, c.Records is taken from
// slab (nil: a fresh slice). A chunk that fails its checksum returns an
// error wrapping errChecksum and decodes nothing.
func decodeChunk(seq uint64, v []byte, c *storage.Chunk, slab *recSlab) error {
	if err := verifyChunk(v); err != nil {
		return err
	}
	return decodeRecords(seq, v, c, slab)
}

// decodeRecords decodes v into c without checking its checksum (salvage
// of damaged chunks, whose framing may still hold).
func decodeRecords(seq uint64, v []byte, c *storage.Chunk, slab *recSlab) error {
	ms, n, err := chunkHeader(v)
	if err != nil {
		return err
	}
	if n > len(v) { // each record takes at least 3 bytes; cheap sanity bound
		return errCorrupt
	}
	p := v[chunkV1HeaderLen:]
	var verdict uint64
	marks := false
	if v[0] == chunkVersion {
		p = v[chunkHeaderLen:]
		switch v[17] {
		case 0:
		case flagVerdict:
			if len(p) < 8 {
				return errCorrupt
			}
			verdict, p, marks = binary.BigEndian.Uint64(p), p[8:], true
		default:
			return fmt.Errorf("unknown chunk flags %#x: %w", v[17], errCorrupt)
		}
	}
	c.Seq = seq
	c.Accepted = time.UnixMilli(ms)
	c.Size = len(v)
	c.Records = slab.take(n)
	for i := range c.Records {
		r := &c.Records[i]
		if p, err = takeRecord(p, r); err != nil {
			return err
		}
		r.Verdict = 0
		if marks {
			if len(p) == 0 || p[0] > 1 {
				return errCorrupt
			}
			if p[0] == 1 {
				r.Verdict = verdict
			}
			p = p[1:]
		}
	}
	if len(p) != 0 {
		return errCorrupt
	}
	return nil
}

// takeRecord splits a record's three fields off p into r.
func takeRecord(p []byte, r *storage.Record) (rest []byte, err error) {
	if r.OrderKey, p, err = takeBytes(p); err == nil {
		if r.UserID, p, err = takeBytes(p); err == nil {
			r.Data, p, err = takeBytes(p)
		}
	}
	return p, err
}

// takeBytes splits a uvarint-length-prefixed byte string off p. An empty
// string decodes as nil.
func takeBytes(p []byte) (b, rest []byte, err error) {
	l, n := binary.Uvarint(p)
	if n <= 0 || l > uint64(len(p)-n) {
		return nil, nil, errCorrupt
	}
	p = p[n:]
	if l == 0 {
		return nil, p, nil
	}
	return p[:l:l], p[l:], nil
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// laneState is a lane's persistent counters.
type laneState struct {
	nextSeq, chunks, records, bytes uint64
}

func encodeLane(dst []byte, k storage.LaneKey, st laneState) []byte {
	start := len(dst)
	dst = append(dst, laneVersion, byte(k.Kind))
	dst = appendBytes(dst, []byte(k.APIKey))
	dst = appendBytes(dst, []byte(k.Options))
	for _, n := range [4]uint64{st.nextSeq, st.chunks, st.records, st.bytes} {
		dst = binary.BigEndian.AppendUint64(dst, n)
	}
	return sealValue(dst, start)
}

// sealValue appends the CRC-32C of dst[start:] to dst.
func sealValue(dst []byte, start int) []byte {
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable))
}

// openFields checks a lane or dead letter value (a version 2 value must
// carry a right checksum, a version 1 value has none) and splits off its
// kind and the length-prefixed strings that fill fs; rest is what follows.
func openFields(v []byte, fs [][]byte) (kind storage.Kind, rest []byte, err error) {
	switch {
	case len(v) >= 2 && v[0] == 1:
	case len(v) < 6 || v[0] != 2:
		return 0, nil, fmt.Errorf("value version: %w", errCorrupt)
	case crc32.Checksum(v[:len(v)-4], crcTable) != binary.BigEndian.Uint32(v[len(v)-4:]):
		return 0, nil, errChecksum
	default:
		v = v[:len(v)-4]
	}
	rest = v[2:]
	for i := range fs {
		if fs[i], rest, err = takeBytes(rest); err != nil {
			return 0, nil, err
		}
	}
	return storage.Kind(v[1]), rest, nil
}

func decodeLane(v []byte) (k storage.LaneKey, st laneState, err error) {
	var b [2][]byte
	k.Kind, v, err = openFields(v, b[:])
	if err == nil && len(v) != 32 {
		err = errCorrupt
	}
	if err != nil {
		return k, st, fmt.Errorf("lane record: %w", err)
	}
	k.APIKey, k.Options = string(b[0]), string(b[1])
	for i, n := range [4]*uint64{&st.nextSeq, &st.chunks, &st.records, &st.bytes} {
		*n = binary.BigEndian.Uint64(v[8*i:])
	}
	return k, st, nil
}

func encodeDead(dst []byte, d *storage.DeadLetter) []byte {
	start := len(dst)
	dst = append(dst, deadVersion, byte(d.Lane.Kind))
	dst = appendBytes(dst, []byte(d.Lane.APIKey))
	dst = appendBytes(dst, []byte(d.Lane.Options))
	dst = appendBytes(dst, []byte(d.Reason))
	dst = appendBytes(dst, d.Answer)
	dst = binary.AppendVarint(dst, unixMs(d.Accepted))
	dst = binary.AppendVarint(dst, unixMs(d.Died))
	dst = appendBytes(dst, d.Record.OrderKey)
	dst = appendBytes(dst, d.Record.UserID)
	dst = appendBytes(dst, d.Record.Data)
	return sealValue(dst, start)
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// decodeDead decodes v (which must not be reused: the result aliases it).
func decodeDead(id uint64, v []byte) (storage.DeadLetter, error) {
	d := storage.DeadLetter{ID: id}
	var b [4][]byte
	kind, p, err := openFields(v, b[:])
	if err != nil {
		return d, err
	}
	d.Lane.Kind = kind
	d.Lane.APIKey, d.Lane.Options, d.Reason, d.Answer = string(b[0]), string(b[1]), string(b[2]), b[3]
	for _, t := range [2]*time.Time{&d.Accepted, &d.Died} {
		ms, n := binary.Varint(p)
		if n <= 0 {
			return d, errCorrupt
		}
		*t, p = fromMs(ms), p[n:]
	}
	if p, err = takeRecord(p, &d.Record); err != nil {
		return d, err
	}
	if len(p) != 0 {
		return d, errCorrupt
	}
	return d, nil
}
