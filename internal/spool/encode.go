package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// On-disk encodings. Every value starts with a format version byte so that a
// later version can read (or refuse) an older file.
//
// Chunk (queue bucket value, key = 8-byte big-endian seq):
//
//	[0]     chunkVersion (1)
//	[1:9]   accepted, unix milliseconds, int64 big-endian
//	[9:13]  record count, uint32 big-endian
//	then per record: uvarint len(OrderKey), OrderKey,
//	                 uvarint len(UserID), UserID,
//	                 uvarint len(Data), Data
//
// Lane (lanes bucket value, key = 8-byte big-endian lane id):
//
//	[0] laneVersion (1), [1] kind,
//	uvarint len(APIKey), APIKey, uvarint len(Options), Options,
//	then 4 x uint64 big-endian: next seq, live chunks, live records, live bytes.
//
// Dead letter (dead bucket value, key = 8-byte big-endian id):
//
//	[0] deadVersion (1), [1] kind,
//	uvarint-length-prefixed APIKey, Options, Reason, Answer,
//	varint accepted unix ms, varint died unix ms,
//	uvarint-length-prefixed OrderKey, UserID, Data.

const (
	chunkVersion = 1
	laneVersion  = 1
	deadVersion  = 1

	chunkHeaderLen = 13
)

// errCorrupt is returned when a stored value cannot be decoded.
var errCorrupt = errors.New("spool: corrupt value")

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func putChunkHeader(buf []byte, accepted int64, n int) {
	buf[0] = chunkVersion
	binary.BigEndian.PutUint64(buf[1:9], uint64(accepted))
	binary.BigEndian.PutUint32(buf[9:13], uint32(n))
}

// chunkHeader decodes a chunk's header.
func chunkHeader(v []byte) (acceptedMs int64, n int, err error) {
	if len(v) < chunkHeaderLen || v[0] != chunkVersion {
		return 0, 0, errCorrupt
	}
	return int64(binary.BigEndian.Uint64(v[1:9])), int(binary.BigEndian.Uint32(v[9:13])), nil
}

// decodeChunk decodes v into c; the records alias v, c.Records is taken
// from slab (nil: a fresh slice).
func decodeChunk(seq uint64, v []byte, c *Chunk, slab *recSlab) error {
	ms, n, err := chunkHeader(v)
	if err != nil {
		return err
	}
	if n > len(v) { // each record takes at least 3 bytes; cheap sanity bound
		return errCorrupt
	}
	c.Seq = seq
	c.Accepted = time.UnixMilli(ms)
	c.Size = len(v)
	c.Records = slab.take(n)
	p := v[chunkHeaderLen:]
	for i := range c.Records {
		r := &c.Records[i]
		if r.OrderKey, p, err = takeBytes(p); err != nil {
			return err
		}
		if r.UserID, p, err = takeBytes(p); err != nil {
			return err
		}
		if r.Data, p, err = takeBytes(p); err != nil {
			return err
		}
	}
	if len(p) != 0 {
		return errCorrupt
	}
	return nil
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

func encodeLane(dst []byte, k LaneKey, st laneState) []byte {
	dst = append(dst, laneVersion, byte(k.Kind))
	dst = appendBytes(dst, []byte(k.APIKey))
	dst = appendBytes(dst, []byte(k.Options))
	dst = binary.BigEndian.AppendUint64(dst, st.nextSeq)
	dst = binary.BigEndian.AppendUint64(dst, st.chunks)
	dst = binary.BigEndian.AppendUint64(dst, st.records)
	dst = binary.BigEndian.AppendUint64(dst, st.bytes)
	return dst
}

func decodeLane(v []byte) (LaneKey, laneState, error) {
	var k LaneKey
	var st laneState
	if len(v) < 2 || v[0] != laneVersion {
		return k, st, fmt.Errorf("lane record version: %w", errCorrupt)
	}
	k.Kind = Kind(v[1])
	ak, p, err := takeBytes(v[2:])
	if err != nil {
		return k, st, err
	}
	op, p, err := takeBytes(p)
	if err != nil {
		return k, st, err
	}
	if len(p) != 32 {
		return k, st, errCorrupt
	}
	k.APIKey, k.Options = string(ak), string(op)
	st.nextSeq = binary.BigEndian.Uint64(p[0:])
	st.chunks = binary.BigEndian.Uint64(p[8:])
	st.records = binary.BigEndian.Uint64(p[16:])
	st.bytes = binary.BigEndian.Uint64(p[24:])
	return k, st, nil
}

func encodeDead(dst []byte, d *DeadLetter) []byte {
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
	return dst
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
func decodeDead(id uint64, v []byte) (DeadLetter, error) {
	d := DeadLetter{ID: id}
	if len(v) < 2 || v[0] != deadVersion {
		return d, errCorrupt
	}
	d.Lane.Kind = Kind(v[1])
	var b [4][]byte
	p := v[2:]
	var err error
	for i := range b {
		if b[i], p, err = takeBytes(p); err != nil {
			return d, err
		}
	}
	d.Lane.APIKey, d.Lane.Options, d.Reason, d.Answer = string(b[0]), string(b[1]), string(b[2]), b[3]
	acc, n := binary.Varint(p)
	if n <= 0 {
		return d, errCorrupt
	}
	p = p[n:]
	died, n := binary.Varint(p)
	if n <= 0 {
		return d, errCorrupt
	}
	p = p[n:]
	d.Accepted, d.Died = fromMs(acc), fromMs(died)
	if d.Record.OrderKey, p, err = takeBytes(p); err != nil {
		return d, err
	}
	if d.Record.UserID, p, err = takeBytes(p); err != nil {
		return d, err
	}
	if d.Record.Data, p, err = takeBytes(p); err != nil {
		return d, err
	}
	if len(p) != 0 {
		return d, errCorrupt
	}
	return d, nil
}
