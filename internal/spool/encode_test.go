package spool

import (
	"bytes"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// FuzzDecode feeds arbitrary bytes to the decoders of stored values (a
// damaged file must give an error, never a panic) and checks that encoded
// values round-trip.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("dev"), []byte("user"), []byte(`{"event_type":"x"}`), "key", `{"a":1}`, uint8(0))
	f.Add([]byte{}, []byte{}, []byte{}, "", "", uint8(2))
	f.Fuzz(func(t *testing.T, okey, uid, data []byte, apiKey, options string, kind uint8) {
		// Arbitrary bytes as every kind of value.
		for _, v := range [][]byte{okey, uid, data, []byte(apiKey)} {
			var c storage.Chunk
			_ = decodeChunk(1, v, &c, nil)
			_, _, _ = decodeLane(v)
			_, _ = decodeDead(1, v)
		}
		// Round trips.
		var b storage.Batch
		r := storage.Record{OrderKey: okey, UserID: uid, Data: data}
		b.Add(r)
		b.Add(storage.Record{})
		b.Add(r)
		putChunkHeader(b.Encoded(), 42, b.Len(), b.Verdict() != 0)
		var c storage.Chunk
		if err := decodeChunk(7, b.Encoded(), &c, nil); err != nil {
			t.Fatal(err)
		}
		if len(c.Records) != 3 || !sameRecord(c.Records[0], r) || !sameRecord(c.Records[1], storage.Record{}) || !sameRecord(c.Records[2], r) {
			t.Fatalf("chunk round trip: %+v", c.Records)
		}
		for cut := range b.Encoded() { // every truncation is an error
			if err := decodeChunk(7, b.Encoded()[:cut], &c, nil); err == nil {
				t.Fatalf("truncated chunk (%d of %d bytes) decoded", cut, len(b.Encoded()))
			}
		}
		key := storage.LaneKey{Kind: storage.Kind(kind), APIKey: apiKey, Options: options}
		st := laneState{nextSeq: 5, chunks: 4, records: 3, bytes: 2}
		k2, st2, err := decodeLane(encodeLane(nil, key, st))
		if err != nil || k2 != key || st2 != st {
			t.Fatalf("lane round trip: %+v %+v %v", k2, st2, err)
		}
		d := storage.DeadLetter{Lane: key, Reason: options, Answer: data, Accepted: time.UnixMilli(1), Died: time.UnixMilli(-5), Record: r}
		d2, err := decodeDead(9, encodeDead(nil, &d))
		if err != nil || d2.ID != 9 || d2.Lane != key || d2.Reason != d.Reason || !bytes.Equal(d2.Answer, d.Answer) ||
			!d2.Accepted.Equal(d.Accepted) || !d2.Died.Equal(d.Died) || !sameRecord(d2.Record, r) {
			t.Fatalf("dead letter round trip: %+v %v", d2, err)
		}
		// A bit flipped anywhere in a lane or dead letter value is refused.
		lv, dv := encodeLane(nil, key, st), encodeDead(nil, &d)
		for i := range len(lv) + len(dv) {
			v, at := lv, i
			if i >= len(lv) {
				v, at = dv, i-len(lv)
			}
			v[at] ^= 0x10
			if _, _, lerr := decodeLane(lv); lerr == nil && i < len(lv) {
				t.Fatalf("lane value with byte %d flipped decoded", at)
			}
			if _, derr := decodeDead(9, dv); derr == nil && i >= len(lv) {
				t.Fatalf("dead letter value with byte %d flipped decoded", at)
			}
			v[at] ^= 0x10
		}
	})
}

func sameRecord(a, b storage.Record) bool {
	return bytes.Equal(a.OrderKey, b.OrderKey) && bytes.Equal(a.UserID, b.UserID) && bytes.Equal(a.Data, b.Data)
}

// BenchmarkDecodeChunk decodes a chunk of 100 records as read from bbolt
// (checksum and framing).
func BenchmarkDecodeChunk(b *testing.B) {
	var bt storage.Batch
	for i := range 100 {
		bt.Add(storage.Record{OrderKey: []byte("device-000001"), UserID: []byte("user-1"), Data: make([]byte, 480+i%7)})
	}
	v := bt.Encoded()
	putChunkHeader(v, 1700000000000, bt.Len(), false)
	var c storage.Chunk
	slab := &recSlab{}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		slab.buf = slab.buf[:0]
		if err := decodeChunk(1, v, &c, slab); err != nil {
			b.Fatal(err)
		}
	}
}
