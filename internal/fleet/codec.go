package fleet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/svcrelay/relay/internal/storage"
)

// A message's body:
//
//	version:u8 kind:u8 apiKey:uvarint-len+bytes options:uvarint-len+bytes
//	accepted:uvarint (Unix ms) count:uvarint
//	records: count x (orderKey, userID, data: each uvarint-len+bytes),
//	         as they are (version 1), as one S2 block (version 2) or as
//	         zstd frames one after the other (version 3: older relays
//	         write one frame, this one a frame per request or run of
//	         small ones; a zstd decoder reads the sequence as one)
//	crc32c:4 bytes big-endian over everything before it
//
// A message holds the records of one lane in one partition from one or
// more requests of one batch (group commit), each request's in its order
// and the requests one after the other; accepted is the earliest of their
// acceptance times.
//
// Why compressed: every byte of a message is written by each node to its
// Raft log and to its stream store, sent over two routes and read back by
// the partition's owner: about half of the cluster's CPU per event went
// on bytes (bench/RESULTS.md, "Fleet: compressed messages"); the relay
// compresses once. zstd (its fastest level) shrinks events about twice as
// much as S2 (JSON with random property values: 4.1x against 1.75x) for
// about five times S2's encoding CPU, which the relays pay and the nodes
// are spared: the relays scale out, the cluster's nodes are what every
// relay shares. Version 2 is written while a member reads S2 only, version
// 1 when compression does not shrink the records (a few small ones) or a
// member reads neither; every version is read from streams written before.
//
// JetStream checksums its own blocks; the trailer catches a message that
// was not written by this package or was damaged on the way.
const (
	codecPlain = 1
	codecS2    = 2
	codecZstd  = 3
)

// The zstd coders, shared (EncodeAll and DecodeAll may be called at once
// from any goroutine, up to GOMAXPROCS at a time) and made on first use.
// Their low-memory modes and a window of DefaultMaxMessageBytes keep them
// at about 1.4 MiB per core (2.7 MiB measured with GOMAXPROCS 2, encoding
// and decoding 512 KiB), against about 9 MiB per core at their defaults,
// with the same ratio on messages of that size.
var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(false),
			zstd.WithLowerEncoderMem(true), zstd.WithWindowSize(DefaultMaxMessageBytes))
		if err != nil {
			panic(err) // only for invalid options
		}
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecoded), zstd.WithDecoderLowmem(true))
		if err != nil {
			panic(err) // only for invalid options
		}
		return d
	})
)

// maxDecoded bounds a compressed message's records as its block states
// them: NATS's largest max_payload, so that a damaged length cannot make
// decode allocate more than any message could hold.
const maxDecoded = 64 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt is returned by decode for a body it cannot read.
var errCorrupt = errors.New("fleet: corrupt message")

// header is what every message of a request's partition group repeats.
type header struct {
	lane     storage.LaneKey
	accepted time.Time
}

func (h *header) size() int {
	return 1 + 1 + 2*binary.MaxVarintLen64 + len(h.lane.APIKey) + len(h.lane.Options) + 2*binary.MaxVarintLen64
}

func recordSize(r *storage.Record) int {
	return 3*binary.MaxVarintLen32 + len(r.OrderKey) + len(r.UserID) + len(r.Data)
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// encodeRecords appends recs' part of a message body to dst.
func encodeRecords(dst []byte, recs []storage.Record) []byte {
	for i := range recs {
		dst = appendBytes(dst, recs[i].OrderKey)
		dst = appendBytes(dst, recs[i].UserID)
		dst = appendBytes(dst, recs[i].Data)
	}
	return dst
}

// encodeMessage appends to dst the body of a message of n records, whose
// encodings (encodeRecords) are the concatenation of parts, compressed
// with codec (codecS2 or codecZstd; any other: not) when that shrinks
// them.
func encodeMessage(dst []byte, h *header, n int, parts [][]byte, codec byte) []byte {
	b, _ := encodeBody(dst, h, n, parts, codec)
	return b
}

// encodeBody is encodeMessage, also returning the records' encoding it
// compressed, as parts (nil when the body holds them as they are):
// decodeWith takes it instead of decompressing the body again, reading
// the parts where they are, so that keeping them copies nothing.
func encodeBody(dst []byte, h *header, n int, parts [][]byte, codec byte) (body []byte, plain [][]byte) {
	start := len(dst)
	dst = appendHeader(dst, h, n)
	hdr := len(dst)
	size := partsLen(parts)
	switch codec {
	case codecS2:
		dst = append(dst, s2.Encode(nil, slices.Concat(parts...))...)
	case codecZstd:
		dst = appendFrames(dst, parts)
	}
	if len(dst) > hdr && len(dst)-hdr < size {
		dst[start] = codec
		plain = parts
	} else { // not compressed, or compression did not shrink them
		dst = dst[:hdr]
		for _, p := range parts {
			dst = append(dst, p...)
		}
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), plain
}

// partsLen is the bytes parts hold together.
func partsLen(parts [][]byte) int {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return n
}

// appendHeader appends a body's header, version plain, to dst.
func appendHeader(dst []byte, h *header, n int) []byte {
	dst = append(dst, codecPlain, byte(h.lane.Kind))
	dst = appendBytes(dst, []byte(h.lane.APIKey))
	dst = appendBytes(dst, []byte(h.lane.Options))
	dst = binary.AppendUvarint(dst, uint64(h.accepted.UnixMilli()))
	return binary.AppendUvarint(dst, uint64(n))
}

// minFrame is the least of a request's records (encodeRecords, in one
// partition) compressed as a zstd frame of their own: smaller ones
// compress worse alone and go into a frame with their neighbours.
const minFrame = 4 << 10

// appendFrames appends parts, compressed, as a sequence of zstd frames
// (a frame decoder reads them as one): each part of minFrame bytes or
// more compressed where it is, each run of smaller ones joined and
// compressed. Frames of one request's size (tens of KiB: one zstd block,
// without history) cost less per byte than one frame of the message's,
// and no buffer joins the parts (bench/RESULTS.md, "fleetone").
func appendFrames(dst []byte, parts [][]byte) []byte {
	var run [][]byte
	flushRun := func() {
		switch len(run) {
		case 0:
			return
		case 1:
			dst = zstdEncoder().EncodeAll(run[0], dst)
		default:
			dst = zstdEncoder().EncodeAll(slices.Concat(run...), dst)
		}
		run = run[:0]
	}
	for _, p := range parts {
		if len(p) < minFrame {
			run = append(run, p)
			continue
		}
		flushRun()
		dst = zstdEncoder().EncodeAll(p, dst)
	}
	flushRun()
	return dst
}

// zstdSize is the records' size that the zstd frames p hold, as their
// headers state it, false when p is not frames. decodeWith sizes its
// buffer with it: the decoder grows a buffer too small for the next frame
// to that frame's end, copying it again for every frame. A frame's header
// omits its size when under 256 bytes (and not its window's size): 256
// are counted for it.
func zstdSize(p []byte) (int, bool) {
	total := 0
	for len(p) > 0 {
		var fh zstd.Header
		if err := fh.Decode(p); err != nil || fh.Skippable || fh.HeaderSize > len(p) {
			return 0, false
		}
		if !fh.HasFCS {
			fh.FrameContentSize = 256
		}
		total += int(min(fh.FrameContentSize, maxDecoded+1))
		if total > maxDecoded {
			return 0, false
		}
		p = p[fh.HeaderSize:]
		for last := false; !last; {
			if len(p) < 3 {
				return 0, false
			}
			bh := uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16
			last = bh&1 == 1
			size := int(bh >> 3)
			if (bh>>1)&3 == 1 { // RLE: one byte, repeated
				size = 1
			}
			if len(p) < 3+size {
				return 0, false
			}
			p = p[3+size:]
		}
		if fh.HasCheckSum {
			if len(p) < 4 {
				return 0, false
			}
			p = p[4:]
		}
	}
	return total, true
}

// encode appends the body of a message of recs to dst, compressed when
// that shrinks them.
func encode(dst []byte, h *header, recs []storage.Record) []byte {
	return encodeMessage(dst, h, len(recs), [][]byte{encodeRecords(nil, recs)}, codecZstd)
}

// decode reads a body; the records alias b (version 1) or a buffer of
// their own (versions 2 and 3).
func decode(b []byte) (header, []storage.Record, error) {
	return decodeWith(b, nil)
}

// decodeWith is decode, taking the records' encoding from plain instead of
// decompressing them when plain is not nil and b is compressed: plain is
// what encodeBody compressed into b, in parts of whole records (the
// caller knows it by b's checksum, which decodeWith checks as decode
// does). The records then alias plain.
func decodeWith(b []byte, plain [][]byte) (header, []storage.Record, error) {
	var h header
	if len(b) < 4 {
		return h, nil, errCorrupt
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return h, nil, fmt.Errorf("%w: checksum", errCorrupt)
	}
	if len(body) < 2 || body[0] != codecPlain && body[0] != codecS2 && body[0] != codecZstd {
		return h, nil, fmt.Errorf("%w: version", errCorrupt)
	}
	h.lane.Kind = storage.Kind(body[1])
	p := body[2:]
	var rest [][]byte // plain's parts after p
	next := func() ([]byte, bool) {
		for len(p) == 0 && len(rest) > 0 {
			p, rest = rest[0], rest[1:]
		}
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, false
		}
		v := p[k : k+int(n) : k+int(n)]
		p = p[k+int(n):]
		return v, true
	}
	uv := func() (uint64, bool) {
		n, k := binary.Uvarint(p)
		if k <= 0 {
			return 0, false
		}
		p = p[k:]
		return n, true
	}
	key, ok1 := next()
	opts, ok2 := next()
	ms, ok3 := uv()
	n, ok4 := uv()
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return h, nil, fmt.Errorf("%w: header", errCorrupt)
	}
	size := len(p) // the records' encoding, once found
	if plain != nil && body[0] != codecPlain {
		p, rest, size = nil, plain, partsLen(plain)
	} else if body[0] == codecS2 {
		if dn, err := s2.DecodedLen(p); err != nil || dn > maxDecoded {
			return h, nil, fmt.Errorf("%w: compressed length", errCorrupt)
		}
		d, err := s2.Decode(nil, p)
		if err != nil {
			return h, nil, fmt.Errorf("%w: %w", errCorrupt, err)
		}
		p, size = d, len(d)
	} else if body[0] == codecZstd {
		// The decoder refuses a frame that would take more than
		// maxDecoded.
		var buf []byte
		if n, ok := zstdSize(p); ok {
			buf = make([]byte, 0, n)
		}
		d, err := zstdDecoder().DecodeAll(p, buf)
		if err != nil {
			return h, nil, fmt.Errorf("%w: %w", errCorrupt, err)
		}
		p, size = d, len(d)
	}
	if n > uint64(size) {
		return h, nil, fmt.Errorf("%w: header", errCorrupt)
	}
	h.lane.APIKey, h.lane.Options = string(key), string(opts)
	h.accepted = time.UnixMilli(int64(ms))
	recs := make([]storage.Record, n)
	for i := range recs {
		var ok [3]bool
		recs[i].OrderKey, ok[0] = next()
		recs[i].UserID, ok[1] = next()
		recs[i].Data, ok[2] = next()
		if !ok[0] || !ok[1] || !ok[2] {
			return h, nil, fmt.Errorf("%w: record %d", errCorrupt, i)
		}
		if len(recs[i].UserID) == 0 {
			recs[i].UserID = nil
		}
	}
	if trailing := len(p) + partsLen(rest); trailing != 0 {
		return h, nil, fmt.Errorf("%w: %d trailing bytes", errCorrupt, trailing)
	}
	return h, recs, nil
}
