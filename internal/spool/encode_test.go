package spool

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
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
		putChunkHeader(b.Encoded(), 42, b.Len())
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
	})
}

func sameRecord(a, b storage.Record) bool {
	return bytes.Equal(a.OrderKey, b.OrderKey) && bytes.Equal(a.UserID, b.UserID) && bytes.Equal(a.Data, b.Data)
}

// FuzzPatchedChunk fuzzes the reader of the chunkPatched layout: arbitrary
// patch bytes never panic and, when they decode, give what a plain
// reference application of the same patches gives; patches made from the
// input and written by appendPatched read back as the reference says; and
// any one byte of such a chunk changed is damage (the checksum), never a
// record rebuilt wrong.
func FuzzPatchedChunk(f *testing.F) {
	f.Add([]byte(`{"event_type":"x","ip":"$remote"}`), []byte{2, 1, 0, 3, 'a', 'b', 'c', 23, 9, 4, '"', 'i', 'p', '"'}, uint8(7))
	f.Add([]byte(`{}`), []byte{0}, uint8(0))
	f.Add([]byte(``), []byte{1, 0, 0, 0}, uint8(1))
	f.Fuzz(func(t *testing.T, base, enc []byte, flip uint8) {
		// Arbitrary patch bytes.
		got, _, err := applyPatches(base, enc)
		want, ok := referencePatches(base, enc)
		if (err == nil) != ok || (ok && !bytes.Equal(got, want)) {
			t.Fatalf("applyPatches(%q, %x) = %q, %v; reference %q, %v", base, enc, got, err, want, ok)
		}
		// Patches made valid from the input, written by the writer.
		var ps []patch
		at := 0
		for i := 0; i+1 < len(enc) && len(ps) < 8; i += 2 {
			off := at + int(enc[i])%(len(base)-at+1)
			del := int(enc[i+1]) % (len(base) - off + 1)
			ps = append(ps, patch{off: off, del: del, ins: enc[i:min(len(enc), i+int(enc[i+1]%5))]})
			at = off + del
		}
		v := make([]byte, chunkHeaderLen)
		v = appendPatched(v, storage.Record{OrderKey: []byte("d:1"), Data: base}, ps)
		v = appendPatched(v, storage.Record{UserID: []byte("u")}, nil)
		putChunkHeader(v, 5, 2)
		v[17] = chunkPatched
		binary.BigEndian.PutUint32(v[1:5], crc32.Checksum(v[5:], crcTable))
		var c storage.Chunk
		if err := decodeChunk(1, v, &c, nil); err != nil {
			t.Fatalf("written patched chunk: %v", err)
		}
		want = base[:0:0]
		at = 0
		for _, p := range ps {
			want = append(append(want, base[at:p.off]...), p.ins...)
			at = p.off + p.del
		}
		want = append(want, base[at:]...)
		if len(c.Records) != 2 || !bytes.Equal(c.Records[0].Data, want) || len(c.Records[1].Data) != 0 ||
			string(c.Records[0].OrderKey) != "d:1" || string(c.Records[1].UserID) != "u" {
			t.Fatalf("round trip: %q, want %q", c.Records, want)
		}
		// One byte changed: damage.
		i := int(flip) % len(v)
		v[i] ^= 1 + flip%255
		if err := decodeChunk(1, v, &c, nil); err == nil {
			t.Fatalf("byte %d of %d changed: decoded %q", i, len(v), c.Records)
		}
	})
}

// referencePatches applies the encoded patches of enc to base the plain
// way, and reports false where applyPatches must refuse them.
func referencePatches(base, enc []byte) ([]byte, bool) {
	np, w := binary.Uvarint(enc)
	if w <= 0 || np > uint64(len(enc)) {
		return nil, false
	}
	enc = enc[w:]
	if np == 0 {
		return base, true
	}
	var out []byte
	at := uint64(0)
	for range np {
		off, w1 := binary.Uvarint(enc)
		if w1 <= 0 {
			return nil, false
		}
		enc = enc[w1:]
		del, w2 := binary.Uvarint(enc)
		if w2 <= 0 {
			return nil, false
		}
		enc = enc[w2:]
		l, w3 := binary.Uvarint(enc)
		if w3 <= 0 || l > uint64(len(enc)-w3) {
			return nil, false
		}
		ins := enc[w3 : w3+int(l)]
		enc = enc[w3+int(l):]
		if off < at || off > uint64(len(base)) || del > uint64(len(base))-off {
			return nil, false
		}
		out = append(append(out, base[at:off]...), ins...)
		at = off + del
	}
	return append(out, base[at:]...), true
}

// appendPatched appends a patched record's encoding (the layout in encode.go) to
// dst: the writer's side of applyPatches (the tests write patched records
// with it; the product does not write them yet).
func appendPatched(dst []byte, r storage.Record, patches []patch) []byte {
	dst = appendBytes(dst, r.OrderKey)
	dst = appendBytes(dst, r.UserID)
	dst = appendBytes(dst, r.Data)
	dst = binary.AppendUvarint(dst, uint64(len(patches)))
	for _, pt := range patches {
		dst = binary.AppendUvarint(dst, uint64(pt.off))
		dst = binary.AppendUvarint(dst, uint64(pt.del))
		dst = appendBytes(dst, pt.ins)
	}
	return dst
}
