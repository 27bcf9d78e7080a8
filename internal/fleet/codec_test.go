package fleet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

func TestCodecRoundTrip(t *testing.T) {
	h := header{lane: storage.LaneKey{Kind: storage.KindUserMap, APIKey: "k", Options: `{"a":1}`}, accepted: time.UnixMilli(1700000000123)}
	recs := []storage.Record{
		{OrderKey: []byte("d:1"), UserID: []byte("u"), Data: []byte(`{"x":1}`)},
		{OrderKey: []byte("u:2"), Data: []byte{}},
	}
	b := encode(nil, &h, recs)
	g, got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if g.lane != h.lane || !g.accepted.Equal(h.accepted) || len(got) != 2 ||
		!bytes.Equal(got[0].UserID, []byte("u")) || got[1].UserID != nil || string(got[0].Data) != `{"x":1}` || string(got[1].OrderKey) != "u:2" {
		t.Fatalf("decoded %+v %+v", g, got)
	}
	// Every flipped bit is caught (the checksum), and no prefix decodes.
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, _, err := decode(c); !errors.Is(err, errCorrupt) {
			t.Fatalf("bit flip at %d: %v", i, err)
		}
	}
	for n := range len(b) {
		if _, _, err := decode(b[:n]); err == nil {
			t.Fatalf("prefix of %d bytes decoded", n)
		}
	}
}

// TestCodecCompressed: records that compress are stored as a zstd frame or
// an S2 block, much smaller, and read back whole; a body written plain (by
// a relay of before, or records that do not compress) or as S2 (while a
// member reads no zstd) still reads.
func TestCodecCompressed(t *testing.T) {
	h := header{lane: storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}, accepted: time.UnixMilli(1700000000123)}
	var recs []storage.Record
	raw := 0
	for i := range 50 {
		d := fmt.Appendf(nil, `{"event_type":"screen","device_id":"device-%06d","insert_id":"%d","event_properties":{"n":%d}}`, i%3, i, i)
		recs = append(recs, storage.Record{OrderKey: []byte("d:1"), UserID: []byte("user-1"), Data: d})
		raw += len(d)
	}
	z := encode(nil, &h, recs)
	s := encodeMessage(nil, &h, len(recs), [][]byte{encodeRecords(nil, recs)}, codecS2)
	plain := encodeMessage(nil, &h, len(recs), [][]byte{encodeRecords(nil, recs)}, codecPlain)
	for _, c := range []struct {
		body    []byte
		version byte
		below   int
	}{{z, codecZstd, len(s) * 3 / 4}, {s, codecS2, raw / 2}, {plain, codecPlain, raw * 2}} {
		body := c.body
		if body[0] != c.version || len(body) > c.below {
			t.Fatalf("version %d (want %d), %d bytes for %d of data, want under %d", body[0], c.version, len(body), raw, c.below)
		}
		g, got, err := decode(body)
		if err != nil {
			t.Fatalf("version %d: %v", body[0], err)
		}
		if g.lane != h.lane || !g.accepted.Equal(h.accepted) || len(got) != len(recs) {
			t.Fatalf("version %d: decoded %+v, %d records", body[0], g, len(got))
		}
		for i := range recs {
			if !bytes.Equal(got[i].Data, recs[i].Data) || !bytes.Equal(got[i].UserID, recs[i].UserID) || !bytes.Equal(got[i].OrderKey, recs[i].OrderKey) {
				t.Fatalf("version %d: record %d changed", body[0], i)
			}
		}
		for i := range body {
			c := bytes.Clone(body)
			c[i] ^= 0x10
			if _, _, err := decode(c); !errors.Is(err, errCorrupt) {
				t.Fatalf("version %d: bit flip at %d: %v", body[0], i, err)
			}
		}
	}
}

// FuzzDecode feeds bodies with a valid checksum appended, so that the
// parser behind the checksum is what is explored: it must not panic, and
// what it decodes must survive an encode/decode round trip.
func FuzzDecode(f *testing.F) {
	h := header{lane: storage.LaneKey{APIKey: "k"}, accepted: time.UnixMilli(1)}
	b := encode(nil, &h, []storage.Record{{OrderKey: []byte("d:1"), Data: []byte("{}")}})
	f.Add(b[:len(b)-4])
	f.Add([]byte{1, 0, 0, 0, 0, 0})
	z := encode(nil, &h, []storage.Record{{OrderKey: []byte("d:1"), Data: bytes.Repeat([]byte("{}"), 100)}})
	f.Add(z[:len(z)-4])
	s := encodeMessage(nil, &h, 1, [][]byte{encodeRecords(nil, []storage.Record{{OrderKey: []byte("d:1"), Data: bytes.Repeat([]byte("{}"), 100)}})}, codecS2)
	f.Add(s[:len(s)-4])
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.BigEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		h, recs, err := decode(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("error %v is not errCorrupt", err)
			}
			return
		}
		h2, recs2, err := decode(encode(nil, &h, recs))
		if err != nil || h2.lane != h.lane || !h2.accepted.Equal(h.accepted) || len(recs2) != len(recs) {
			t.Fatalf("round trip: %v %+v %+v", err, h2, h)
		}
		for i := range recs {
			if !bytes.Equal(recs[i].OrderKey, recs2[i].OrderKey) || !bytes.Equal(recs[i].UserID, recs2[i].UserID) || !bytes.Equal(recs[i].Data, recs2[i].Data) {
				t.Fatalf("record %d changed in a round trip", i)
			}
		}
	})
}

// TestCodecRecent: a body's records read from the encoding its publisher
// kept (recent) are the ones decompressing it gives; the kept encoding is
// taken once, and only for the very body it was compressed into: a body
// damaged on the way is still refused by its checksum, and another body
// under the same id is decompressed.
func TestCodecRecent(t *testing.T) {
	h := header{lane: storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}, accepted: time.UnixMilli(1700000000123)}
	var recs []storage.Record
	for i := range 50 {
		d := fmt.Appendf(nil, `{"event_type":"screen","device_id":"device-%06d","insert_id":"%d"}`, i%3, i)
		recs = append(recs, storage.Record{OrderKey: []byte("d:1"), Data: d})
	}
	for _, codec := range []byte{codecZstd, codecS2} {
		body, plain := encodeBody(nil, &h, len(recs), [][]byte{encodeRecords(nil, recs[:20]), encodeRecords(nil, recs[20:])}, codec)
		if plain == nil {
			t.Fatalf("codec %d: nothing kept", codec)
		}
		joined := bytes.Join(plain, nil)
		var r recent
		r.put("id-1", body, plain)
		other := encode(nil, &h, recs[:10])
		r.put("id-2", body, plain)
		if got := r.take("id-2", other); got != nil {
			t.Fatalf("codec %d: kept encoding taken for another body", codec)
		}
		if got := r.take("id-1", body); !bytes.Equal(bytes.Join(got, nil), joined) {
			t.Fatalf("codec %d: kept encoding not taken", codec)
		}
		if got := r.take("id-1", body); got != nil {
			t.Fatalf("codec %d: kept encoding taken twice", codec)
		}
		_, want, err := decode(body)
		if err != nil {
			t.Fatal(err)
		}
		g, got, err := decodeWith(body, plain)
		if err != nil {
			t.Fatal(err)
		}
		if g.lane != h.lane || !g.accepted.Equal(h.accepted) || len(got) != len(want) {
			t.Fatalf("codec %d: %+v, %d records; want %d", codec, g, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i].OrderKey, want[i].OrderKey) || !bytes.Equal(got[i].Data, want[i].Data) || !bytes.Equal(got[i].UserID, want[i].UserID) {
				t.Fatalf("codec %d: record %d: %q, want %q", codec, i, got[i].Data, want[i].Data)
			}
		}
		c := bytes.Clone(body)
		c[len(c)/2] ^= 0x10
		if _, _, err := decodeWith(c, plain); !errors.Is(err, errCorrupt) {
			t.Fatalf("codec %d: damaged body with its kept encoding: %v", codec, err)
		}
	}
}

// TestCodecFrames: a body of several zstd frames (large requests' records
// compressed each where they are, runs of small ones joined) reads back
// whole, in order, by decode (as any relay reads version 3) and from the
// parts kept (decodeWith); zstdSize states its records' size.
func TestCodecFrames(t *testing.T) {
	h := header{lane: storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}, accepted: time.UnixMilli(1700000000123)}
	var recs []storage.Record
	var parts [][]byte
	for r, n := range []int{60, 2, 3, 80, 1, 70} { // big, small, small, big, small, big
		var part []storage.Record
		for i := range n {
			d := fmt.Appendf(nil, `{"event_type":"screen","device_id":"device-%d","insert_id":"%d-%d","event_properties":{"n":%d}}`, r, r, i, i*i)
			part = append(part, storage.Record{OrderKey: []byte("d:1"), Data: d})
		}
		recs = append(recs, part...)
		b := encodeRecords(nil, part)
		parts = append(parts, b)
	}
	if len(parts[0]) < minFrame || len(parts[1]) >= minFrame {
		t.Fatalf("parts of %d and %d bytes", len(parts[0]), len(parts[1]))
	}
	joined := bytes.Join(parts, nil)
	{
		body, plain := encodeBody(nil, &h, len(recs), parts, codecZstd)
		if body[0] != codecZstd || len(body) > len(joined)/3 {
			t.Fatalf("version %d, %d bytes of %d", body[0], len(body), len(joined))
		}
		if len(plain) != len(parts) || !bytes.Equal(bytes.Join(plain, nil), joined) {
			t.Fatalf("kept %d parts of %d bytes", len(plain), len(bytes.Join(plain, nil)))
		}
		frames := body[len(appendHeader(nil, &h, len(recs))) : len(body)-4]
		if n, ok := zstdSize(frames); !ok || n < len(joined) || n > len(joined)+256 {
			t.Fatalf("zstdSize %d, %v; want %d", n, ok, len(joined))
		}
		// As a relay of before reads version 3: one call, no size.
		if d, err := zstdDecoder().DecodeAll(frames, nil); err != nil || !bytes.Equal(d, joined) {
			t.Fatalf("frames decoded to %d bytes of %d: %v", len(d), len(joined), err)
		}
		for _, pl := range [][][]byte{nil, plain} {
			_, got, err := decodeWith(body, pl)
			if err != nil || len(got) != len(recs) {
				t.Fatalf("decoded %d records: %v", len(got), err)
			}
			for i := range got {
				if !bytes.Equal(got[i].Data, recs[i].Data) {
					t.Fatalf("record %d: %s, want %s", i, got[i].Data, recs[i].Data)
				}
			}
		}
	}
	// Parts that do not shrink are stored as they are.
	noise := make([]byte, 8<<10)
	var seed uint32 = 7
	for i := range noise {
		seed = seed*1664525 + 1013904223
		noise[i] = byte(seed >> 24)
	}
	rec := []storage.Record{{OrderKey: []byte("d:1"), Data: noise}}
	b := encodeRecords(nil, rec)
	body, plain := encodeBody(nil, &h, 1, [][]byte{b}, codecZstd)
	if body[0] != codecPlain || plain != nil {
		t.Fatalf("version %d for records that do not compress", body[0])
	}
	if _, got, err := decode(body); err != nil || len(got) != 1 || !bytes.Equal(got[0].Data, noise) {
		t.Fatalf("decoded %d records: %v", len(got), err)
	}
}
