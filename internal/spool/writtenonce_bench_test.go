package spool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/svcrelay/relay/internal/storage"
)

// sdkRaw is an event as the official SDKs send it (no insert_id, no time,
// ip "$remote"), ~450-650 bytes varying with n.
func sdkRaw(n int) []byte {
	d := fmt.Appendf(nil, `{"user_id":"user-%08d@example.com","device_id":"%08x-f612-4926-836d-1850ef4cd2b3","event_type":"Add To Cart","session_id":1763703625000,"platform":"iOS","os_name":"ios","os_version":"17.5.1","device_model":"iPhone15,2","language":"en-IN","ip":"$remote","app_version":"3.11.0","event_properties":{"product_id":"SKU-%06d","category":"garden","price":245.37,"quantity":3,"tags":["ad","dolore"],"note":"%s","sent_us":1795682223335742},"user_properties":{"plan":"enterprise","signup_cohort":"2026-W36","beta":true}}`,
		n, n*2654435761, n%1000000, bytes.Repeat([]byte("et "), n*37%70))
	return d
}

// BenchmarkWrittenOnce measures, alone, the ingest side of the
// "event bytes written once" lever, on 100 SDK-shaped events (no insert_id
// or time: both filled in, "$remote" replaced) per chunk, with the chunk's
// checksum (format 4) in every variant:
//
//   - layout=rewritten: today's writer, each event rewritten straight into
//     the chunk buffer (Batch.AddFunc, as ingest's AppendRewritten does);
//   - layout=patched-copy: the chunkPatched layout with the bytes as
//     received copied into the chunk buffer and the rewrites as patches;
//   - layout=patched-owned: the chunkPatched layout's framing and patches
//     only, the events' bytes left where they are (the request body, which
//     the chunk would then own) but read by the checksum: the most the
//     lever can save at ingest.
//
// The chunk buffers rotate through a ring of 64 held chunks (the spool
// holds a chunk's buffer until it is delivered), so that each op writes
// memory that is not in the cache, as in the relay. The reader's side is
// BenchmarkPatchedRead.
func BenchmarkWrittenOnce(b *testing.B) {
	const per = 100
	raws := make([][]byte, per)
	okeys := make([][]byte, per)
	uids := make([][]byte, per)
	size := 0
	for i := range raws {
		raws[i] = sdkRaw(i)
		okeys[i] = fmt.Appendf(nil, "d:%08x-f612-4926-836d-1850ef4cd2b3", i*2654435761)
		uids[i] = fmt.Appendf(nil, "user-%08d@example.com", i)
		size += len(raws[i])
	}
	body := bytes.Join(raws, []byte(",")) // the request body the events alias
	ipAts := make([]int, per)             // the parser gives these offsets
	for i, raw := range raws {
		ipAts[i] = bytes.Index(raw, []byte(`"$remote"`))
	}
	at := 0
	for i := range raws {
		raws[i] = body[at : at+len(raws[i]) : at+len(raws[i])]
		at += len(raws[i]) + 1
	}
	const id = `"insert_id":"0f8fad5b-d9cb-469f-a165-70867728950e","time":1763700000000,`
	idb := []byte(id)
	ip := []byte(`"192.0.2.1"`)
	remote := []byte(`"$remote"`)
	for _, layout := range []string{"rewritten", "patched-copy", "patched-owned"} {
		b.Run(fmt.Sprintf("layout=%s/records=%d", layout, per), func(b *testing.B) {
			var ring [64]*storage.Buf
			var batch storage.Batch
			var patches []patch
			b.SetBytes(int64(size))
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU()
			b.ResetTimer()
			for op := range b.N {
				var cb *storage.Buf
				if layout != "rewritten" {
					cb = storage.GetBuf(size + 128*per)
					cb.B = cb.B[:chunkHeaderLen]
				}
				var crc uint32
				switch layout {
				case "rewritten":
					batch.Reset()
					batch.Reserve(size + 128*per)
					for i, raw := range raws {
						ipAt := ipAts[i]
						batch.AddFunc(okeys[i], uids[i], len(raw)+len(ip)+96, func(dst []byte) []byte {
							dst = append(dst, '{')
							dst = append(dst, id...)
							dst = append(dst, raw[1:ipAt]...)
							dst = append(dst, ip...)
							return append(dst, raw[ipAt+len(remote):]...)
						})
					}
					crc = putChunkHeader(batch.Encoded(), 1763700000000, per)
					cb = batch.Take()
				case "patched-copy":
					for i, raw := range raws {
						ipAt := ipAts[i]
						patches = append(patches[:0], patch{off: 1, ins: idb}, patch{off: ipAt, del: len(remote), ins: ip})
						cb.B = appendPatched(cb.B, storage.Record{OrderKey: okeys[i], UserID: uids[i], Data: raw}, patches)
					}
					cb.B[17] = chunkPatched
					crc = crc32.Checksum(cb.B[5:], crcTable)
				case "patched-owned":
					// The framing and patches in the chunk buffer; the
					// checksum runs over the framing and the events' bytes
					// in file order (what a vectored WAL write would write).
					crc = crc32.Update(0, crcTable, cb.B[5:chunkHeaderLen])
					for i, raw := range raws {
						ipAt := ipAts[i]
						start := len(cb.B)
						cb.B = appendBytes(cb.B, okeys[i])
						cb.B = appendBytes(cb.B, uids[i])
						cb.B = binary.AppendUvarint(cb.B, uint64(len(raw)))
						crc = crc32.Update(crc, crcTable, cb.B[start:])
						crc = crc32.Update(crc, crcTable, raw)
						start = len(cb.B)
						cb.B = binary.AppendUvarint(cb.B, 2)
						cb.B = binary.AppendUvarint(cb.B, 1)
						cb.B = binary.AppendUvarint(cb.B, 0)
						cb.B = appendBytes(cb.B, idb)
						cb.B = binary.AppendUvarint(cb.B, uint64(ipAt))
						cb.B = binary.AppendUvarint(cb.B, uint64(len(remote)))
						cb.B = appendBytes(cb.B, ip)
						crc = crc32.Update(crc, crcTable, cb.B[start:])
						cb.Idx = append(cb.Idx, uint32(start), uint32(len(cb.B)-start))
					}
				}
				_ = crc
				if old := ring[op%len(ring)]; old != nil {
					old.Release()
				}
				ring[op%len(ring)] = cb
			}
			b.StopTimer()
			b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			for _, cb := range ring {
				if cb != nil {
					cb.Release()
				}
			}
		})
	}
}

// BenchmarkPatchedRead measures the reader's side of the chunkPatched
// layout: the records of a 100-event chunk rebuilt by decodeChunk (a fresh
// buffer per patched record) against today's hot chunk, whose records are
// slices of the chunk buffer (storage.Buf.Records).
func BenchmarkPatchedRead(b *testing.B) {
	const per = 100
	remote := []byte(`"$remote"`)
	id := []byte(`"insert_id":"0f8fad5b-d9cb-469f-a165-70867728950e","time":1763700000000,`)
	ip := []byte(`"192.0.2.1"`)
	var plain storage.Batch
	pv := make([]byte, chunkHeaderLen)
	for i := range per {
		raw := sdkRaw(i)
		ipAt := bytes.Index(raw, remote)
		okey := []byte("d:" + strconv.Itoa(i))
		pv = appendPatched(pv, storage.Record{OrderKey: okey, Data: raw}, []patch{{off: 1, ins: id}, {off: ipAt, del: len(remote), ins: ip}})
		rw := append(append(append(append([]byte{'{'}, id...), raw[1:ipAt]...), ip...), raw[ipAt+len(remote):]...)
		plain.Add(storage.Record{OrderKey: okey, Data: rw})
	}
	putChunkHeader(plain.Encoded(), 1763700000000, per)
	pcb := plain.Take()
	putChunkHeader(pv, 1763700000000, per)
	pv[17] = chunkPatched
	binary.BigEndian.PutUint32(pv[1:5], crc32.Checksum(pv[5:], crcTable))
	b.Run(fmt.Sprintf("layout=rewritten/records=%d", per), func(b *testing.B) {
		var slab recSlab
		b.ReportAllocs()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0 := threadCPU()
		for range b.N {
			slab.buf = slab.buf[:0]
			rs := slab.take(per)
			if pcb.Records(rs); len(rs) != per {
				b.Fatal("records")
			}
		}
		b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	})
	b.Run(fmt.Sprintf("layout=patched/records=%d", per), func(b *testing.B) {
		var slab recSlab
		b.ReportAllocs()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0 := threadCPU()
		for range b.N {
			slab.buf = slab.buf[:0]
			var c storage.Chunk
			if err := decodeChunk(1, pv, &c, &slab); err != nil || len(c.Records) != per {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(threadCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	})
}

// threadCPU is the calling thread's CPU time in ns (user+system): a figure
// other processes on a loaded machine move much less than wall time. The
// caller locks its OS thread.
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
